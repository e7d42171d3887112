"""The manifest: what a committed checkpoint is. Written last, atomically; its presence is the commit.

Readers never guess an archive's name: they follow `archive`. A manifest that does not parse or
lacks a field is not a checkpoint (a store lists it as nothing), never a half-read one.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from .errors import CheckpointError

VERSION = 1
"""Bumped when a reader of the previous version would misread a manifest of this one."""

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _parse_time(text: str) -> datetime:
    """`2026-12-07T08:59:00.123456Z` as written by to_json. fromisoformat, not strptime: strptime's
    first call imports _strptime (re, locale, calendar), ~5 ms of every restore's start (ADR 0081)."""
    if not isinstance(text, str) or not text.endswith("Z") or "T" not in text:
        raise ValueError(f"time {text!r} is not an ISO 8601 UTC time ending in Z")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class Manifest:
    seq: int
    """Monotonic per store; the latest committed checkpoint is the highest seq."""
    time: datetime
    """When the save finished (UTC)."""
    archive: str
    """The archive's key in its store, relative to the store's prefix."""
    size: int
    """Compressed bytes of the archive."""
    sha256: str
    """Of the archive's bytes as stored."""
    paths: tuple[str, ...]
    """The saved roots as member names (`nodus/state`); a restore recreates them under its target."""
    files: int
    """Members that are not directories."""
    unpacked_size: int
    """Bytes of regular-file content, before compression."""
    level: int
    """zstd compression level."""
    format: str = "Snapshot"
    """Snapshot, or Dcp for a torch.distributed.checkpoint directory."""
    attempt: str = ""
    """The attempt that saved it (fencing: the coordinator refuses commits from superseded attempts)."""
    epoch: int = 0
    """The gang epoch it was saved in."""
    labels: dict[str, str] = field(default_factory=dict)
    """Free-form annotations from the caller (integration, step, …)."""

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"version": VERSION, **asdict(self)}
        doc["time"] = self.time.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        doc["paths"] = list(self.paths)
        doc["unpackedSize"] = doc.pop("unpacked_size")
        doc["compression"] = {"codec": "zstd", "level": doc.pop("level")}
        return json.dumps(doc, indent=2, sort_keys=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> "Manifest":
        try:
            doc = json.loads(data)
            if doc.get("version") != VERSION:
                raise CheckpointError(f"manifest version {doc.get('version')!r} is not {VERSION}")
            return cls(
                seq=int(doc["seq"]),
                time=_parse_time(doc["time"]),
                archive=str(doc["archive"]),
                size=int(doc["size"]),
                sha256=str(doc["sha256"]),
                paths=tuple(str(p) for p in doc["paths"]),
                files=int(doc["files"]),
                unpacked_size=int(doc["unpackedSize"]),
                level=int(doc["compression"]["level"]),
                format=str(doc.get("format", "Snapshot")),
                attempt=str(doc.get("attempt", "")),
                epoch=int(doc.get("epoch", 0)),
                labels={str(k): str(v) for k, v in (doc.get("labels") or {}).items()},
            )
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"not a checkpoint manifest: {e!r}") from None


def manifest_key(seq: int) -> str:
    return f"{seq:010d}.manifest.json"


def archive_key(seq: int, tag: str) -> str:
    """`<seq:010d>-<tag>.tar.zst`; the tag is the sha256's first 12 hex digits where the store can
    name the archive after writing it, a unique upload id where it cannot (S3)."""
    return f"{seq:010d}-{tag}.tar.zst"


def seq_of_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".manifest.json")] if name.endswith(".manifest.json") else ""
    return int(stem) if len(stem) == 10 and stem.isdigit() else None
