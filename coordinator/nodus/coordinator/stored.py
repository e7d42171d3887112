"""How the resource service keeps objects in the store: their keys, their bytes, their resourceVersion.

The store holds an object without `metadata.resourceVersion`, which is the store revision of its last
write and is added on read (`decode`). Split from resources.py, which had reached 500 lines.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from .api.kinds import KindInfo
from .clock import whole_seconds
from .errors import NodusError
from .store.base import Record


def utc_now() -> str:
    """Now as RFC 3339 UTC to the second (each second's text formatted once: a create asks several times)."""
    return whole_seconds(int(time.time())) + "Z"


@dataclass(frozen=True, slots=True)
class ListPage:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str
    remaining: int | None


def key(info: KindInfo, project: str, name: str) -> str:
    return f"{info.plural}/{project}/{name}"


def prefix(info: KindInfo, project: str | None) -> str:
    return f"{info.plural}/{project}/" if project else f"{info.plural}/"


def decode(rec: Record | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    obj = orjson.loads(rec.value)
    obj["metadata"]["resourceVersion"] = str(rec.revision)
    return obj


def encode(obj: dict[str, Any]) -> bytes:
    meta = obj.get("metadata", {})
    meta.pop("resourceVersion", None)
    return orjson.dumps(obj)


def parse_rv(text: Any, field: str = "resourceVersion") -> int | None:
    if text is None or text == "":
        return None
    try:
        if not isinstance(text, str) or not text.isdigit():
            raise ValueError(text)  # a resourceVersion is an opaque string of digits, never a number
        value = int(text)
    except ValueError:
        raise NodusError("BadRequest", f"{field} {text!r} is not a valid resource version",
                         fix="pass a resourceVersion returned by the API") from None
    if value < 0:
        raise NodusError("BadRequest", f"{field} {text!r} is not a valid resource version")
    return value
