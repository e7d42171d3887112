"""The archive's zstd frames: one independent frame per 4 MiB of tar stream (ADR 0053).

A save cuts the tar stream into FRAME-sized pieces and encodes each on a thread of its own, as one
frame per run of SEGMENT-sized parts that sample alike:
  - a segment whose sample does not compress (random bytes, bf16 weights) goes into a frame of
    stored (raw) blocks, built here without running a compressor over it;
  - a segment whose sample gains nothing from the asked level over level 1 (data that only entropy
    coding shrinks: no matches to find) is compressed at level 1, which is several times faster and
    as small;
  - any other segment is compressed at the asked level.
Concatenated frames are one valid zstd stream (RFC 8878 §3.1): `zstd -d | tar -x` reads the archive.

A restore walks the frames by their block headers (no decompression needed to find them) and
decompresses them in parallel, each on its own thread, in order of the stream.
"""
from __future__ import annotations

import struct
import threading
from collections import deque
from typing import Iterator

import zstandard

from .errors import CorruptArchive
from .threads import Pool, Task

DEFAULT_LEVEL = 3
"""The zstd level a save asks for unless told otherwise."""
FRAME = 4 << 20
"""Tar bytes per frame: large enough that a frame's own header and the reset of zstd's window cost
next to nothing (< 0.5 % on text), small enough that two threads always have work."""
MAX_BLOCK = 128 << 10
"""zstd's largest block (RFC 8878 §3.1.1.2.4)."""
SEGMENT = 1 << 20
"""The unit of the decision how to encode: finer than a frame, so that a piece holding the end of a
weights file and the start of a log is not stored (or compressed) whole."""
SAMPLE = 32 << 10
"""Bytes taken at a quarter and at three quarters of a segment to decide how to encode it: on the
bench's mixed state, within 0.3 % of the archive size that level 3 gives everything."""
STORE_ABOVE = 0.97
"""A sample that level 1 shrinks by less than 3 % is stored as it is."""
LEVEL1_ABOVE = 0.97
"""A sample that the asked level shrinks by less than 3 % beyond level 1 is compressed at level 1."""
MAX_PARALLEL_FRAME = 64 << 20
"""Frames that say they hold more than this are decompressed as a stream, not in one piece
(archives that other tools wrote: one frame for everything)."""

_MAGIC = 0xFD2FB528
_MAGIC_BYTES = struct.pack("<I", _MAGIC)
_RAW_HEADER = 0xA0
"""Frame header descriptor of a stored frame: a 4-byte content size, single segment, no checksum
(the archive's sha256 covers it), no dictionary."""


def stored_frame(data: bytes | bytearray | memoryview) -> bytes:
    """`data` as a zstd frame of raw blocks: no compressor runs; any zstd decoder reads it back."""
    view = memoryview(data)
    n = len(view)
    if n >= 1 << 32:
        raise ValueError("a stored frame holds less than 4 GiB")
    parts: list[bytes | memoryview] = [_MAGIC_BYTES, struct.pack("<BI", _RAW_HEADER, n)]
    start = 0
    while True:
        size = min(MAX_BLOCK, n - start)
        last = start + size >= n
        parts.append((size << 3 | int(last)).to_bytes(3, "little"))
        parts.append(view[start:start + size])
        start += size
        if last:
            return b"".join(parts)


