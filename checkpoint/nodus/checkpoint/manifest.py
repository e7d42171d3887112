"""The manifest: what a committed checkpoint is. Written last, atomically; its presence is the commit.

Readers never guess an archive's name: they follow `archive`. A manifest that does not parse or
lacks a field is not a checkpoint (a store lists it as nothing), never a half-read one.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable, Final

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


_FIELDS = ("seq", "time", "archive", "size", "sha256", "paths", "files", "unpacked_size", "level", "format", "attempt",
           "epoch", "labels")


class Manifest:
    """A committed checkpoint, immutable (`Final`, checked by mypy). A plain class, not a dataclass:
    reading a sidecar is on `nodus checkpoint restore`'s path, which does not import dataclasses (ADR 0081)."""

    __slots__ = _FIELDS

    def __init__(self, seq: int, time: datetime, archive: str, size: int, sha256: str, paths: tuple[str, ...],
                 files: int, unpacked_size: int, level: int, format: str = "Snapshot", attempt: str = "",
                 epoch: int = 0, labels: dict[str, str] | None = None) -> None:
        self.seq: Final = seq
        """Monotonic per store; the latest committed checkpoint is the highest seq."""
        self.time: Final = time
        """When the save finished (UTC)."""
        self.archive: Final = archive
        """The archive's key in its store, relative to the store's prefix."""
        self.size: Final = size
        """Compressed bytes of the archive."""
        self.sha256: Final = sha256
        """Of the archive's bytes as stored."""
        self.paths: Final = paths
        """The saved roots as member names (`nodus/state`); a restore recreates them under its target."""
        self.files: Final = files
        """Members that are not directories."""
        self.unpacked_size: Final = unpacked_size
        """Bytes of regular-file content, before compression."""
        self.level: Final = level
        """zstd compression level."""
        self.format: Final = format
        """Snapshot, or Dcp for a torch.distributed.checkpoint directory."""
        self.attempt: Final = attempt
        """The attempt that saved it (fencing: the coordinator refuses commits from superseded attempts)."""
        self.epoch: Final = epoch
        """The gang epoch it was saved in."""
        self.labels: Final[dict[str, str]] = {} if labels is None else labels
        """Free-form annotations from the caller (integration, step, …)."""

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Manifest)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "Manifest(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS) + ")"

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"version": VERSION, **{name: getattr(self, name) for name in _FIELDS}}
        doc["labels"] = dict(self.labels)
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
