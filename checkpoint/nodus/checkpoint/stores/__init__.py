"""Stores: a local directory and S3. `open_store` picks one from a location string."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Clock, Store, Upload, utcnow
from .local import LocalStore

if TYPE_CHECKING:
    from .s3 import S3Store


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → (`bucket`, `some/prefix`)."""
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (use s3://BUCKET/PREFIX)")
    return bucket, prefix.strip("/")


def open_store(location: str, *, clock: Clock = utcnow, **s3_options: Any) -> Store:
    """`s3://bucket/prefix` → S3Store (boto3 imported only then); anything else is a directory."""
    if location.startswith("s3://"):
        from .s3 import S3Store

        bucket, prefix = parse_s3_url(location)
        return S3Store(bucket, prefix, clock=clock, **s3_options)
    if location.startswith("file://"):
        location = location[len("file://"):]
    return LocalStore(location, clock=clock)


def __getattr__(name: str) -> Any:
    if name == "S3Store":
        from .s3 import S3Store

        return S3Store
    raise AttributeError(name)


__all__ = ["Clock", "LocalStore", "S3Store", "Store", "Upload", "open_store", "parse_s3_url", "utcnow"]