class Encoder:
    """Encodes pieces on any number of threads (each thread keeps its own zstd contexts)."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._local = threading.local()

    def _ctx(self, level: int) -> zstandard.ZstdCompressor:
        ctxs: dict[int, zstandard.ZstdCompressor] | None = getattr(self._local, "ctxs", None)
        if ctxs is None:
            ctxs = self._local.ctxs = {}
        ctx = ctxs.get(level)
        if ctx is None:
            ctx = ctxs[level] = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
        return ctx

    def choose(self, segment: memoryview, like: tuple[float, int] | None = None) -> tuple[float, int]:
        """(level 1's ratio on the sample, how): how is 0 to store the segment, else the zstd level to
        compress it at, by two samples of it. `like` is the previous segment's answer: a sample that
        level 1 shrinks as much (within 2 %) is the same kind of data, and takes the same level without
        the dearer probe at the asked level."""
        n = len(segment)
        if n < 4 * SAMPLE:
            return (1.0, self.level) if like is None else like
        sample = b"".join((segment[n // 4:n // 4 + SAMPLE], segment[3 * n // 4:3 * n // 4 + SAMPLE]))
        fast = len(self._ctx(1).compress(sample))
        ratio = fast / len(sample)
        if ratio > STORE_ABOVE:
            return ratio, 0
        if like is not None and like[1] and abs(like[0] - ratio) <= 0.02:
            return ratio, like[1]
        if self.level > 1 and len(self._ctx(self.level).compress(sample)) > LEVEL1_ABOVE * fast:
            return ratio, 1
        return ratio, self.level

    def encode(self, piece: bytes | bytearray | memoryview) -> bytes:
        """`piece` as zstd frames: one per run of SEGMENT-sized parts that sample alike."""
        view = memoryview(piece)
        runs: list[tuple[int, int, int]] = []  # (how, start, end)
        like: tuple[float, int] | None = None
        for start in range(0, len(view), SEGMENT):
            segment = view[start:start + SEGMENT]
            like = self.choose(segment, like)
            how = like[1]
            if runs and runs[-1][0] == how:
                runs[-1] = (how, runs[-1][1], start + len(segment))
            else:
                runs.append((how, start, start + len(segment)))
        if not runs:
            runs.append((self.level, 0, 0))
        frames = []
        for how, start, end in runs:
            if how == 0:
                frames.append(stored_frame(view[start:end]))
            else:
                frames.append(self._ctx(how).compress(view[start:end]))
        return frames[0] if len(frames) == 1 else b"".join(frames)


class Frame:
    """Where one frame lies in the archive, and what is known of it without decoding it. (A plain
    class, not a dataclass: the restore path does not import dataclasses, ADR 0081.)"""

    __slots__ = ("start", "end", "content_size", "stored")

    def __init__(self, start: int, end: int, content_size: int | None,
                 stored: tuple[tuple[int, int], ...] | None) -> None:
        self.start = start
        self.end = end
        self.content_size = content_size
        """From the frame header; None when the writer did not record it."""
        self.stored = stored
        """(offset, length) of each block's bytes when every block is raw: the content, no decoder needed."""

    def __repr__(self) -> str:
        return f"Frame(start={self.start}, end={self.end}, content_size={self.content_size}, stored={self.stored})"


def _u(buf: memoryview, at: int, n: int) -> int:
    if at + n > len(buf):
        raise CorruptArchive(f"the zstd stream ends inside a frame header at byte {at}")
    return int.from_bytes(buf[at:at + n], "little")


def walk(buf: memoryview) -> Iterator[Frame]:
    """The frames of a zstd stream, found by their headers and block headers (RFC 8878 §3.1.1);
    skippable frames are passed over. Raises CorruptArchive where the stream is not zstd."""
    pos, end = 0, len(buf)
    while pos < end:
        magic = _u(buf, pos, 4)
        if 0x184D2A50 <= magic <= 0x184D2A5F:  # skippable frame
            pos += 8 + _u(buf, pos + 4, 4)
            if pos > end:
                raise CorruptArchive("not a valid zstd stream: truncated skippable frame")
            continue
        if magic != _MAGIC:
            raise CorruptArchive(f"not a valid zstd stream: unknown frame magic at byte {pos}")
        fhd = _u(buf, pos + 4, 1)
        fcs_flag, single, checksum, dict_flag = fhd >> 6, fhd >> 5 & 1, fhd >> 2 & 1, fhd & 3
        if fhd & 0x08:
            raise CorruptArchive(f"not a valid zstd stream: reserved bit set in the frame at byte {pos}")
        at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
        content: int | None = None
        if fcs_bytes:
            content = _u(buf, at, fcs_bytes) + (256 if fcs_bytes == 2 else 0)
        at += fcs_bytes
        blocks: list[tuple[int, int]] | None = []
        while True:
            header = _u(buf, at, 3)
            last, kind, size = header & 1, header >> 1 & 3, header >> 3
            at += 3
            if kind == 3:
                raise CorruptArchive(f"not a valid zstd stream: reserved block type at byte {at - 3}")
            payload = 1 if kind == 1 else size
            if at + payload > end:
                raise CorruptArchive(f"the zstd stream is truncated (a block at byte {at - 3} runs past its end)")
            if kind == 0 and blocks is not None:
                blocks.append((at, size))
            else:
                blocks = None
            at += payload
            if last:
                break
        if checksum:
            at += 4
            if at > end:
                raise CorruptArchive("the zstd stream is truncated (a frame's checksum is missing)")
        stored = tuple(blocks) if blocks is not None else None
        if stored is not None and content is not None and sum(n for _, n in stored) != content:
            raise CorruptArchive(f"not a valid zstd stream: the frame at byte {pos} holds other than its declared size")
        yield Frame(pos, at, content, stored)
        pos = at


def _streamed(buf: memoryview) -> Iterator[bytes]:
    """Decodes `buf` as a stream, frame after frame, on the calling thread (for frames too large to
    decode in one piece, and for what follows a damaged frame header: what decodes is handed on, so
    the reader can say where the archive ends)."""
    reader = zstandard.ZstdDecompressor().stream_reader(buf, read_size=FRAME, read_across_frames=True,
                                                        closefd=False)
    try:
        while data := reader.read(FRAME):
            yield data
    except zstandard.ZstdError as e:
        raise CorruptArchive(f"not a valid zstd stream: {e}") from None


def contents(buf: memoryview, threads: int) -> Iterator[bytes | memoryview]:
    """The decompressed stream, frame by frame in order: compressed frames decoded on `threads` threads
    ahead of the consumer (each frame's checksum, when it has one, checked by zstd), stored frames
    handed on as views of `buf`, block by block, without a copy."""
    local = threading.local()

    def one(frame: Frame) -> bytes:
        dctx = getattr(local, "dctx", None)
        if dctx is None:
            dctx = local.dctx = zstandard.ZstdDecompressor()
        try:
            return dctx.decompress(buf[frame.start:frame.end])
        except zstandard.ZstdError as e:
            raise CorruptArchive(f"not a valid zstd stream: {e}") from None

    def ready(item: Task[bytes] | list[memoryview]) -> Iterator[bytes | memoryview]:
        if isinstance(item, list):
            yield from item
        else:
            yield item.result()

    pending: deque[Task[bytes] | list[memoryview]] = deque()
    pool = Pool(threads, "checkpoint-unzstd")
    try:
        frames = walk(buf)
        done = 0
        while True:
            try:
                frame = next(frames, None)
            except CorruptArchive:
                while pending:
                    yield from ready(pending.popleft())
                yield from _streamed(buf[done:])  # zstd itself says what is wrong, after what decodes
                return
            if frame is None:
                break
            done = frame.end
            if frame.stored is not None:
                pending.append([buf[o:o + n] for o, n in frame.stored])
            elif frame.content_size is None or frame.content_size > MAX_PARALLEL_FRAME:
                while pending:
                    yield from ready(pending.popleft())
                yield from _streamed(buf[frame.start:frame.end])
                continue
            else:
                pending.append(pool.submit(one, frame))
            while len(pending) > 2 * threads:
                yield from ready(pending.popleft())
        while pending:
            yield from ready(pending.popleft())
    finally:
        pool.close(cancel=True)  # what the consumer no longer wants is not decoded
