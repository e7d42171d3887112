"""Attempt logs on an S3-compatible store (ADR 0044). S3 has no append, so a log is a folder of
immutable objects: `PREFIX/logs/<attempt>/<start offset, 20 digits>` for each appended chunk and
`PREFIX/logs/<attempt>/eof` once the attempt said it was the end. Reading concatenates the chunks.

A replica learns a log's state by listing its folder after the last key it already knows (the keys
only ever grow, in offset order, so what it learnt stays true); a writer lists before each append,
so a chunk resent after the agent moved to another replica and back is still written once. Readers
on the replica that writes are woken at once; readers on any other replica poll every `poll` s.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, ParamSpec, TypeVar

from ..errors import NodusError
from .base import CHUNK, LogState, Logs, check_attempt_id, plan_append

log = logging.getLogger("nodus.blobs")

EOF_KEY = "eof"
WHOLE_KEY = "whole"
"""A finished log compacted into one object (its chunks are deleted after): one GET per MiB to read."""
PART = 8 << 20
_CACHED = 4096
"""Logs whose chunk index a replica keeps in memory (least recently used beyond that are dropped)."""
READ_AHEAD = 16
"""Chunk GETs one log read has in flight at once."""
P = ParamSpec("P")
T = TypeVar("T")


class Calls:
    """boto3's blocking calls, in a pool of threads of their own: S3 answers in tens of milliseconds,
    and the loop's default pool (a few threads on a small machine) would queue every follower, append
    and upload behind each other and behind the data dir's file I/O."""

    def __init__(self, workers: int = 64) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="nodus-s3")

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))


