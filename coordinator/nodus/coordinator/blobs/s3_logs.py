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
import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import NodusError
from .base import CHUNK, LogState, Logs, check_attempt_id

EOF_KEY = "eof"
_CACHED = 4096
"""Logs whose chunk index a replica keeps in memory (least recently used beyond that are dropped)."""


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

    def add(self, start: int, size: int) -> None:
        if size <= 0 or start + size <= self.size:
            return  # nothing this replica does not already have
        self.starts.append(start)
        self.sizes.append(size)
        self.size = start + size


class S3LogStore(Logs):
    def __init__(self, s3: Any, bucket: str, prefix: str, *, poll: float = 1.0) -> None:
        self.s3, self.bucket, self.prefix, self.poll = s3, bucket, prefix, poll
        self.url = f"s3://{bucket}/{prefix}"
        self._index: collections.OrderedDict[str, _Index] = collections.OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._mutex = threading.Lock()
        """Guards the indexes, which worker threads update."""

    def _folder(self, attempt_id: str) -> str:
        return f"{self.prefix}{check_attempt_id(attempt_id)}/"

    def _refresh_blocking(self, attempt_id: str) -> _Index:
        """Lists the log's folder after the last key known; returns the updated index."""
        folder = self._folder(attempt_id)
        with self._mutex:
            idx = self._index.get(attempt_id) or _Index()
        if idx.eof:
            return idx
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
                elif name.isdigit() and key > idx.last_key:
                    idx.add(int(name), size)
                    idx.last_key = key
            self._index[attempt_id] = idx
            self._index.move_to_end(attempt_id)
            while len(self._index) > _CACHED:
                self._index.popitem(last=False)
        return idx

    async def _refresh(self, attempt_id: str) -> _Index:
        return await asyncio.to_thread(self._refresh_blocking, attempt_id)

    async def state(self, attempt_id: str) -> LogState:
        idx = await self._refresh(attempt_id)
        return LogState(idx.size, idx.eof)

    async def append(self, attempt_id: str, offset: int, data: bytes, eof: bool = False) -> LogState:
        """Writes what of `data` is new as one object named by its start offset; OffsetMismatch with
        the stored size for a chunk past the end or new bytes after the eof mark."""
        folder = self._folder(attempt_id)
        if offset < 0:
            raise NodusError("BadRequest", f"offset {offset} is negative")
        async with self._locks.setdefault(attempt_id, asyncio.Lock()):
            idx = await self._refresh(attempt_id)
            if offset > idx.size:
                raise self.gap(attempt_id, idx.size, offset)
            new = data[idx.size - offset:] if offset + len(data) > idx.size else b""
            if idx.eof and new:
                raise self.ended(attempt_id, idx.size)
            finish = eof and not idx.eof

            def write() -> None:
                try:
                    if new:
                        key = f"{folder}{idx.size:020d}"
                        self.s3.put_object(Bucket=self.bucket, Key=key, Body=new)
                        with self._mutex:
                            idx.add(idx.size, len(new))
                            idx.last_key = max(idx.last_key, key)
                    if finish:
                        self.s3.put_object(Bucket=self.bucket, Key=folder + EOF_KEY, Body=b"")
                        idx.eof = True
                except Exception as e:
                    raise client_error(e, self.url) from e
            await asyncio.to_thread(write)
            state = LogState(idx.size, idx.eof)
        if state.eof:
            self._locks.pop(attempt_id, None)
        if new or finish:
            changed = self._changed.pop(attempt_id, None)
            if changed is not None:
                changed.set()
        return state

    async def sync(self, attempt_id: str) -> None:
        """Nothing to do: a PUT is durable when S3 answers it."""
        self._folder(attempt_id)

    async def read(self, attempt_id: str, offset: int, limit: int = CHUNK) -> bytes:
        folder = self._folder(attempt_id)
        idx = self._index.get(attempt_id)
        if idx is None or offset + limit > idx.size:
            idx = await self._refresh(attempt_id)
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

        def get() -> bytes:
            out = bytearray()
            for key, first, stop in spans:
                try:
                    r = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{stop - 1}")
                    out += r["Body"].read()
                except Exception as e:
                    if s3_code(e) in ("404", "NoSuchKey"):
                        break  # deleted meanwhile (retention)
                    raise client_error(e, self.url) from e
            return bytes(out)
        return await asyncio.to_thread(get) if spans else b""

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
                await asyncio.wait_for(changed.wait(), min(self.poll, left))
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
        return await asyncio.to_thread(walk)

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
        async with self._locks.setdefault(attempt_id, asyncio.Lock()):
            existed = await asyncio.to_thread(remove)
            self._index.pop(attempt_id, None)
        self._locks.pop(attempt_id, None)
        return existed
