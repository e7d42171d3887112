"""The Store: where checkpoints live, and the commit protocol every store follows.

A store offers a few blob primitives (stream an archive in under a key, commit a manifest atomically
and exclusively, list, read, delete); everything checkpoint-shaped (save, latest, restore, retention)
is written once, here, on top of them. The order of a save is the commit protocol:

1. the archive is streamed to a name nobody reads (a temp file, an open multipart upload);
2. it is made durable and visible under its final key (fsync + rename; CompleteMultipartUpload);
3. the manifest is written last, atomically and only if that seq has none (link(2); a conditional
   PUT), and that write *is* the commit.

A reader lists manifests only, so a crash anywhere before 3 leaves garbage (collected later), never
a checkpoint; and deletion removes the manifest first, for the same reason. A new store (the
coordinator's blob store) implements the primitives and inherits the rest.
"""
from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from datetime import datetime, timedelta, timezone
from typing import BinaryIO, Iterable

from .. import archive
from ..errors import AlreadyCommitted, ArchiveTooLarge, DigestMismatch, NotFound
from ..filesink import WRITE
from ..manifest import Clock as Clock  # re-exported: the stores import them from here
from ..manifest import Manifest, manifest_key
from ..manifest import utcnow as utcnow
from ..restore import Summary, inspect, restore

class Upload(ABC):
    """One archive on its way into a store. Nothing is visible to readers until `commit`."""

    @abstractmethod
    def write(self, data: bytes | memoryview, /) -> int:
        """Take the next bytes (raises StoreError or NoSpace; the caller then aborts)."""

    @abstractmethod
    def commit(self, sha256: str) -> str:
        """Make the archive durable under its final key and return that key."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written; idempotent, never raises for an upload already gone."""