def s3_code(e: BaseException) -> str:
    """The error code of a botocore ClientError ("" for anything else)."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return ""


def client_error(e: BaseException, url: str) -> NodusError:
    """A failed S3 call as the error the caller answers with, naming the store and the fix."""
    if isinstance(e, NodusError):
        return e
    code = s3_code(e)
    if code in ("NoSuchBucket", "404"):
        return NodusError("ServiceUnavailable", f"--blob-url {url}: the bucket does not exist",
                          fix="create the bucket (`aws s3 mb s3://BUCKET`) or name an existing one in --blob-url")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
        return NodusError("ServiceUnavailable", f"--blob-url {url}: access denied ({code})",
                          fix="give the coordinator's credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                              "AWS_PROFILE or the credentials file) s3:ListBucket, s3:GetObject, s3:PutObject "
                              "and s3:DeleteObject on the bucket")
    text = f"{code}: {e}" if code else f"{type(e).__name__}: {e}"
    return NodusError("ServiceUnavailable", f"--blob-url {url}: the store did not answer ({text})",
                      fix="check --blob-endpoint (or AWS_ENDPOINT_URL), the network and the credentials")


@dataclass
class _Index:
    """What this replica knows of one log: its chunks (start, size) in offset order."""

    starts: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    size: int = 0
    eof: bool = False
    last_key: str = ""
    written: bool = False
    """The last thing this replica did to the log was to append to it (so its end is still known)."""
    whole: int = 0
    """The size of the compacted object, once there is one (then reads use it alone)."""

    def add(self, start: int, size: int) -> None:
        if size <= 0 or start + size <= self.size:
            return  # nothing this replica does not already have
        self.starts.append(start)
        self.sizes.append(size)
        self.size = start + size


class S3LogStore(Logs):
    def __init__(self, s3: Any, bucket: str, prefix: str, *, poll: float = 1.0, calls: Calls | None = None) -> None:
        self.s3, self.bucket, self.prefix, self.poll = s3, bucket, prefix, poll
        self.calls = calls or Calls()
        self.url = f"s3://{bucket}/{prefix}"
        self._index: collections.OrderedDict[str, _Index] = collections.OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._mutex = threading.Lock()
        """Guards the indexes, which worker threads update."""
        self._compactions: dict[str, asyncio.Task[None]] = {}

    def _folder(self, attempt_id: str) -> str:
        return f"{self.prefix}{check_attempt_id(attempt_id)}/"

    def _refresh_blocking(self, attempt_id: str) -> _Index:
        """Lists the log's folder after the last key known; returns the updated index."""
        folder = self._folder(attempt_id)
        with self._mutex:
            idx = self._index.get(attempt_id) or _Index()
        if idx.eof and idx.whole:
            return idx  # final
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": folder}
        if idx.last_key:
            args["StartAfter"] = idx.last_key
        found: list[tuple[str, int]] = []
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(**args):
                found += [(obj["Key"], int(obj["Size"])) for obj in page.get("Contents") or []]
        except Exception as e:
            raise client_error(e, self.url) from e
        with self._mutex:
            for key, size in found:
                name = key[len(folder):]
                if name == EOF_KEY:
                    idx.eof = True
                elif name == WHOLE_KEY:
                    idx.whole = size
                    idx.size = max(idx.size, size)
                elif name.isdigit() and key > idx.last_key:
                    idx.add(int(name), size)
                    idx.last_key = key
            self._index[attempt_id] = idx
            self._index.move_to_end(attempt_id)
            while len(self._index) > _CACHED:
                self._index.popitem(last=False)
        return idx

    async def _refresh(self, attempt_id: str) -> _Index:
        return await self.calls(self._refresh_blocking, attempt_id)

    async def state(self, attempt_id: str) -> LogState:
        idx = await self._refresh(attempt_id)
        return LogState(idx.size, idx.eof)

    async def append(self, attempt_id: str, offset: int, data: bytes, eof: bool = False) -> LogState:
        """Writes what of `data` is new as one object named by its start offset; OffsetMismatch with
        the stored size for a chunk past the end or new bytes after the eof mark."""
        folder = self._folder(attempt_id)
        async with self._locks.setdefault(attempt_id, asyncio.Lock()):
            idx = self._index.get(attempt_id)
            # A stream that goes on where this replica's own last append ended needs no LIST; anything
            # else (a probe, a resend, a first chunk, an agent back from another replica) looks first.
            if idx is None or not (idx.written and data and offset == idx.size):
                idx = await self._refresh(attempt_id)
                idx.written = False
            plan = plan_append(attempt_id, LogState(idx.size, idx.eof), offset, data, eof)
            new, finish = plan.new, plan.finish

            def write() -> None:
                try:
                    if new:
                        # The chunk's start, taken before the PUT: a follower's LIST can find the chunk and
                        # move idx.size past it before this thread records it (a phantom chunk after it).
                        start = idx.size
                        key = f"{folder}{start:020d}"
                        self.s3.put_object(Bucket=self.bucket, Key=key, Body=new)
                        with self._mutex:
                            idx.add(start, len(new))
                            idx.last_key = max(idx.last_key, key)
                            idx.written = True
                    if finish:
                        self.s3.put_object(Bucket=self.bucket, Key=folder + EOF_KEY, Body=b"")
                        idx.eof = True
                except Exception as e:
                    raise client_error(e, self.url) from e
            await self.calls(write)
            state = LogState(idx.size, idx.eof)
        if state.eof:
            self._locks.pop(attempt_id, None)
        # At eof, or at an eof resent to a replica other than the one that wrote it (which may have
        # stopped before compacting): the chunks into one object, in the background.
        if eof and state.eof and not idx.whole and idx.starts and attempt_id not in self._compactions:
            self._compactions[attempt_id] = asyncio.create_task(self._compact(attempt_id))
        if new or finish:
            changed = self._changed.pop(attempt_id, None)
            if changed is not None:
                changed.set()
        return state

    async def sync(self, attempt_id: str) -> None:
        """Nothing to do: a PUT is durable when S3 answers it."""
        self._folder(attempt_id)

    # -- compaction ---------------------------------------------------------------------------------
    async def _compact(self, attempt_id: str) -> None:
        """After eof: the chunks into one object, then the chunks deleted. A coordinator that stops
        first leaves the chunks, which read the same, only with more GETs."""
        try:
            idx = await self._refresh(attempt_id)
            if idx.eof and not idx.whole and idx.starts:
                spans = list(zip(idx.starts, idx.sizes))
                size = await self.calls(self._compact_blocking, self._folder(attempt_id), spans, idx.size)
                with self._mutex:
                    idx.whole, idx.starts, idx.sizes = size, [], []
        except Exception as e:  # the log still reads from its chunks
            log.warning("could not compact the log of attempt %s under %s: %s", attempt_id, self.url, e)
        finally:
            self._compactions.pop(attempt_id, None)

    def _compact_blocking(self, folder: str, spans: list[tuple[int, int]], total: int) -> int:
        key = folder + WHOLE_KEY
        upload_id, buf, pos = "", bytearray(), 0
        parts: list[dict[str, Any]] = []

        def part(body: bytes) -> None:
            nonlocal upload_id
            if not upload_id:
                upload_id = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            r = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=len(parts) + 1,
                                    Body=body)
            parts.append({"PartNumber": len(parts) + 1, "ETag": r["ETag"]})

        def get(start: int) -> bytes:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=f"{folder}{start:020d}")["Body"].read())
        try:
            with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="nodus-s3-compact") as pool:
                for batch in range(0, len(spans), 4 * READ_AHEAD):  # a bounded number of chunks in memory
                    window = spans[batch:batch + 4 * READ_AHEAD]
                    for (start, size), data in zip(window, pool.map(get, [st for st, _ in window])):
                        if start > pos or len(data) != size:
                            raise RuntimeError(f"chunk {start} does not continue the log at {pos}")
                        buf += data[pos - start:]
                        pos = start + size
                        while len(buf) >= PART:
                            part(bytes(buf[:PART]))
                            del buf[:PART]
            if pos != total:
                raise RuntimeError(f"the chunks end at {pos}, the log at {total}")
            if upload_id:
                if buf:
                    part(bytes(buf))
                self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
            else:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=bytes(buf))
        except BaseException:
            if upload_id:
                with contextlib.suppress(Exception):
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        chunks = [{"Key": f"{folder}{start:020d}"} for start, _ in spans]
        for i in range(0, len(chunks), 1000):
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunks[i:i + 1000], "Quiet": True})
        return total

    async def settle(self) -> None:
        """Waits for the compactions in progress (tests; a stopping coordinator)."""
        while self._compactions:
            await asyncio.gather(*list(self._compactions.values()), return_exceptions=True)

    async def read(self, attempt_id: str, offset: int, limit: int = CHUNK) -> bytes:
        folder = self._folder(attempt_id)
        idx = self._index.get(attempt_id)
        if idx is None or offset + limit > idx.size:
            idx = await self._refresh(attempt_id)
        if idx.whole:
            return await self._read_whole(folder, offset, min(offset + max(limit, 0), idx.whole))
        data = await self._read_chunks(folder, idx, offset, limit)
        if len(data) < min(limit, idx.size - offset) and not idx.whole:
            idx = await self._refresh(attempt_id)  # chunks gone: compacted meanwhile (or deleted)
            if idx.whole:
                return await self._read_whole(folder, offset, min(offset + max(limit, 0), idx.whole))
        return data

    async def _read_whole(self, folder: str, first: int, stop: int) -> bytes:
        if stop <= first:
            return b""

        def get() -> bytes:
            try:
                r = self.s3.get_object(Bucket=self.bucket, Key=folder + WHOLE_KEY, Range=f"bytes={first}-{stop - 1}")
                return bytes(r["Body"].read())
            except Exception as e:
                if s3_code(e) in ("404", "NoSuchKey"):
                    return b""
                raise client_error(e, self.url) from e
        return await self.calls(get)

    async def _read_chunks(self, folder: str, idx: _Index, offset: int, limit: int) -> bytes:
        spans = []
        at, want = offset, offset + max(limit, 0)
        i = bisect.bisect_right(idx.starts, at) - 1
        while at < min(want, idx.size) and 0 <= i < len(idx.starts):
            start, size = idx.starts[i], idx.sizes[i]
            if at < start + size:
                stop = min(start + size, want)
                spans.append((f"{folder}{start:020d}", at - start, stop - start))
                at = stop
            i += 1

        def get(key: str, first: int, stop: int) -> bytes:
            try:
                r = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{stop - 1}")
                return bytes(r["Body"].read())
            except Exception as e:
                if s3_code(e) in ("404", "NoSuchKey"):
                    return b""  # deleted meanwhile (retention)
                raise client_error(e, self.url) from e

        gate = asyncio.Semaphore(READ_AHEAD)

        async def one(span: tuple[str, int, int]) -> bytes:
            async with gate:
                return await self.calls(get, *span)
        out = b""
        for (_, first, stop), data in zip(spans, await asyncio.gather(*(one(span) for span in spans))):
            if len(data) != stop - first:
                break  # the rest is gone: what came before it is still the log's start
            out += data
        return out

    async def wait(self, attempt_id: str, offset: int, timeout: float) -> LogState:
        """Returns once the log is longer than `offset` or finished, or after `timeout` seconds: woken
        at once by an append through this replica, and looking at the store every `poll` seconds
        for appends through any other."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed.setdefault(attempt_id, asyncio.Event())  # before looking: no lost wake-up
            st = await self.state(attempt_id)
            left = deadline - loop.time()
            if st.size > offset or st.eof or left <= 0:
                return st
            try:
                async with asyncio.timeout(min(self.poll, left)):
                    await changed.wait()
            except TimeoutError:
                pass

    # -- retention seam ---------------------------------------------------------------------------
    async def list(self) -> list[str]:
        def walk() -> list[str]:
            found = []
            try:
                for page in self.s3.get_paginator("list_objects_v2").paginate(
                        Bucket=self.bucket, Prefix=self.prefix, Delimiter="/"):
                    found += [p["Prefix"][len(self.prefix):].rstrip("/") for p in page.get("CommonPrefixes") or []]
            except Exception as e:
                raise client_error(e, self.url) from e
            return sorted(found)
        return await self.calls(walk)

    async def delete(self, attempt_id: str) -> bool:
        folder = self._folder(attempt_id)

        def remove() -> bool:
            existed = False
            try:
                for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents") or []]
                    if keys:
                        existed = True
                        self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
            except Exception as e:
                raise client_error(e, self.url) from e
            return existed
        running = self._compactions.get(attempt_id)
        if running is not None:
            await asyncio.gather(running, return_exceptions=True)
        async with self._locks.setdefault(attempt_id, asyncio.Lock()):
            existed = await self.calls(remove)
            self._index.pop(attempt_id, None)
        self._locks.pop(attempt_id, None)
        return existed
