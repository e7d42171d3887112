"""The agent's side of BlobService: uploads (outputs), downloads (inputs, volumes, code), logs.

Every call names the attempt it is for: the coordinator lets a node reach only the blobs and logs of
the attempts placed on it while they run (docs/adr/0045)."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import AsyncIterator, Sequence

import grpc

from nodus.v1 import blob_pb2, blob_pb2_grpc

from .archive import CHUNK

BLOB_URI = re.compile(r"^blob://sha256/([0-9a-f]{64})$")


class DigestMismatch(Exception):
    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"expected sha256 {expected}, got {got}")
        self.expected, self.got = expected, got


def blob_digest(uri: str) -> str | None:
    """The sha256 a `blob://sha256/<hex>` URI names, or None for any other URI."""
    m = BLOB_URI.match(uri.strip().lower())
    return m.group(1) if m else None


def log_size_from_error(err: grpc.aio.AioRpcError) -> int | None:
    """The size the server holds, from an AppendLog FAILED_PRECONDITION (trailer `log-size` or the text)."""
    for key, value in (err.trailing_metadata() or ()):
        if key in ("log-size", "x-log-size"):
            try:
                return int(value)
            except (TypeError, ValueError):
                pass
    m = re.search(r"\b(?:size|has)\D{0,16}(\d+)", err.details() or "")
    return int(m.group(1)) if m else None


class BlobClient:
    def __init__(self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        self.stub = blob_pb2_grpc.BlobServiceStub(channel)
        self.metadata = tuple(metadata)

    def use(self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        """Later calls go over `channel` (the link's mTLS channel once the node holds a certificate)."""
        self.stub = blob_pb2_grpc.BlobServiceStub(channel)
        self.metadata = tuple(metadata)

    async def put(self, attempt_id: str, path: Path, sha256: str = "", size: int = 0,
                  media_type: str = "") -> blob_pb2.BlobRef:
        """Uploads `path` as an output or checkpoint of `attempt_id`."""
        async def parts() -> AsyncIterator[blob_pb2.PutRequest]:
            yield blob_pb2.PutRequest(header=blob_pb2.PutHeader(sha256=sha256, size=size, media_type=media_type,
                                                                attempt_id=attempt_id))
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield blob_pb2.PutRequest(data=chunk)

        return await self.stub.Put(parts(), metadata=self.metadata)

    async def get(self, attempt_id: str, sha256: str, dest: Path) -> tuple[str, int]:
        """Streams a blob `attempt_id`'s Assignment names into `dest`; returns (sha256, size) of what
        arrived, after checking the digest."""
        digest = hashlib.sha256()
        size = 0
        with open(dest, "wb") as f:
            async for chunk in self.stub.Get(blob_pb2.GetBlobRequest(sha256=sha256, attempt_id=attempt_id), metadata=self.metadata):
                f.write(chunk.data)
                digest.update(chunk.data)
                size += len(chunk.data)
            f.flush()
            os.fsync(f.fileno())
        got = digest.hexdigest()
        if got != sha256:
            raise DigestMismatch(sha256, got)
        return got, size

    async def log_size(self, attempt_id: str) -> int:
        """How much of an attempt's log the server has: an empty chunk at offset 0 is a no-op append."""
        async def probe() -> AsyncIterator[blob_pb2.LogChunk]:
            yield blob_pb2.LogChunk(attempt_id=attempt_id, offset=0, data=b"")

        try:
            ack = await self.stub.AppendLog(probe(), metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                size = log_size_from_error(e)
                if size is not None:
                    return size
            raise
        return int(ack.size)

    async def append_log(self, chunks: AsyncIterator[blob_pb2.LogChunk]) -> int:
        ack = await self.stub.AppendLog(chunks, metadata=self.metadata)
        return int(ack.size)
