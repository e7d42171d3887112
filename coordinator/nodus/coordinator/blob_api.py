"""BlobService over gRPC: node agents put and get blobs and append attempt logs (proto/nodus/v1/blob.proto).

Only node agents call it: every call carries the agent join token (`authorization: Bearer
nodusjoin_…`). A customer or operator token is refused with PERMISSION_DENIED and a fix that points
to the REST downloads. Errors cross the boundary the way the rest of the gRPC API sends them (status
code from the one registry, google.rpc.Status details with reason, fix and requestId); a log gap or a
write to a finished log answers FAILED_PRECONDITION with the stored size in the `x-log-size` trailer
(and in ErrorInfo metadata `size`), so the agent resends from there.
"""
from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from nodus.v1 import blob_pb2, blob_pb2_grpc

from .blobs import CHUNK, Blobs, check_digest
from .errors import NodusError
from .grpc_api import authorization, boundary, status_for
from .identity import Identity

log = logging.getLogger("nodus.blobs")

SERVICE_NAME = blob_pb2.DESCRIPTOR.services_by_name["BlobService"].full_name
SIZE_TRAILER = "x-log-size"


def _status(err: NodusError, rid: str) -> grpc.Status:
    """status_for, with the log's size as a trailer when the error knows it (an append at the wrong
    offset: the agent resumes from there)."""
    status = status_for(err, rid)
    size = err.extra.get("size")
    return status if size is None else _Trailed(status, ((SIZE_TRAILER, str(size)),))


class _Trailed(grpc.Status):
    """A status with trailers added (grpc.Status is an interface: code, details, trailing_metadata)."""

    def __init__(self, base: grpc.Status, extra: tuple[tuple[str, str], ...]) -> None:
        self.code = base.code
        self.details = base.details
        self.trailing_metadata = tuple(base.trailing_metadata) + extra


class BlobServicer(blob_pb2_grpc.BlobServiceServicer):
    def __init__(self, blobs: Blobs, identity: Identity,
                 node_peer: Callable[[grpc.aio.ServicerContext], Awaitable[Any]] | None = None) -> None:
        self.blobs = blobs
        self.identity = identity
        self.node_peer = node_peer
        """The node a verified client certificate names (agents.AgentServicer.peer), or None without one."""

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        if self.node_peer is not None and await self.node_peer(context) is not None:
            return  # a node's certificate, over the agent port's mTLS
        token = authorization(context)
        try:
            await self.identity.verify_join_token(token)
        except NodusError as e:
            if e.reason != "Unauthorized":
                raise
            try:
                caller = await self.identity.authenticate(token)
            except NodusError:
                raise e from None
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot use BlobService: it serves node agents',
                             fix="download outputs and logs over REST (`nodus outputs get`, `nodus logs`)") from None

    async def _call(self, verb: str, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Any]]) -> Any:
        return await boundary(verb, "blobs", context, lambda: self._authenticate(context), lambda _: work(), _status)

    # -- RPCs -------------------------------------------------------------------------------------
    async def Put(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            messages = aiter(request_iterator)
            first = await anext(messages, None)
            if first is None or first.WhichOneof("part") != "header":
                raise NodusError("BadRequest", "the first message of Put must be the header",
                                 fix="send PutRequest{header: {sha256, size}} first, then data chunks")
            header = first.header
            if header.size < 0:
                raise NodusError("BadRequest", f"size {header.size} is negative")

            async def chunks() -> AsyncIterator[bytes]:
                async for msg in messages:
                    if msg.WhichOneof("part") != "data":
                        raise NodusError("BadRequest", "only data chunks may follow the header")
                    yield msg.data
            ref, created = await self.blobs.put(chunks(), header.sha256, header.size)
            log.debug("blob %s (%d bytes) %s", ref.sha256, ref.size, "stored" if created else "already stored")
            return blob_pb2.BlobRef(sha256=ref.sha256, size=ref.size, uri=ref.uri)
        return await self._call("blobput", context, work)

    async def Stat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            ref = await self.blobs.stat(check_digest(request.sha256))
            if ref is None:
                raise NodusError("NotFound", f"blob {request.sha256} not found", name=request.sha256, kind="blobs",
                                 fix="upload it with BlobService/Put")
            return blob_pb2.BlobRef(sha256=ref.sha256, size=ref.size, uri=ref.uri)
        return await self._call("blobstat", context, work)

    async def Get(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        # A coroutine that writes, not an async generator: grpc.aio allows either for a server stream,
        # and this way errors go through the same boundary as the other calls.
        async def work() -> None:
            digest = check_digest(request.sha256)
            ref = await self.blobs.stat(digest)
            if ref is None:
                raise NodusError("NotFound", f"blob {digest} not found", name=digest, kind="blobs")
            if request.offset < 0 or request.offset > ref.size:
                raise NodusError("BadRequest", f"offset {request.offset} is outside the blob ({ref.size} bytes)",
                                 fix=f"ask for an offset from 0 to {ref.size}")
            async for data in self.blobs.read(digest, request.offset, chunk=CHUNK):
                await context.write(blob_pb2.BlobChunk(data=data))
        await self._call("blobget", context, work)

    async def AppendLog(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            size = 0
            touched: set[str] = set()
            try:
                async for chunk in request_iterator:
                    state = await self.blobs.logs.append(chunk.attempt_id, chunk.offset, chunk.data, chunk.eof)
                    touched.add(chunk.attempt_id)
                    size = state.size
            finally:
                for attempt_id in touched:  # what was acknowledged is on disk
                    await self.blobs.logs.sync(attempt_id)
            return blob_pb2.LogAck(size=size)
        return await self._call("appendlog", context, work)
