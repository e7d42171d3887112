"""An archive file mapped into memory, its sha256 computed on a thread of its own from the moment it is opened.

A restore reads the archive once: this thread hashes the mapped bytes while the extraction decodes the
same pages (ADR 0053), and nothing leaves the staging directory before `digest()` matches the committed
one. The mapping is the one both read, so the bytes hashed are the bytes extracted.

This module imports only the standard library's hashlib, mmap and threading, so that
`nodus checkpoint restore FILE` can open the archive and start hashing it before it imports zstd, the
tar reader and the argument parser: that start-up ran on one core while the other had nothing to do
(ADR 0104).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import threading

STEP = 64 << 20
"""Bytes per sha256 update: hashlib releases the GIL for the whole call; between calls the thread
checks whether it is asked to stop."""


class MappedArchive:
    """`path` opened read-only and mapped; its sha256 is being computed from construction on.

    `size` is the length of what is mapped (the bytes the digest covers and the extraction reads).
    `close()` (or leaving a `with` block) stops the hash if it is still running and unmaps the file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        finally:
            os.close(fd)  # the mapping holds the file
        self.view = memoryview(self._mm) if self._mm is not None else memoryview(b"")
        self.size = len(self.view)
        self.sha = hashlib.sha256()
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="checkpoint-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        view = self.view
        for start in range(0, len(view), STEP):
            if self._stop.is_set():
                return
            self.sha.update(view[start:start + STEP])
        self._done = True

    def digest(self) -> str:
        """The sha256 of every mapped byte (waits for the thread to finish)."""
        self._thread.join()
        if not self._done:
            raise RuntimeError("the digest was stopped before it covered the archive")
        return self.sha.hexdigest()

    def stop(self) -> None:
        """Stop hashing (a refused or failed restore needs no digest)."""
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        self.stop()
        try:
            self.view.release()
            if self._mm is not None:
                self._mm.close()
        except BufferError:
            pass  # a slice still held by a decoder thread being torn down: the mapping goes with the last one

    def __enter__(self) -> "MappedArchive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
