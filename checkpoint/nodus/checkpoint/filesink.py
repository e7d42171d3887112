"""Writing an archive to a local file, with its writeback started as it goes.

A checkpoint is fsynced before it is committed. Left alone, the kernel holds the archive's pages dirty
until that fsync and then writes them all while the save waits. Here each WRITEBACK bytes written are
handed to writeback at once (posix_fadvise DONTNEED on a dirty range starts its writeback without
waiting for it, as PostgreSQL's pg_flush_data does where sync_file_range is missing; the pages stay
cached), so the disk works while the next bytes are compressed and the final fsync finds little left.
"""
from __future__ import annotations

import os

WRITEBACK = 8 << 20
WRITE = 1 << 20
"""Bytes per write(2): measured here, writing 1 GiB into the page cache costs 0.3 CPU-s in 1 MiB or
256 KiB writes and 1.3–2.9 CPU-s (3–6× the wall time) in 4 MiB ones."""


class FileSink:
    """Writes whole buffers to `fd`, starting the writeback of every WRITEBACK bytes written."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0
        self._flushed = 0

    def write(self, data: bytes | memoryview, /) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view[:WRITE]):]
        self.written += len(data)
        if self.written - self._flushed >= WRITEBACK:
            _start_writeback(self.fd, self._flushed, self.written - self._flushed)
            self._flushed = self.written
        return len(data)


def _start_writeback(fd: int, offset: int, length: int) -> None:
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # not on this platform: the final fsync does all of it
        return
    try:
        advise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # a hint only: the fsync before the commit is what makes the archive durable
