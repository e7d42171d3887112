"""Blobs on an S3-compatible store, where every coordinator replica reaches them (ADR 0044).

Layout under `s3://BUCKET/PREFIX/`: `blobs/sha256/ab/cdef…` (as in the data dir), `blobs/tmp/<uuid>`
for uploads whose digest is not declared, and `logs/<attempt>/…` (s3_logs.py).

An upload is hashed as it arrives and sent in parts of `part_size` bytes (so at most one part is in
memory, whatever the size of the checkpoint); the object becomes visible only when the digest and
size check out: a declared digest goes straight to its final key as a multipart upload completed
after the check (or as one PUT made after the check, for a blob smaller than one part), an
undeclared one to a temp key copied onto its final key once its digest is known. A mismatch aborts
the multipart upload, so nothing visible is stored. Content already stored is hashed and not sent.

boto3 is blocking: every call runs in a worker thread, so the event loop never waits on the network.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator

from ..errors import NodusError
from .base import CHUNK, HEX, BlobRef, Blobs, check_digest, declared_problem, too_long
from .s3_logs import Calls, S3LogStore, client_error, s3_code

log = logging.getLogger("nodus.blobs")

PART = 8 << 20
"""Multipart part size (S3's minimum is 5 MiB for every part but the last)."""
STALE_AFTER = dt.timedelta(days=1)
"""Temp keys and multipart uploads older than this are an earlier process's leftovers."""


class S3Upload:
    """One upload in progress (blocking calls, made from worker threads)."""

    def __init__(self, store: "S3BlobStore", sha256: str = "", size: int = 0) -> None:
        self._store, self._s3, self._bucket = store, store.s3, store.bucket
        self.expected_sha256 = check_digest(sha256) if sha256 else ""
        self.expected_size = max(int(size), 0)
        self._hash = hashlib.sha256()
        self.size = 0
        self._buf = bytearray()
        self._parts: list[dict[str, Any]] = []
        self._upload_id = ""
        self._key = store.key(self.expected_sha256) if self.expected_sha256 else store.tmp_key()
        # Content already stored under its declared digest is only hashed (to answer a mismatch).
        self._present = bool(self.expected_sha256) and store.stat_blocking(self.expected_sha256) is not None
        self._done = False

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.expected_size and self.size > self.expected_size:
            self.abort()
            raise too_long(self.expected_size)
        self._hash.update(data)
        if self._present:
            return
        self._buf += data
        while len(self._buf) >= self._store.part_size:
            self._send_part(bytes(self._buf[:self._store.part_size]))
            del self._buf[:self._store.part_size]

    def _send_part(self, body: bytes) -> None:
        try:
            if not self._upload_id:
                self._upload_id = self._s3.create_multipart_upload(Bucket=self._bucket, Key=self._key)["UploadId"]
            number = len(self._parts) + 1
            r = self._s3.upload_part(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                                     PartNumber=number, Body=body)
        except Exception as e:
            raise client_error(e, self._store.url) from e
        self._parts.append({"PartNumber": number, "ETag": r["ETag"]})

    def commit(self) -> tuple[BlobRef, bool]:
        """Checks what was declared, then makes the blob visible; returns it and whether it is new."""
        digest = self._hash.hexdigest()
        problem = declared_problem(self.size, digest, self.expected_size, self.expected_sha256)
        if problem:
            self.abort()
            raise NodusError("DigestMismatch", problem + "; nothing was stored")
        ref = BlobRef(digest, self.size)
        if self._present:
            self._done = True
            return ref, False
        try:
            if not self._upload_id:  # never sent: one PUT onto the digest's key, now that it is known
                self._done = True
                if not self.expected_sha256 and self._store.stat_blocking(digest) is not None:
                    return ref, False
                self._s3.put_object(Bucket=self._bucket, Key=self._store.key(digest), Body=bytes(self._buf))
                return ref, True
            if self._buf:
                self._send_part(bytes(self._buf))
            self._s3.complete_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                                               MultipartUpload={"Parts": self._parts})
            self._done = True
            self._buf = bytearray()
            return ref, True if self.expected_sha256 else self._settle(digest)
        except NodusError:
            self.abort()
            raise
        except Exception as e:
            self.abort()
            raise client_error(e, self._store.url) from e

    def _settle(self, digest: str) -> bool:
        """An undeclared upload: copies its temp key onto the digest's key (unless it is there already)."""
        new = self._store.stat_blocking(digest) is None
        if new:
            self._s3.copy({"Bucket": self._bucket, "Key": self._key}, self._bucket, self._store.key(digest))
        self._s3.delete_object(Bucket=self._bucket, Key=self._key)
        return new

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._buf = bytearray()
        with contextlib.suppress(Exception):
            if self._upload_id:
                self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)


