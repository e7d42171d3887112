"""What every blob store offers: content-addressed blobs and append-only attempt logs.

Two implementations: the embedded one in the data dir (files.py) and the S3-compatible one that
every replica reaches (s3.py, s3_logs.py; docs/adr/0044-blobs-on-s3.md). The coordinator builds one
from `--blob-url` (open.py); everything above (BlobService, the REST downloads, retention, sinks)
sees only this interface.
"""
from __future__ import annotations

import abc
import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncContextManager, AsyncIterable, AsyncIterator, Awaitable, Callable

from ..errors import NodusError

CHUNK = 1 << 20
"""Read and stream in pieces of 1 MiB (the BlobService chunk size)."""
URI_PREFIX = "blob://sha256/"
HEX = re.compile(r"^[0-9a-f]{64}$")
_ATTEMPT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A stored blob."""

    sha256: str
    size: int

    @property
    def uri(self) -> str:
        """`blob://sha256/<hex>`, what agents report in OutputCommit and CheckpointCommit."""
        return URI_PREFIX + self.sha256


def check_digest(text: str, what: str = "sha256") -> str:
    """A digest as 64 lower-case hex digits, or BadRequest."""
    digest = (text or "").strip().lower()
    if not HEX.match(digest):
        raise NodusError("BadRequest", f"{what} {text!r} is not a sha256 digest",
                         fix="send the sha256 of the content as 64 hexadecimal digits")
    return digest


def digest_of_uri(uri: str) -> str:
    """The digest of `blob://sha256/<hex>`, or BadRequest for any other URI."""
    if not uri.startswith(URI_PREFIX):
        raise NodusError("BadRequest", f"{uri!r} is not a blob URI", fix="use blob://sha256/<hex>")
    return check_digest(uri[len(URI_PREFIX):])


def check_attempt_id(attempt_id: str) -> str:
    """An attempt id that is safe as a file or key name, or BadRequest."""
    if not _ATTEMPT.match(attempt_id or "") or ".." in attempt_id:
        raise NodusError("BadRequest", f"attempt id {attempt_id!r} is not valid",
                         fix="use the attempt id the coordinator assigned (letters, digits, '.', '_', '-')")
    return attempt_id


def declared_problem(size: int, digest: str, expected_size: int, expected_sha256: str) -> str:
    """Why what arrived differs from what the uploader declared ("" when it does not)."""
    if expected_size and size != expected_size:
        return f"received {size} bytes, the header declared {expected_size}"
    if expected_sha256 and digest != expected_sha256:
        return f"received content with sha256 {digest}, the header declared {expected_sha256}"
    return ""


def too_long(expected_size: int) -> NodusError:
    return NodusError("DigestMismatch", f"the upload is longer than the declared {expected_size} bytes; "
                      "nothing was stored")


@dataclass(frozen=True, slots=True)
class LogState:
    """How much of an attempt's log is stored, and whether the attempt said it was the end."""

    size: int
    eof: bool


@dataclass(frozen=True, slots=True)
class Append:
    """What one append writes onto a log (`plan_append`)."""

    new: bytes
    """The chunk's bytes past the stored end (b"" for a chunk resent whole)."""
    finish: bool
    """This append ends the log: it carries eof and the log had not ended."""


def plan_append(attempt_id: str, stored: LogState, offset: int, data: bytes, eof: bool) -> Append:
    """The logs contract's offset rules, for every engine: a chunk at `offset` onto a log in state
    `stored` writes only what is past the stored end (a resent chunk writes nothing); BadRequest for a
    negative offset; OffsetMismatch carrying the stored size for a chunk that starts past the end, or
    that brings new bytes to a log that ended."""
    if offset < 0:
        raise NodusError("BadRequest", f"offset {offset} is negative")
    if offset > stored.size:
        raise Logs.gap(attempt_id, stored.size, offset)
    new = data[stored.size - offset:] if offset + len(data) > stored.size else b""
    if stored.eof and new:
        raise Logs.ended(attempt_id, stored.size)
    return Append(new, eof and not stored.eof)


