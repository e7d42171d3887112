"""Snapshot and restore of paths as tar.zst with manifests; a library with no knowledge of jobs.

    store = open_store("/var/lib/nodus/ckpt/job-7")      # or "s3://bucket/prefix"
    m = store.save(["/nodus/state"], attempt="a-3", epoch=2, max_size=parse_size("1Ti"))
    store.restore("/", seq=None)                          # the latest committed, digest first
    save_file(["state"], "state.tar.zst"); restore_file("state.tar.zst", "DIR")

Layout of a store, the commit protocol and S3 part sizing: docs/adr/0007-checkpoint-format.md.
Depends on the standard library, zstandard and (for S3 only) boto3.
"""
from __future__ import annotations

from .archive import DEFAULT_LEVEL, ArchiveInfo, Plan, member_name, scan, write
from .errors import (AlreadyCommitted, ArchiveTooLarge, CheckpointError, CorruptArchive, DigestMismatch, NoSpace,
                     NotFound, SourceError, StoreError, UnsafeArchive)
from .integration import TrainerCheckpoint, find_trainer_checkpoint
from .manifest import Manifest
from .restore import Summary, inspect, restore, verify_digest
from .sizes import format_size, parse_size
from .standalone import read_sidecar, restore_file, save_file, verify_file
from .stores import LocalStore, Store, open_store

__all__ = [
    "DEFAULT_LEVEL", "AlreadyCommitted", "ArchiveInfo", "ArchiveTooLarge", "CheckpointError", "CorruptArchive",
    "DigestMismatch", "LocalStore", "Manifest", "NoSpace", "NotFound", "Plan", "SourceError", "Store",
    "StoreError", "Summary", "TrainerCheckpoint", "UnsafeArchive", "find_trainer_checkpoint", "format_size",
    "inspect", "member_name", "open_store", "parse_size", "read_sidecar", "restore", "restore_file",
    "save_file", "scan", "verify_digest", "verify_file", "write",
]
