"""The embedded blob store: content-addressed blobs and append-only attempt logs in the data dir.

Blobs live at `DATA_DIR/blobs/sha256/ab/cdef…` (the first two hex digits fan the directory out).
An upload goes to a temp file under `DATA_DIR/blobs/tmp` while it is hashed; it is fsynced, checked
against the size and digest the uploader declared, and only then renamed into place, so a reader
never sees a partial blob and a failed or mismatched upload stores nothing. Two uploads of the same
content race harmlessly: both rename identical bytes onto one name.

Logs live at `DATA_DIR/logs/<attempt>.log`. Every append names the offset it starts at, so a chunk
resent after a reconnect is written once; a chunk past the end fails with OffsetMismatch carrying the
stored size. `<attempt>.eof` marks a finished log; followers wait for more bytes or for the mark. A log
that ended empty is its mark alone (no `.log`).

File I/O runs in worker threads, so the one event loop that serves gRPC and REST never waits on disk.
`list_blobs`, `delete` and `LogStore.delete` are the seam retention calls (checkpoints/retention.py).
The interface is base.py's; s3.py keeps the same on an S3-compatible store for several replicas.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import AsyncIterable, AsyncIterator

from ..errors import NodusError
from .base import (CHUNK, HEX, URI_PREFIX, BlobRef, Blobs, LogState, Logs, check_attempt_id, check_digest,
                   declared_problem, digest_of_uri, plan_append, too_long)

__all__ = ["CHUNK", "URI_PREFIX", "BlobRef", "BlobStore", "BlobUpload", "LogState", "LogStore", "check_digest",
           "digest_of_uri"]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobUpload:
    """One upload in progress: bytes go to a temp file while they are hashed (blocking calls)."""

    def __init__(self, store: "BlobStore", sha256: str = "", size: int = 0) -> None:
        self._store = store
        self.expected_sha256 = check_digest(sha256) if sha256 else ""
        self.expected_size = max(int(size), 0)
        self._hash = hashlib.sha256()
        self.size = 0
        fd, name = tempfile.mkstemp(dir=store.tmp_dir, prefix="put-")
        self._file = os.fdopen(fd, "wb")
        self._tmp = Path(name)
        self._done = False

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.expected_size and self.size > self.expected_size:
            self.abort()
            raise too_long(self.expected_size)
        self._hash.update(data)
        self._file.write(data)

    def commit(self) -> tuple[BlobRef, bool]:
        """Checks what was declared, makes the blob durable; returns it and whether it is new."""
        digest = self._hash.hexdigest()
        problem = declared_problem(self.size, digest, self.expected_size, self.expected_sha256)
        if problem:
            self.abort()
            raise NodusError("DigestMismatch", problem + "; nothing was stored")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._done = True
        ref = BlobRef(digest, self.size)
        final = self._store.path(digest)
        if final.exists():
            self._tmp.unlink(missing_ok=True)
            return ref, False
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._tmp, final)
        _fsync_dir(final.parent)
        return ref, True

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._file.close()
            self._tmp.unlink(missing_ok=True)


class BlobStore(Blobs):
    """Content-addressed blobs under `DATA_DIR/blobs`, and the attempt logs beside them."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "blobs"
        self.tmp_dir = self.root / "tmp"
        self.objects = self.root / "sha256"
        for d in (self.tmp_dir, self.objects):
            d.mkdir(parents=True, exist_ok=True)
        for stale in self.tmp_dir.iterdir():  # uploads a previous process never finished
            stale.unlink(missing_ok=True)
        self.logs = LogStore(Path(data_dir) / "logs")

    def path(self, sha256: str) -> Path:
        digest = check_digest(sha256)
        return self.objects / digest[:2] / digest[2:]

    # -- writes -----------------------------------------------------------------------------------
    def begin(self, sha256: str = "", size: int = 0) -> BlobUpload:
        return BlobUpload(self, sha256, size)

    async def put(self, chunks: AsyncIterable[bytes], sha256: str = "", size: int = 0) -> tuple[BlobRef, bool]:
        """Stores a stream; DigestMismatch (and nothing stored) when it differs from what was declared."""
        upload = await asyncio.to_thread(self.begin, sha256, size)
        try:
            async for data in chunks:
                if data:
                    await asyncio.to_thread(upload.write, data)
            return await asyncio.to_thread(upload.commit)
        except BaseException:
            await asyncio.to_thread(upload.abort)
            raise

    # -- reads ------------------------------------------------------------------------------------
    async def stat(self, sha256: str) -> BlobRef | None:
        path = self.path(sha256)
        try:
            st = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
        return BlobRef(check_digest(sha256), st.st_size)

    async def read(self, sha256: str, offset: int = 0, end: int | None = None,
                   chunk: int = CHUNK) -> AsyncIterator[bytes]:
        """The content from `offset` up to `end` (exclusive), in chunks; NotFound when absent."""
        path = self.path(sha256)
        try:
            f = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError:
            raise NodusError("NotFound", f"blob {sha256} not found") from None
        try:
            if offset:
                await asyncio.to_thread(f.seek, offset)
            left = None if end is None else max(end - offset, 0)
            while left is None or left > 0:
                data = await asyncio.to_thread(f.read, chunk if left is None else min(chunk, left))
                if not data:
                    return
                if left is not None:
                    left -= len(data)
                yield data
        finally:
            await asyncio.to_thread(f.close)

    async def head(self, sha256: str, n: int) -> bytes:
        """The first `n` bytes (fewer for a shorter blob)."""
        def first() -> bytes:
            with open(self.path(sha256), "rb") as f:
                return f.read(n)
        return await asyncio.to_thread(first)

    @contextlib.asynccontextmanager
    async def local_copy(self, sha256: str) -> AsyncIterator[Path]:
        """The blob's own file (NotFound when absent)."""
        path = self.path(sha256)
        if not await asyncio.to_thread(path.exists):
            raise NodusError("NotFound", f"blob {sha256} not found")
        yield path

    # -- retention seam ---------------------------------------------------------------------------
    async def list_blobs(self) -> list[BlobRef]:
        """Every stored blob (for garbage collection of unreferenced ones)."""
        def walk() -> list[BlobRef]:
            found = []
            for fan in sorted(self.objects.iterdir()):
                for f in sorted(fan.iterdir()):
                    digest = fan.name + f.name
                    if HEX.match(digest):
                        found.append(BlobRef(digest, f.stat().st_size))
            return found
        return await asyncio.to_thread(walk)

    async def delete(self, sha256: str) -> bool:
        """Removes a blob; True if it existed. Readers that already opened it finish reading."""
        path = self.path(sha256)

        def remove() -> bool:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            _fsync_dir(path.parent)
            return True
        return await asyncio.to_thread(remove)