class Store(ABC):
    """Checkpoints of one owner (an index of a Job) under one location."""

    url: str
    clock: Clock

    # -- primitives each store implements ---------------------------------------------------------

    @abstractmethod
    def begin_upload(self, seq: int, size_hint: int) -> Upload:
        """Start streaming the archive of `seq`; size_hint is an upper bound of its size in practice."""

    @abstractmethod
    def commit_manifest(self, seq: int, data: bytes) -> None:
        """Write the manifest atomically; AlreadyCommitted if `seq` has one."""

    @abstractmethod
    def manifest_seqs(self) -> list[int]:
        """Seqs with a committed manifest, ascending."""

    @abstractmethod
    def read_manifest(self, seq: int) -> bytes:
        """NotFound if `seq` has no committed manifest."""

    @abstractmethod
    def open_archive(self, key: str) -> BinaryIO:
        """A readable stream of the archive's bytes."""

    @abstractmethod
    def delete_key(self, key: str) -> None:
        """Remove a manifest or archive key; a missing key is not an error."""

    @abstractmethod
    def stale_keys(self, before: datetime) -> list[str]:
        """Uncommitted leftovers last written before `before`: temp files, archives no manifest names."""

    def referenced_archives(self) -> set[str]:
        """The archive keys that committed manifests name (everything else is a leftover)."""
        referenced = set()
        for seq in self.manifest_seqs():
            try:
                referenced.add(Manifest.from_json(self.read_manifest(seq)).archive)
            except NotFound:
                continue  # deleted meanwhile
        return referenced

    def abort_stale_uploads(self, before: datetime) -> int:
        """Cancel uploads begun before `before` and never finished (S3 multipart); returns how many."""
        return 0

    def local_path(self, key: str) -> str | None:
        """A local file holding the archive, when the store has one (no copy needed to restore)."""
        return None

    def fetch(self, key: str, dest: str) -> None:
        """Copy the archive to a local file (stores with a faster way override this)."""
        with contextlib.closing(self.open_archive(key)) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, WRITE)

    # -- checkpoints, the same for every store ----------------------------------------------------

    def save(self, paths: Iterable[str | os.PathLike[str]], *, seq: int | None = None,
             root: str | os.PathLike[str] | None = None, level: int = archive.DEFAULT_LEVEL,
             max_size: int | None = None, attempt: str = "", epoch: int = 0, format: str = "Snapshot",
             labels: dict[str, str] | None = None) -> Manifest:
        """Snapshot `paths` as checkpoint `seq` (default: one past the latest) and commit it."""
        plan = archive.scan(paths, root=root)
        if seq is None:
            seqs = self.manifest_seqs()
            seq = (seqs[-1] if seqs else 0) + 1
        elif seq < 1:
            raise ValueError("seq starts at 1")
        hint = plan.size_hint if max_size is None else min(plan.size_hint, max_size)
        upload = self.begin_upload(seq, hint)
        try:
            info = archive.write(plan, upload, level=level, max_size=max_size)
            key = upload.commit(info.sha256)
        except BaseException:
            upload.abort()
            raise
        manifest = Manifest(seq=seq, time=self.clock(), archive=key, size=info.size, sha256=info.sha256,
                            paths=info.paths, files=info.files, unpacked_size=info.unpacked_size, level=level,
                            format=format, attempt=attempt, epoch=epoch, labels=dict(labels or {}))
        try:
            self.commit_manifest(seq, manifest.to_json())
        except AlreadyCommitted:
            if self.get(seq).archive != key:
                self.delete_key(key)
            raise
        except BaseException:
            self.delete_key(key)
            raise
        return manifest

    def list(self) -> list[Manifest]:
        """Committed checkpoints, oldest first. A manifest deleted while listing is skipped."""
        out = []
        for seq in self.manifest_seqs():
            try:
                out.append(Manifest.from_json(self.read_manifest(seq)))
            except NotFound:
                continue
        return out

    def latest(self) -> Manifest | None:
        """The committed checkpoint with the highest seq, or None."""
        for seq in reversed(self.manifest_seqs()):
            try:
                return Manifest.from_json(self.read_manifest(seq))
            except NotFound:
                continue
        return None

    def get(self, seq: int | None = None) -> Manifest:
        """Checkpoint `seq`, or the latest when None; NotFound otherwise."""
        if seq is None:
            m = self.latest()
            if m is None:
                raise NotFound(f"{self.url} has no committed checkpoint")
            return m
        return Manifest.from_json(self.read_manifest(seq))

    def restore(self, into: str | os.PathLike[str], *, seq: int | None = None, max_size: int | None = None,
                max_unpacked: int | None = None) -> tuple[Manifest, Summary]:
        """Restore checkpoint `seq` (default: the latest committed) under `into`, digest first."""
        m = self.get(seq)
        if max_size is not None and m.size > max_size:
            raise ArchiveTooLarge(f"checkpoint {m.seq} is {m.size} bytes, larger than maxSize ({max_size} bytes); "
                                  "nothing was fetched or extracted")
        path = self.local_path(m.archive)
        if path is not None:
            return m, restore(path, into, sha256=m.sha256, size=m.size, max_size=max_size,
                              max_unpacked=max_unpacked)
        created = not os.path.lexists(into)
        os.makedirs(into, exist_ok=True)
        spool = tempfile.mkdtemp(prefix=".nodus-fetch-", dir=into)  # same filesystem as the target
        done = False
        try:
            local = os.path.join(spool, "archive.tar.zst")
            self.fetch(m.archive, local)
            summary = restore(local, into, sha256=m.sha256, size=m.size, max_size=max_size,
                              max_unpacked=max_unpacked)
            done = True
            return m, summary
        finally:
            shutil.rmtree(spool, ignore_errors=True)
            if created and not done:
                with contextlib.suppress(OSError):
                    os.rmdir(into)

    def verify(self, seq: int | None = None) -> tuple[Manifest, Summary]:
        """Read checkpoint `seq` (default: the latest) through: digest, size, every member's safety."""
        m = self.get(seq)
        with contextlib.closing(self.open_archive(m.archive)) as f:
            summary = inspect(f, sha256=m.sha256)
        if summary.size != m.size:
            raise DigestMismatch(f"checkpoint {m.seq} is {summary.size} bytes but its manifest committed {m.size}")
        return m, summary

    def delete(self, seq: int) -> None:
        """Uncommit (manifest first), then remove the archive."""
        m = self.get(seq)
        self.delete_key(manifest_key(seq))
        self.delete_key(m.archive)

    def purge(self) -> builtins.list[int]:
        """Delete everything in the store: its owner is gone, so nothing is in flight. Every manifest
        goes first (a reader never finds a committed checkpoint without its archive), then the
        archives they named and what torn saves left, then open uploads. Idempotent: run again, it
        finishes what an interrupted purge left. Returns the seqs that were committed."""
        seqs = self.manifest_seqs()
        for seq in seqs:
            self.delete_key(manifest_key(seq))
        everything = datetime.max.replace(tzinfo=timezone.utc)
        for key in self.stale_keys(everything):
            self.delete_key(key)
        self.abort_stale_uploads(everything)
        return seqs

    def prune(self, *, older_than: timedelta, keep_latest: bool = True) -> builtins.list[int]:
        """Delete checkpoints saved more than `older_than` ago; the latest survives unless told."""
        cutoff = self.clock() - older_than
        manifests = self.list()
        keep = manifests[-1].seq if keep_latest and manifests else None
        gone = [m.seq for m in manifests if m.time < cutoff and m.seq != keep]
        for seq in gone:
            self.delete(seq)
        return gone

    def expire(self, *, finished_at: datetime, retain_after_finish: timedelta) -> builtins.list[int]:
        """retainAfterFinish: once it has passed since the owner finished, delete every checkpoint."""
        if self.clock() < finished_at + retain_after_finish:
            return []
        gone = [m.seq for m in self.list()]
        for seq in gone:
            self.delete(seq)
        return gone

    def collect_garbage(self, *, grace: timedelta = timedelta(hours=1)) -> builtins.list[str]:
        """Remove what torn saves left behind, if older than `grace` (a save in flight is younger)."""
        before = self.clock() - grace
        stale = self.stale_keys(before)
        for key in stale:
            self.delete_key(key)
        self.abort_stale_uploads(before)
        return stale
