"""A restore's files written on a pool of threads, while the main thread reads the next headers.

Creating a file is the dear part of a restore with many small files: measured here, an
open(O_CREAT) on ext4 costs 0.06–1 ms of kernel time, more than writing the 20 KB it then holds,
and `tar -x` creates one file after the other. Syscalls release the GIL, so a few threads create and
write files side by side while the main thread parses the stream and hands out the work.

Each small file is one task: open, one pwritev of the member's bytes (views into the decoded
chunks, not copies), mode, mtime, close. A large file is opened by the caller and written by tasks of
up to WRITE bytes each at their offsets, then closed by the caller once they are done. Memory is
bounded: the caller waits when the bytes handed out and not yet written pass `max_pending`.

Order between members is the caller's: it drains the pool before anything that needs an earlier
file to be complete (a hardlink to it, a later member of the same name replacing it).
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from .filesink import WRITE

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_IOV = 512
"""Buffers per pwritev, below every platform's IOV_MAX (1024 on Linux)."""
MAX_OPEN = 16
"""Large files open at once (written, not yet closed)."""


def write_all(fd: int, pieces: list[memoryview], offset: int) -> None:
    """All of `pieces` at `offset`, in calls of at most WRITE bytes (or MAX_IOV buffers)."""
    group: list[memoryview] = []
    size = 0
    for piece in pieces:
        while piece:
            part = piece[:WRITE - size]
            group.append(part)
            size += len(part)
            piece = piece[len(part):]
            if size == WRITE or len(group) == MAX_IOV:
                _pwritev(fd, group, offset)
                offset += size
                group, size = [], 0
    if group:
        _pwritev(fd, group, offset)


def _pwritev(fd: int, group: list[memoryview], offset: int) -> None:
    while group:
        n = os.pwritev(fd, group, offset)
        offset += n
        while group and n >= len(group[0]):
            n -= len(group[0])
            group = group[1:]
        if n:
            group[0] = group[0][n:]


def _small(dest: str, pieces: list[memoryview], mode: int, mtime: int) -> None:
    fd = os.open(dest, FLAGS, 0o600)
    try:
        write_all(fd, pieces, 0)
        os.fchmod(fd, mode)
        os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


class _Large:
    """A file written by several tasks; closed by the caller when they are done."""

    __slots__ = ("fd", "mode", "mtime", "tasks")

    def __init__(self, fd: int, mode: int, mtime: int) -> None:
        self.fd, self.mode, self.mtime = fd, mode, mtime
        self.tasks: list[Future[None]] = []


class Writers:
    """The pool, and what it still has to write. Errors of a task are raised in the caller's thread at
    its next call; `close` (always, after success or failure) waits for every thread to stop."""

    def __init__(self, threads: int, max_pending: int = 64 << 20) -> None:
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="checkpoint-write")
        self._pending: deque[tuple[Future[None], int]] = deque()
        self._bytes = 0
        self._max = max_pending
        self._large: deque[_Large] = deque()
        self._current: _Large | None = None

    def small(self, dest: str, pieces: list[memoryview], size: int, mode: int, mtime: int) -> None:
        """Create `dest` holding `pieces` (`size` bytes in all) with its mode and mtime, on the pool."""
        self._track(self._pool.submit(_small, dest, pieces, mode, mtime), size)

    def open_large(self, dest: str, mode: int, mtime: int) -> None:
        """Create `dest` now; `piece` then writes it, `end_large` says it is complete."""
        self._current = _Large(os.open(dest, FLAGS, 0o600), mode, mtime)
        self._large.append(self._current)

    def piece(self, pieces: list[memoryview], offset: int, size: int) -> None:
        assert self._current is not None
        task = self._pool.submit(write_all, self._current.fd, pieces, offset)
        self._current.tasks.append(task)
        self._track(task, size)

    def end_large(self) -> None:
        self._current = None
        self._reap(keep=MAX_OPEN)

    def drain(self) -> None:
        """Wait for everything handed out; raise the first error."""
        while self._pending:
            task, size = self._pending.popleft()
            self._bytes -= size
            task.result()
        self._reap(keep=0)

    def close(self) -> None:
        """Stop: cancel what has not started, wait for what has, close the large files' descriptors."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for f in self._large:
            os.close(f.fd)
        self._large.clear()
        self._pending.clear()
        self._current = None

    def _track(self, task: Future[None], size: int) -> None:
        self._pending.append((task, size))
        self._bytes += size
        while self._pending and (self._bytes > self._max or self._pending[0][0].done()):
            done, n = self._pending.popleft()
            self._bytes -= n
            done.result()

    def _reap(self, keep: int) -> None:
        """Close the large files whose writes are done, the oldest first, waiting for them while more
        than `keep` are open."""
        while self._large and self._large[0] is not self._current:
            f = self._large[0]
            if len(self._large) <= keep and not all(t.done() for t in f.tasks):
                return
            for t in f.tasks:
                t.result()
            self._large.popleft()
            try:
                os.fchmod(f.fd, f.mode)
                os.utime(f.fd, (f.mtime, f.mtime))
            finally:
                os.close(f.fd)