class Logs(abc.ABC):
    """Append-only attempt logs: every append names the offset it starts at, so a chunk resent after
    a reconnect is written once; a chunk past the end fails with OffsetMismatch carrying the stored
    size (`extra["size"]`); an eof mark ends a log; followers wait for more bytes or the mark."""

    @abc.abstractmethod
    async def state(self, attempt_id: str) -> LogState: ...

    @abc.abstractmethod
    async def append(self, attempt_id: str, offset: int, data: bytes, eof: bool = False) -> LogState:
        """A log whose returned state has eof is durable, all of it: it needs no `sync`."""

    @abc.abstractmethod
    async def sync(self, attempt_id: str) -> None:
        """Makes what was appended durable (called when an AppendLog stream ends, for the logs it appended
        to that have not ended)."""

    @abc.abstractmethod
    async def read(self, attempt_id: str, offset: int, limit: int = CHUNK) -> bytes: ...

    @abc.abstractmethod
    async def wait(self, attempt_id: str, offset: int, timeout: float) -> LogState:
        """Returns once the log is longer than `offset` or finished, or after `timeout` seconds."""

    @abc.abstractmethod
    async def list(self) -> list[str]:
        """The attempt ids that have a log."""

    @abc.abstractmethod
    async def delete(self, attempt_id: str) -> bool: ...

    @staticmethod
    def gap(attempt_id: str, size: int, offset: int) -> NodusError:
        return NodusError("OffsetMismatch", f"the log of attempt {attempt_id} has {size} bytes; a chunk "
                          f"at offset {offset} would leave a gap", extra={"size": size})

    @staticmethod
    def ended(attempt_id: str, size: int) -> NodusError:
        return NodusError("OffsetMismatch", f"the log of attempt {attempt_id} ended at {size} bytes",
                          fix="do not append to a finished attempt's log", extra={"size": size})

    async def follow(self, attempt_id: str, offset: int = 0, *, stop: Callable[[], Awaitable[bool]] | None = None,
                     poll: float = 5.0) -> AsyncIterator[bytes]:
        """The log from `offset` as it grows, until its eof. Every `poll` seconds without new bytes
        `stop()` is asked whether the writer is gone for good (an agent that died before sending
        eof); True ends the stream too."""
        while True:
            st = await self.wait(attempt_id, offset, poll)
            if st.size > offset:
                data = await self.read(attempt_id, offset, min(st.size - offset, CHUNK))
                if data:
                    offset += len(data)
                    yield data
                    continue
            if st.eof:
                return
            if stop is not None and await stop():
                return


class Blobs(abc.ABC):
    """Content-addressed blobs (named by their sha256), and the attempt logs beside them."""

    logs: Logs

    @abc.abstractmethod
    async def put(self, chunks: AsyncIterable[bytes], sha256: str = "", size: int = 0) -> tuple[BlobRef, bool]:
        """Stores a stream; returns the blob and whether it is new. DigestMismatch (and nothing
        visible stored) when it differs from the declared size or digest."""

    async def put_bytes(self, data: bytes, sha256: str = "") -> BlobRef:
        async def one() -> AsyncIterator[bytes]:
            yield data
        ref, _ = await self.put(one(), sha256, len(data))
        return ref

    @abc.abstractmethod
    async def stat(self, sha256: str) -> BlobRef | None: ...

    @abc.abstractmethod
    def read(self, sha256: str, offset: int = 0, end: int | None = None,
             chunk: int = CHUNK) -> AsyncIterator[bytes]:
        """The content from `offset` up to `end` (exclusive), in chunks; NotFound when absent."""

    @abc.abstractmethod
    async def head(self, sha256: str, n: int) -> bytes:
        """The first `n` bytes (fewer for a shorter blob)."""

    @abc.abstractmethod
    def local_copy(self, sha256: str) -> AsyncContextManager[Path]:
        """A local file with the blob's content while the context lasts (the blob's own file in the
        data dir, a downloaded temp file for S3), for readers that need a seekable file."""

    async def read_all(self, sha256: str) -> bytes:
        """The whole content in memory (for small blobs only)."""
        async with self.local_copy(sha256) as path:
            return await asyncio.to_thread(path.read_bytes)

    # -- retention seam ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def list_blobs(self) -> list[BlobRef]:
        """Every stored blob (for garbage collection of unreferenced ones)."""

    @abc.abstractmethod
    async def delete(self, sha256: str) -> bool:
        """Removes a blob; True if it existed. Readers that already opened it may finish reading."""
