"""A restore's files written on a pool of threads, while the main thread reads the next headers.

Creating a file is the dear part of a restore with many small files: measured here, an
open(O_CREAT) on ext4 costs 0.06–1 ms of kernel time, more than writing the 20 KB it then holds,
and `tar -x` creates one file after the other. Syscalls release the GIL, so a few threads create and
write files side by side while the main thread parses the stream and hands out the work.

Small files go in batches of up to 32 (or 4 MiB), one task each: per file open, pwritev of the
member's bytes (views into the decoded chunks, not copies), mode, mtime, close. A large file is a run of tasks on one lane: open, one task per
piece the caller hands on (written at its offset), then mode, mtime and close. Memory is bounded:
the caller waits when the bytes handed out and not yet written pass `max_pending`.

Order between members is the caller's: it drains the pool before anything that needs an earlier
file to be complete (a hardlink to it, a later member of the same name replacing it).
"""
from __future__ import annotations

import os
from collections import deque

from .filesink import WRITE
from .threads import Pool, Task

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_IOV = 512
"""Buffers per pwritev, below every platform's IOV_MAX (1024 on Linux)."""
BATCH_FILES = 32
BATCH_BYTES = 4 << 20
"""Small files handed to a lane at once: each hand-off between threads costs wake-ups and GIL
transfers, which a loaded machine makes dear."""


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


def process_umask() -> int | None:
    """The process's umask, read from /proc/self/status (Linux 4.7+) without setting it (os.umask sets
    it, a race with any other thread creating files); None where it cannot be read."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _small(batch: list[tuple[str, list[memoryview], int, int, bool]]) -> None:
    for dest, pieces, mode, mtime, chmod in batch:
        # created with its mode where the umask leaves it whole (0644 under 022): one fchmod fewer per file
        fd = os.open(dest, FLAGS, 0o600 if chmod else mode)
        try:
            write_all(fd, pieces, 0)
            if chmod:
                os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


class _Large:
    """A file written by a run of tasks on one lane: open, pieces at their offsets, finish."""

    __slots__ = ("dest", "fd", "mode", "mtime", "finished")

    def __init__(self, dest: str, mode: int, mtime: int) -> None:
        self.dest, self.mode, self.mtime = dest, mode, mtime
        self.fd = -1
        self.finished = False

    def open(self) -> None:
        self.fd = os.open(self.dest, FLAGS, 0o600)

    def write(self, pieces: list[memoryview], offset: int) -> None:
        if self.fd >= 0:  # else its open failed, and that task's error is the one raised
            write_all(self.fd, pieces, offset)

    def finish(self) -> None:
        self.finished = True
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        try:
            os.fchmod(fd, self.mode)
            os.utime(fd, (self.mtime, self.mtime))
        finally:
            os.close(fd)


class Writers:
    """The lanes, and what they still have to write. Each lane is one thread taking its tasks in order;
    a small file goes to the lane of its directory, so two threads never create a directory's many
    small files at once (the kernel serializes that on the directory's lock, and a waiting thread spins
    on it); a large file goes to the next lane in turn, so that the large files of one directory (a
    model's shards) are written side by side, not one after the other on one thread. A file's tasks
    are all on one lane: no two threads write one file. Errors of a task are raised in the caller's
    thread at its next call; `close` (always, after success or failure) waits for every thread to stop."""

    def __init__(self, threads: int, max_pending: int = 64 << 20) -> None:
        self._lanes = [Pool(1, "checkpoint-write") for _ in range(max(1, threads))]
        self._pending: deque[tuple[Task[None], int]] = deque()
        self._bytes = 0
        self._max = max_pending
        self._large: list[_Large] = []
        self._current: tuple[_Large, Pool] | None = None
        self._batches: list[list[tuple[str, list[memoryview], int, int, bool]]] = [[] for _ in self._lanes]
        umask = process_umask()
        self._umask = 0o777 if umask is None else umask  # unknown: every small file gets its fchmod
        self._batch_bytes = [0] * len(self._lanes)
        self._dirs: dict[str, int] = {}
        self._turn = -1

    def _next_lane(self) -> int:
        self._turn = (self._turn + 1) % len(self._lanes)
        return self._turn

    def _dir_lane(self, dest: str) -> int:
        """The lane of dest's directory: each new directory takes the next lane in turn, so the
        directories spread evenly (a hash of the name piled several onto one lane in some runs)."""
        parent = os.path.dirname(dest)
        i = self._dirs.get(parent)
        if i is None:
            i = self._dirs[parent] = self._next_lane()
        return i

    def small(self, dest: str, pieces: list[memoryview], size: int, mode: int, mtime: int) -> None:
        """Create `dest` holding `pieces` (`size` bytes in all) with its mode and mtime. Small files go
        to their lane in batches (BATCH_FILES, BATCH_BYTES): one hand-off between threads per batch,
        not per file."""
        i = self._dir_lane(dest)
        self._batches[i].append((dest, pieces, mode, mtime, bool(mode & self._umask)))
        self._batch_bytes[i] += size
        if len(self._batches[i]) >= BATCH_FILES or self._batch_bytes[i] >= BATCH_BYTES:
            self._flush(i)

    def _flush(self, i: int) -> None:
        if self._batches[i]:
            batch, size = self._batches[i], self._batch_bytes[i]
            self._batches[i], self._batch_bytes[i] = [], 0
            self._track(self._lanes[i].submit(_small, batch), size)

    def open_large(self, dest: str, mode: int, mtime: int) -> None:
        """Start `dest`; `piece` then writes it, `end_large` says it is complete."""
        f = _Large(dest, mode, mtime)
        lane = self._lanes[self._next_lane()]  # not its directory's: two large files of one directory are written side by side
        self._large = [g for g in self._large if not g.finished] + [f]  # the finished ones need nothing more
        self._current = (f, lane)
        self._track(lane.submit(f.open), 0)

    def piece(self, pieces: list[memoryview], offset: int, size: int) -> None:
        assert self._current is not None
        f, lane = self._current
        self._track(lane.submit(f.write, pieces, offset), size)

    def end_large(self) -> None:
        assert self._current is not None
        f, lane = self._current
        self._current = None
        self._track(lane.submit(f.finish), 0)

    def drain(self) -> None:
        """Hand out what is batched, wait for everything; raise the first error."""
        for i in range(len(self._lanes)):
            self._flush(i)
        while self._pending:
            task, size = self._pending.popleft()
            self._bytes -= size
            task.result()

    def close(self) -> None:
        """Stop: cancel what has not started, wait for what has, close what a cancelled task left open."""
        for lane in self._lanes:
            lane.cancel()
        for lane in self._lanes:
            lane.close()
        for f in self._large:
            if f.fd >= 0:
                os.close(f.fd)
                f.fd = -1
        self._large.clear()
        self._pending.clear()
        self._batches = [[] for _ in self._lanes]
        self._current = None

    def _track(self, task: Task[None], size: int) -> None:
        self._pending.append((task, size))
        self._bytes += size
        while self._pending and (self._bytes > self._max or self._pending[0][0].done()):
            done, n = self._pending.popleft()
            self._bytes -= n
            done.result()
