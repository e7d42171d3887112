"""One root error type for the checkpoint library; each subclass names one reason with a stable code.

Callers (the agent, the CLI) branch on the type or on `code`, and show `str(error)`, which always says
what was refused and why. `retryable` says whether the same call may succeed later unchanged.
"""
from __future__ import annotations


class CheckpointError(Exception):
    """Anything the checkpoint library refuses or fails to do."""

    code = "CheckpointError"
    retryable = False


class SourceError(CheckpointError):
    """A path to save is missing, unreadable, of a kind a restore would refuse, or changed while read."""

    code = "SourceError"


class ArchiveTooLarge(CheckpointError):
    """The archive passed maxSize (while saving, before the upload completed; or before a restore)."""

    code = "ArchiveTooLarge"


class DigestMismatch(CheckpointError):
    """The archive's sha256 or size is not the one its manifest committed."""

    code = "DigestMismatch"


class UnsafeArchive(CheckpointError):
    """A member would land outside the target or is of a refused kind; nothing was extracted."""

    code = "UnsafeArchive"

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"refused member {member!r}: {reason}")
        self.member = member
        self.reason = reason


class CorruptArchive(CheckpointError):
    """The bytes are not a well-formed tar.zst (truncated, bad frame checksum, bad header)."""

    code = "CorruptArchive"


class NoSpace(CheckpointError):
    """The store's disk filled up during a save (ENOSPC); nothing was committed."""

    code = "NoSpace"
    retryable = True


class StoreError(CheckpointError):
    """The store failed (I/O, network, permissions); the message carries the store's own words."""

    code = "StoreError"
    retryable = True


class NotFound(CheckpointError):
    """No such checkpoint (or no committed checkpoint at all) in the store."""

    code = "NotFound"


class AlreadyCommitted(CheckpointError):
    """A manifest for this seq is already committed; seqs are never overwritten."""

    code = "AlreadyCommitted"
