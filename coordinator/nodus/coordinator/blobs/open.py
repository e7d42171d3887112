"""Which blob store a coordinator keeps: `--blob-url` (ADR 0044).

- unset or `file://`: the data dir (DATA_DIR/blobs, DATA_DIR/logs), for one coordinator;
- `file:///PATH`: the same layout under PATH;
- `s3://BUCKET[/PREFIX]`: an S3-compatible store that every replica reaches. The endpoint is
  `--blob-endpoint` or AWS_ENDPOINT_URL (AWS itself when neither is set), the region `--blob-region`
  or AWS_REGION / AWS_DEFAULT_REGION, and the credentials come from boto3's usual chain
  (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials or
  AWS_SHARED_CREDENTIALS_FILE, an instance role).

A URL that is not one of these, or a bucket that is missing, unreachable or denied, stops the
coordinator at start with a message naming `--blob-url` and the fix.
"""
from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import NodusError
from .base import Blobs
from .files import BlobStore
from .s3 import S3BlobStore

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blob-url", help="where blobs, logs and checkpoints live: s3://BUCKET[/PREFIX] for an "
                   "S3-compatible store every replica reaches (required with more than one replica), or file:// "
                   "for the data dir (the default); docs/adr/0044-blobs-on-s3.md")
    p.add_argument("--blob-endpoint", help="endpoint URL of the S3-compatible store (default AWS_ENDPOINT_URL, "
                   "else AWS); credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
                   "the AWS credentials file")
    p.add_argument("--blob-region", help="region of the S3 bucket (default AWS_REGION / AWS_DEFAULT_REGION)")


def shared(url: str | None) -> bool:
    """Whether `--blob-url` names a store every replica reaches (what more than one replica requires)."""
    return (url or "").strip().startswith("s3://")


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET[/PREFIX]`, or BadRequest naming --blob-url."""
    parts = urlsplit(url)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if parts.scheme != "s3" or not _BUCKET.match(bucket) or ".." in bucket or parts.query or parts.fragment:
        raise NodusError("BadRequest", f"--blob-url {url!r} is not an s3://BUCKET[/PREFIX] URL",
                         fix="name a bucket as S3 spells it (3-63 lower-case letters, digits, '.' or '-'), "
                             "e.g. --blob-url s3://nodus-blobs/prod")
    if any(seg in ("", ".", "..") for seg in prefix.split("/")) and prefix:
        raise NodusError("BadRequest", f"--blob-url {url!r}: the prefix {prefix!r} has an empty, '.' or '..' part",
                         fix="use a prefix like team/nodus")
    return bucket, prefix


def s3_client(endpoint: str | None, region: str | None) -> Any:
    """A boto3 S3 client with short connect timeouts and bounded retries (a store that does not
    answer fails calls in seconds, not minutes)."""
    import boto3  # imported only for S3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"},
                    max_pool_connections=64)
    return boto3.session.Session().client("s3", endpoint_url=endpoint or None, region_name=region or None,
                                          config=config)


async def open_blobs(url: str | None, data_dir: Path, endpoint: str | None = None, region: str | None = None,
                     *, part_size: int | None = None, log_poll: float = 1.0) -> Blobs:
    """The store `url` names, checked: NodusError (BadRequest or ServiceUnavailable) naming --blob-url."""
    url = (url or "").strip()
    if not url or url == "file://":
        return BlobStore(data_dir)
    if url.startswith("file://"):
        path = Path(url[len("file://"):])
        if not path.is_absolute():
            raise NodusError("BadRequest", f"--blob-url {url!r}: a file:// URL names an absolute path",
                             fix="use file:///ABSOLUTE/PATH, or leave --blob-url unset for the data dir")
        return BlobStore(path)
    if not url.startswith("s3://"):
        raise NodusError("BadRequest", f"--blob-url {url!r}: only s3:// and file:// are supported",
                         fix="use s3://BUCKET[/PREFIX], or leave --blob-url unset for the data dir")
    bucket, prefix = parse_s3_url(url)
    try:
        client = s3_client(endpoint, region)
    except Exception as e:  # a malformed endpoint URL, an unknown profile
        raise NodusError("BadRequest", f"--blob-url {url}: {type(e).__name__}: {e}",
                         fix="check --blob-endpoint / AWS_ENDPOINT_URL and AWS_PROFILE") from e
    store = S3BlobStore(client, bucket, prefix, spool_dir=Path(data_dir) / "blobs-spool", log_poll=log_poll,
                        **({"part_size": part_size} if part_size else {}))
    await asyncio.to_thread(store.probe)
    return store


async def from_args(args: argparse.Namespace, data_dir: Path) -> Blobs:
    """main.py's call: the store the flags name, or SystemExit with the message and the fix."""
    try:
        return await open_blobs(getattr(args, "blob_url", None), data_dir, getattr(args, "blob_endpoint", None),
                                getattr(args, "blob_region", None))
    except NodusError as e:
        raise SystemExit(f"{e.message}; {e.effective_fix}") from e