class S3BlobStore(Blobs):
    """Content-addressed blobs and attempt logs in `s3://bucket/prefix`."""

    def __init__(self, s3: Any, bucket: str, prefix: str = "", *, spool_dir: Path, part_size: int = PART,
                 log_poll: float = 1.0) -> None:
        self.s3, self.bucket = s3, bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self.part_size = part_size
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.calls = Calls()
        self.logs = S3LogStore(s3, bucket, self.prefix + "logs/", poll=log_poll, calls=self.calls)

    def key(self, sha256: str) -> str:
        digest = check_digest(sha256)
        return f"{self.prefix}blobs/sha256/{digest[:2]}/{digest[2:]}"

    def tmp_key(self) -> str:
        return f"{self.prefix}blobs/tmp/{uuid.uuid4().hex}"

    # -- start ------------------------------------------------------------------------------------
    def probe(self) -> None:
        """Blocking: the bucket is there and this process may list, write, read and delete in it
        (NodusError naming what failed otherwise); earlier processes' leftovers are swept."""
        try:
            self.s3.head_bucket(Bucket=self.bucket)
            key = f"{self.prefix}blobs/tmp/probe-{uuid.uuid4().hex}"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"nodus")
            self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            self.s3.delete_object(Bucket=self.bucket, Key=key)
            self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "blobs/sha256/", MaxKeys=1)
        except Exception as e:
            raise client_error(e, self.url) from e
        self._sweep()

    def _sweep(self) -> None:
        cutoff = dt.datetime.now(dt.timezone.utc) - STALE_AFTER
        tmp = self.prefix + "blobs/tmp/"
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=tmp):
                for obj in page.get("Contents") or []:
                    if obj["LastModified"] < cutoff:
                        self.s3.delete_object(Bucket=self.bucket, Key=obj["Key"])
            for page in self.s3.get_paginator("list_multipart_uploads").paginate(
                    Bucket=self.bucket, Prefix=self.prefix + "blobs/"):
                for up in page.get("Uploads") or []:
                    if up["Initiated"] < cutoff:
                        self.s3.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
        except Exception as e:  # leftovers cost storage, not correctness
            log.warning("could not sweep old uploads under %s: %s", self.url, e)

    # -- writes -----------------------------------------------------------------------------------
    async def put(self, chunks: AsyncIterable[bytes], sha256: str = "", size: int = 0) -> tuple[BlobRef, bool]:
        upload = await self.calls(S3Upload, self, sha256, size)
        try:
            async for data in chunks:
                if data:
                    await self.calls(upload.write, data)
            return await self.calls(upload.commit)
        except BaseException:
            await self.calls(upload.abort)
            raise

    # -- reads ------------------------------------------------------------------------------------
    def stat_blocking(self, sha256: str) -> BlobRef | None:
        key = self.key(sha256)
        try:
            r = self.s3.head_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            if s3_code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise client_error(e, self.url) from e
        return BlobRef(check_digest(sha256), int(r["ContentLength"]))

    async def stat(self, sha256: str) -> BlobRef | None:
        return await self.calls(self.stat_blocking, sha256)

    async def read(self, sha256: str, offset: int = 0, end: int | None = None,
                   chunk: int = CHUNK) -> AsyncIterator[bytes]:
        key = self.key(sha256)
        if end is not None and end <= offset:
            return
        extra = {} if not offset and end is None else {"Range": f"bytes={offset}-{'' if end is None else end - 1}"}
        try:
            r = await self.calls(self.s3.get_object, Bucket=self.bucket, Key=key, **extra)
        except Exception as e:
            code = s3_code(e)
            if code in ("404", "NoSuchKey", "NotFound"):
                raise NodusError("NotFound", f"blob {sha256} not found") from None
            if code in ("416", "InvalidRange"):  # from at or past the end: nothing to read
                return
            raise client_error(e, self.url) from e
        body = r["Body"]
        try:
            while True:
                data = await self.calls(body.read, chunk)
                if not data:
                    return
                yield data
        finally:
            await self.calls(body.close)

    async def head(self, sha256: str, n: int) -> bytes:
        return b"".join([data async for data in self.read(sha256, 0, max(n, 1))])[:n]

    @contextlib.asynccontextmanager
    async def local_copy(self, sha256: str) -> AsyncIterator[Path]:
        """A temp file in the spool dir holding the blob, removed when the context ends."""
        fd, name = tempfile.mkstemp(dir=self.spool_dir, prefix="get-")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                async for data in self.read(sha256):
                    await self.calls(f.write, data)
            yield path
        finally:
            path.unlink(missing_ok=True)

    # -- retention seam ---------------------------------------------------------------------------
    async def list_blobs(self) -> list[BlobRef]:
        root = self.prefix + "blobs/sha256/"

        def walk() -> list[BlobRef]:
            found = []
            try:
                for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root):
                    for obj in page.get("Contents") or []:
                        digest = obj["Key"][len(root):].replace("/", "")
                        if HEX.match(digest):
                            found.append(BlobRef(digest, int(obj["Size"])))
            except Exception as e:
                raise client_error(e, self.url) from e
            return found
        return await self.calls(walk)

    async def delete(self, sha256: str) -> bool:
        key = self.key(sha256)

        def remove() -> bool:
            existed = self.stat_blocking(sha256) is not None
            try:
                self.s3.delete_object(Bucket=self.bucket, Key=key)
            except Exception as e:
                raise client_error(e, self.url) from e
            return existed
        return await self.calls(remove)
