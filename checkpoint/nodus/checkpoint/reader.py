"""Reading a tar.zst stream forward only: decompression on threads of its own, members one by one.

tarheaders.py parses the headers (ustar, pax, GNU long names) from a stream that only moves forward;
member data is taken straight from the decompressed chunks, without copies, by whoever extracts.
Decompression runs on a thread (zstd releases the GIL), so it overlaps with the writes of the files;
an archive in memory (a mapped file) is decoded frame by frame on several (frames.contents).
"""
from __future__ import annotations

import hashlib
import os
from typing import IO, BinaryIO, Iterator, cast

import zstandard

from .errors import ArchiveTooLarge, CorruptArchive
from .frames import contents
from .pipeline import Prefetch
from .tarheaders import Member, members as tar_members

CHUNK = 4 << 20
"""As in archive.py: few, large hand-offs between the threads."""


class HashingReader:
    """The compressed bytes as read from the source: counted, hashed, and stopped past max_size."""

    def __init__(self, raw: BinaryIO, max_size: int | None = None) -> None:
        self.raw = raw
        self.max_size = max_size
        self.size = 0
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.size += len(data)
        if self.max_size is not None and self.size > self.max_size:
            raise ArchiveTooLarge(f"the archive is larger than maxSize ({self.max_size} bytes)")
        self.sha.update(data)
        return data


def _decompress(raw: BinaryIO | HashingReader) -> Iterator[bytes]:
    reader = zstandard.ZstdDecompressor().stream_reader(cast(IO[bytes], raw), read_size=CHUNK,
                                                        read_across_frames=True, closefd=False)
    try:
        while data := reader.read(CHUNK):
            yield data
    except zstandard.ZstdError as e:
        raise CorruptArchive(f"not a valid zstd stream: {e}") from None


class Decompressed:
    """A forward-only file object over the decompressed stream (read, tell, forward seek).

    `Decompressed(stream)` decodes a stream on one thread; `Decompressed.of_buffer(buf)` decodes an
    archive in memory (a mapped file) frame by frame on a thread per CPU (frames.contents)."""

    def __init__(self, raw: BinaryIO | HashingReader | None = None, *,
                 chunks: Iterator[bytes | memoryview] | None = None) -> None:
        self._chunks: Prefetch[bytes] | _Inline
        if chunks is not None:
            self._chunks = _Inline(chunks)  # decoded ahead by the pool already
        else:
            self._chunks = Prefetch(_decompress(cast(BinaryIO, raw)), depth=4, name="checkpoint-unzstd")
        self._chunk = memoryview(b"")
        self._pos = 0

    @classmethod
    def of_buffer(cls, buf: memoryview, threads: int | None = None) -> "Decompressed":
        return cls(chunks=contents(buf, threads or os.cpu_count() or 1))

    def _next_chunk(self) -> bool:
        data = self._chunks.next()
        if data is None:
            return False
        self._chunk = memoryview(data)
        return True

    def view(self, n: int) -> memoryview:
        """Up to n bytes (at least one unless at the end), without copying."""
        if not self._chunk and not self._next_chunk():
            return memoryview(b"")
        out = self._chunk[:n]
        self._chunk = self._chunk[len(out):]
        self._pos += len(out)
        return out

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while piece := self.view(CHUNK):
                parts.append(bytes(piece))
            return b"".join(parts)
        first = self.view(n)
        if len(first) == n or not first:
            return bytes(first)
        parts = [bytes(first)]
        got = len(first)
        while got < n and (piece := self.view(n - got)):
            parts.append(bytes(piece))
            got += len(piece)
        return b"".join(parts)

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self._pos + offset if whence == 1 else -1
        if target < self._pos:
            raise OSError("this stream only moves forward")
        while self._pos < target and self.view(target - self._pos):
            pass
        return self._pos

    def drain(self) -> int:
        """Read to the end (which checks zstd's frame checksum); returns the bytes skipped."""
        skipped = 0
        while piece := self.view(CHUNK):
            skipped += len(piece)
        return skipped

    def close(self) -> None:
        self._chunks.close()
        self._chunk = memoryview(b"")


class _Inline:
    """An iterator taken on the caller's thread, with Prefetch's next/close."""

    def __init__(self, source: Iterator[bytes | memoryview]) -> None:
        self._source = source

    def next(self) -> bytes | memoryview | None:
        return next(self._source, None)

    def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


def members(stream: Decompressed) -> Iterator[Member]:
    """The members in archive order; the caller consumes (or not) each one's data before the next."""
    return tar_members(stream)