class LogStore(Logs):
    """Append-only attempt logs under `DATA_DIR/logs`, with offset-idempotent appends and followers.

    This process is the only writer, so sizes are cached after the first look at the disk; the
    cache of a finished log is dropped (the eof mark on disk says the rest)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._states: dict[str, LogState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, asyncio.Event] = {}

    def _paths(self, attempt_id: str) -> tuple[Path, Path]:
        check_attempt_id(attempt_id)
        return self.root / f"{attempt_id}.log", self.root / f"{attempt_id}.eof"

    def _load(self, attempt_id: str) -> LogState:
        log, eof = self._paths(attempt_id)
        try:
            size = log.stat().st_size
        except FileNotFoundError:
            size = 0
        return LogState(size, eof.exists())

    async def state(self, attempt_id: str) -> LogState:
        cached = self._states.get(attempt_id)
        if cached is not None:
            return cached
        self._paths(attempt_id)
        return await asyncio.to_thread(self._load, attempt_id)

    async def append(self, attempt_id: str, offset: int, data: bytes, eof: bool = False) -> LogState:
        """Writes what of `data` is new. A chunk that starts past the stored end, or brings new bytes
        to a finished log, fails with OffsetMismatch and `extra["size"]` = the stored size."""
        log, mark = self._paths(attempt_id)
        lock = self._locks.setdefault(attempt_id, asyncio.Lock())
        async with lock:
            cached = self._states.get(attempt_id)

            def write() -> tuple[LogState, bytes, bool]:
                """The look at the disk (a log not cached) and the write in one thread hop: an attempt's
                whole log is often one chunk with eof (bench/startup.py's indexes/s, ADR 0094)."""
                st = cached if cached is not None else self._load(attempt_id)
                plan = plan_append(attempt_id, st, offset, data, eof)
                new, finish = plan.new, plan.finish
                if new or (finish and st.size):
                    with open(log, "ab") as f:
                        f.write(new)
                        if finish:
                            f.flush()
                            os.fsync(f.fileno())
                # An empty log that ends is its eof mark alone: no empty file made and fsynced beside it
                # (a trivial index's log; each file made is an inode allocated, ADR 0112).
                if finish:
                    mark.touch()
                    _fsync_dir(self.root)
                return LogState(st.size + len(new), st.eof or eof), new, finish
            state, new, finish = await asyncio.to_thread(write)
            if state.eof:
                self._states.pop(attempt_id, None)
                self._locks.pop(attempt_id, None)
            else:
                self._states[attempt_id] = state
        if new or finish:
            changed = self._changed.pop(attempt_id, None)
            if changed is not None:
                changed.set()
        return state

    async def sync(self, attempt_id: str) -> None:
        """Makes what was appended durable (called when an AppendLog stream ends; an ended log was made
        durable by the append that ended it)."""
        log, _ = self._paths(attempt_id)

        def flush() -> None:
            try:
                fd = os.open(log, os.O_RDONLY)
            except FileNotFoundError:
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        await asyncio.to_thread(flush)

    async def read(self, attempt_id: str, offset: int, limit: int = CHUNK) -> bytes:
        log, _ = self._paths(attempt_id)

        def chunk() -> bytes:
            try:
                with open(log, "rb") as f:
                    f.seek(offset)
                    return f.read(limit)
            except FileNotFoundError:
                return b""
        return await asyncio.to_thread(chunk)

    async def wait(self, attempt_id: str, offset: int, timeout: float) -> LogState:
        """Returns once the log is longer than `offset` or finished, or after `timeout` seconds."""
        changed = self._changed.setdefault(attempt_id, asyncio.Event())  # before looking: no lost wake-up
        st = await self.state(attempt_id)
        if st.size > offset or st.eof:
            return st
        try:
            async with asyncio.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            pass
        return await self.state(attempt_id)

    # -- retention seam ---------------------------------------------------------------------------
    async def list(self) -> list[str]:
        """The attempt ids that have a log."""
        def names() -> set[str]:  # an empty ended log is its eof mark alone
            return {p.name[:-4] for p in self.root.glob("*.log")} | {p.name[:-4] for p in self.root.glob("*.eof")}
        return sorted(await asyncio.to_thread(names))

    async def delete(self, attempt_id: str) -> bool:
        log, mark = self._paths(attempt_id)
        async with self._locks.setdefault(attempt_id, asyncio.Lock()):
            existed = log.exists() or mark.exists()
            await asyncio.to_thread(log.unlink, True)
            await asyncio.to_thread(mark.unlink, True)
            self._states.pop(attempt_id, None)
        self._locks.pop(attempt_id, None)
        return existed
