"""BlobService over gRPC: node agents put and get blobs and append attempt logs (proto/nodus/v1/blob.proto).

Only node agents call it, over the agent port's mTLS with their node certificate (ADR 0039), and each
call names the attempt it is for: `node_scope.NodeScope` lets a node reach only the blobs and logs of
the attempts placed on it while they run (NodeScope, PERMISSION_DENIED, otherwise; ADR 0045). The join
token alone reaches no blob (only AgentService.Enrol takes it), except on a --grpc-insecure
coordinator (loopback, development), where nodes have no certificates and the join token is every
node's credential, as for Register and Connect. A customer or operator token is refused with
PERMISSION_DENIED and a fix that points to the REST downloads. Errors cross the boundary the way the
rest of the gRPC API sends them (status code from the one registry, google.rpc.Status details with
reason, fix and requestId); a log gap or a write to a finished log answers FAILED_PRECONDITION with
the stored size in the `x-log-size` trailer (and in ErrorInfo metadata `size`), so the agent resends
from there.
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
from .node_scope import Access, NodeScope

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
                 node_peer: Callable[[grpc.aio.ServicerContext], Awaitable[Any]] | None = None,
                 scope: NodeScope | None = None) -> None:
        self.blobs = blobs
        self.identity = identity
        self.node_peer = node_peer
        """The node a verified client certificate names (agents.AgentServicer.peer), or None without one."""
        self.scope = scope
        """Node-scoped access (a TLS coordinator, whose nodes hold certificates); None: the join token
        reaches every blob (--grpc-insecure)."""

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> str | None:
        """The calling node (its certificate's name), or None for the join token of a --grpc-insecure
        coordinator, which no node scope narrows."""
        peer = await self.node_peer(context) if self.node_peer is not None else None
        if peer is not None:
            return str(peer.node)  # a node's certificate, over the agent port's mTLS
        token = authorization(context)
        try:
            await self.identity.verify_join_token(token)
            if self.scope is not None:
                raise NodusError("NodeScope", "the join token reads and writes no blob: BlobService serves a node "
                                 "the blobs of its own attempts, by its certificate",
                                 fix="enrol the node with the join token (AgentService.Enrol) and call the agent "
                                     "port with its certificate; nodus-agent does both")
            return None
        except NodusError as e:
            if e.reason != "Unauthorized":
                raise
            try:
                caller = await self.identity.authenticate(token)
            except NodusError:
                raise e from None
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot use BlobService: it serves node agents',
                             fix="download outputs and logs over REST (`nodus outputs get`, `nodus logs`)") from None

    async def _call(self, verb: str, context: grpc.aio.ServicerContext,
                    work: Callable[[str | None], Awaitable[Any]]) -> Any:
        return await boundary(verb, "blobs", context, lambda: self._authenticate(context), work, _status)

    def _check(self, node: str | None, attempt_id: str, access: Access) -> None:
        """NodeScope unless `node` may do `access` for `attempt_id` (no node: the unscoped join token)."""
        if self.scope is not None and node is not None:
            self.scope.check(node, attempt_id, access)

    # -- RPCs -------------------------------------------------------------------------------------
    async def Put(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async def work(node: str | None) -> Any:
            messages = aiter(request_iterator)
            first = await anext(messages, None)
            if first is None or first.WhichOneof("part") != "header":
                raise NodusError("BadRequest", "the first message of Put must be the header",
                                 fix="send PutRequest{header: {sha256, size}} first, then data chunks")
            header = first.header
            if header.size < 0:
                raise NodusError("BadRequest", f"size {header.size} is negative")
            self._check(node, header.attempt_id, Access("blobput"))

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
        async def work(node: str | None) -> Any:
            digest = check_digest(request.sha256)
            self._check(node, request.attempt_id, Access("blobstat", digest))
            ref = await self.blobs.stat(digest)
            if ref is None:
                raise NodusError("NotFound", f"blob {request.sha256} not found", name=request.sha256, kind="blobs",
                                 fix="upload it with BlobService/Put")
            return blob_pb2.BlobRef(sha256=ref.sha256, size=ref.size, uri=ref.uri)
        return await self._call("blobstat", context, work)

    async def Get(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        # A coroutine that writes, not an async generator: grpc.aio allows either for a server stream,
        # and this way errors go through the same boundary as the other calls.
        async def work(node: str | None) -> None:
            digest = check_digest(request.sha256)
            self._check(node, request.attempt_id, Access("blobget", digest))
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
        async def work(node: str | None) -> Any:
            size = 0
            touched: set[str] = set()
            try:
                async for chunk in request_iterator:
                    self._check(node, chunk.attempt_id, Access("appendlog"))
                    state = await self.blobs.logs.append(chunk.attempt_id, chunk.offset, chunk.data, chunk.eof)
                    if state.eof:
                        touched.discard(chunk.attempt_id)  # an ended log is durable already (Logs.append)
                    else:
                        touched.add(chunk.attempt_id)
                    size = state.size
            finally:
                for attempt_id in touched:  # what was acknowledged is on disk
                    await self.blobs.logs.sync(attempt_id)
            return blob_pb2.LogAck(size=size)
        return await self._call("appendlog", context, work)
