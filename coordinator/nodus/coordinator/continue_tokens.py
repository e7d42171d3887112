"""The `continue` token of a paged LIST: the store revision the first page was read at and the last key
sent, so every page reads the same snapshot (Kubernetes' continue semantics)."""
from __future__ import annotations

import base64

import orjson

from .errors import NodusError


def encode_continue(revision: int, last_key: str) -> str:
    raw = orjson.dumps({"rv": revision, "start": last_key})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"])
    except Exception:
        raise NodusError("BadRequest", "the continue token is not valid",
                         fix="pass the `continue` value of the previous page unchanged") from None
