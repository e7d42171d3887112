"""What leaves the host for the coordinator's blob store: an attempt's outputs and its log.

Outputs: the supervisor collected them (directories as tar.zst, each with its sha256); here each is
uploaded with BlobService.Put, committed into the attempt (and state.json) one by one, so a
restarted agent uploads only what is missing, and the attempt is reported Succeeded once every
output is in. Logs: logs/attempt.log streams to BlobService.AppendLog by offset while the attempt
runs, from the size the server already holds after any reconnect, and ends with an eof chunk once
the supervisor has finished (nothing writes the file after that).
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

import grpc

from nodus.v1 import blob_pb2

from . import layout as L
from .aio import wait_event
from .attempts import Attempt
from .backoff import Backoff
from .blobs import BlobClient, log_size_from_error
from .clock import Clock
from .reasons import Reason

if TYPE_CHECKING:
    from .runtime import ProcessRuntime
    from .table import AttemptTable

log = logging.getLogger("nodus.agent")

TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL}
"""Errors worth retrying for ever (the coordinator is away or busy)."""


class Stream(Protocol):
    connected: asyncio.Event
    """Set while a stream to the coordinator is open (the blob service is reachable)."""


class Ends(Protocol):
    """What shipping tells the agent."""

    shutting_down: bool

    def finish(self, att: Attempt, phase: str, reason: str, message: str = "", **fields: Any) -> None: ...

    def log_shipped(self, att: Attempt) -> None:
        """The log is in the blob store to its end (or can never be): the attempt may be forgotten."""
        ...


class Shipping:
    def __init__(self, runtime: "ProcessRuntime", blobs: BlobClient, stream: Stream, table: "AttemptTable",
                 ends: Ends, clock: Clock, reconnect_max: float) -> None:
        self.runtime = runtime
        self.blobs = blobs
        self.stream = stream
        self.table = table
        self.ends = ends
        self.clock = clock
        self.reconnect_max = reconnect_max

    def _stop_if_shutting_down(self) -> None:
        """grpc.aio reports a call cancelled with its task as CANCELLED: on shutdown that is no retry."""
        if self.ends.shutting_down:
            raise asyncio.CancelledError

    async def upload_outputs(self, att: Attempt) -> None:
        """Uploads what the supervisor collected, then reports Succeeded with every OutputCommit."""
        status = self.runtime.read_status(self.runtime.layout(att.id)) or {}
        fields = {k: status.get(k) for k in ("reason", "message", "finish_time")}
        done = {o["name"] for o in att.outputs}
        backoff = Backoff(base=0.2, cap=self.reconnect_max)
        for out in status.get("outputs") or []:
            if out["name"] in done:
                continue
            failures = 0
            while True:
                try:
                    await self.stream.connected.wait()
                    ref = await self.blobs.put(att.id, Path(out["file"]), out["sha256"], int(out["size"]),
                                               out.get("media_type", ""))
                    break
                except grpc.aio.AioRpcError as e:
                    self._stop_if_shutting_down()
                    if e.code() in TRANSIENT:
                        await asyncio.sleep(backoff.next())
                        continue
                    failures += 1
                    if failures >= 3:
                        self.ends.finish(att, L.LOST, Reason.AGENT_FAULT,
                                         f"output {out['name']} could not be uploaded: {e.code().name}: {e.details()}")
                        return
                    await asyncio.sleep(backoff.next())
                except OSError as e:
                    self.ends.finish(att, L.LOST, Reason.AGENT_FAULT, f"output {out['name']} could not be read: {e}")
                    return
            if ref.sha256 and ref.sha256 != out["sha256"]:
                self.ends.finish(att, L.LOST, Reason.AGENT_FAULT, f"output {out['name']}: the blob store computed "
                                 f"sha256 {ref.sha256}, the agent {out['sha256']}")
                return
            att.outputs.append({"name": out["name"], "path": out["path"], "sha256": out["sha256"],
                                "size": int(out["size"]), "uri": ref.uri or f"blob://sha256/{out['sha256']}",
                                "rank": int((att.gang or {}).get("rank") or 0), "archive": bool(out.get("archive"))})
            self.table.persist()
        self.ends.finish(att, L.SUCCEEDED, str(fields.get("reason") or Reason.COMPLETED),
                         str(fields.get("message") or ""), finish_time=fields.get("finish_time") or self.clock.now())

    async def ship_log(self, att: Attempt, wake: asyncio.Event, fresh: bool = False) -> None:
        """Streams logs/attempt.log with AppendLog by offset, resuming from the server's size; `wake` is
        set when there may be more to read (the watch loop's tick, the attempt's end). `fresh`: the
        attempt started in this agent process, so the server holds none of its log yet and the first
        append is from 0 without asking (one RPC less per attempt; a server that does hold some answers
        FAILED_PRECONDITION with its size, and shipping resumes from there)."""
        path = self.runtime.layout(att.id).log
        offset: int | None = 0 if fresh else None
        backoff = Backoff(base=0.2, cap=self.reconnect_max)
        while True:
            await self.stream.connected.wait()
            try:
                if offset is None:
                    offset = await self.blobs.log_size(att.id)
                await self.blobs.append_log(_log_chunks(att, path, offset, wake))
                self.ends.log_shipped(att)
                return
            except grpc.aio.AioRpcError as e:
                self._stop_if_shutting_down()
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("the coordinator has no BlobService.AppendLog; attempt %s's log stays local", att.id)
                    self.ends.log_shipped(att)
                    return
                if e.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # Node scope (ADR 0045): the attempt ended past the grace, or moved to another node.
                    log.warning("attempt %s: the coordinator takes no more of its log (%s); the rest stays local",
                                att.id, e.details())
                    self.ends.log_shipped(att)
                    return
                offset = log_size_from_error(e) if e.code() == grpc.StatusCode.FAILED_PRECONDITION else None
                if e.code() not in TRANSIENT and e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("attempt %s: log shipping failed: %s: %s", att.id, e.code().name, e.details())
                await asyncio.sleep(backoff.next())


async def _log_chunks(att: Attempt, path: Path, offset: int, wake: asyncio.Event) -> AsyncIterator[blob_pb2.LogChunk]:
    pos = offset
    while True:
        ended = att.supervisor_ended  # read before the size: nothing writes after the supervisor ends
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size > pos:
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read(min(size - pos, 1 << 20))
            yield blob_pb2.LogChunk(attempt_id=att.id, offset=pos, data=data)
            pos += len(data)
            continue
        if ended:
            yield blob_pb2.LogChunk(attempt_id=att.id, offset=pos, eof=True)
            return
        wake.clear()
        await wait_event(wake, 1.0)
