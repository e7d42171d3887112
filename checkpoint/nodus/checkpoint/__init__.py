"""Snapshot and restore of paths as tar.zst with manifests; a library with no knowledge of jobs.

    store = open_store("/var/lib/nodus/ckpt/job-7")      # or "s3://bucket/prefix"
    m = store.save(["/nodus/state"], attempt="a-3", epoch=2, max_size=parse_size("1Ti"))
    store.restore("/", seq=None)                          # the latest committed, digest first
    save_file(["state"], "state.tar.zst"); restore_file("state.tar.zst", "DIR")

Layout of a store, the commit protocol and S3 part sizing: docs/adr/0007-checkpoint-format.md.
Depends on the standard library, zstandard and (for S3 only) boto3.

The names below are imported when first used (PEP 562): `nodus checkpoint restore` runs in a fresh
process, and importing the save path (tarfile, the stores, the thread pools) cost it ~25 ms before it
read a byte (ADR 0081).
"""
from __future__ import annotations

from importlib import import_module

from .errors import (AlreadyCommitted, ArchiveTooLarge, CheckpointError, CorruptArchive, DigestMismatch, NoSpace,
                     NotFound, SourceError, StoreError, UnsafeArchive)
# eager: the function `restore` must win over the submodule of that name, which importing it sets here
from .restore import Summary, inspect, restore, verify_digest

TYPE_CHECKING = False
"""typing.TYPE_CHECKING without importing typing (and re, collections, enum with it) before `nodus
checkpoint restore` has started hashing its archive (ADR 0104); mypy reads any TYPE_CHECKING as true."""

if TYPE_CHECKING:
    from typing import Any

    from .archive import DEFAULT_LEVEL, ArchiveInfo, Plan, member_name, scan, write
    from .integration import TrainerCheckpoint, find_trainer_checkpoint
    from .manifest import Manifest
    from .sizes import format_size, parse_size
    from .standalone import read_sidecar, restore_file, save_file, verify_file
    from .stores import LocalStore, Store, open_store

_WHERE = {
    "archive": ("DEFAULT_LEVEL", "ArchiveInfo", "Plan", "member_name", "scan", "write"),
    "integration": ("TrainerCheckpoint", "find_trainer_checkpoint"),
    "manifest": ("Manifest",),
    "sizes": ("format_size", "parse_size"),
    "standalone": ("read_sidecar", "restore_file", "save_file", "verify_file"),
    "stores": ("LocalStore", "Store", "open_store"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [
    "DEFAULT_LEVEL", "AlreadyCommitted", "ArchiveInfo", "ArchiveTooLarge", "CheckpointError", "CorruptArchive",
    "DigestMismatch", "LocalStore", "Manifest", "NoSpace", "NotFound", "Plan", "SourceError", "Store",
    "StoreError", "Summary", "TrainerCheckpoint", "UnsafeArchive", "find_trainer_checkpoint", "format_size",
    "inspect", "member_name", "open_store", "parse_size", "read_sidecar", "restore", "restore_file",
    "save_file", "scan", "verify_digest", "verify_file", "write",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
