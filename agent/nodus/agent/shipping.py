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
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

import grpc

from nodus.v1 import blob_pb2

from . import layout as L
from .aio import wait_event
from .attempts import Attempt
from .backoff import Backoff
from .blobs import log_size_from_error

if TYPE_CHECKING:
    from .daemon import Agent

log = logging.getLogger("nodus.agent")

TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL}
"""Errors worth retrying for ever (the coordinator is away or busy)."""


def _stop_if_shutting_down(agent: "Agent") -> None:
    """grpc.aio reports a call cancelled with its task as CANCELLED: on shutdown that is no retry."""
    if agent.shutting_down:
        raise asyncio.CancelledError


async def upload_outputs(agent: "Agent", att: Attempt) -> None:
    """Uploads what the supervisor collected, then reports Succeeded with every OutputCommit."""
    status = agent.runtime.read_status(agent.runtime.layout(att.id)) or {}
    fields = {k: status.get(k) for k in ("reason", "message", "finish_time")}
    done = {o["name"] for o in att.outputs}
    backoff = Backoff(base=0.2, cap=agent.cfg.reconnect_max)
    for out in status.get("outputs") or []:
        if out["name"] in done:
            continue
        failures = 0
        while True:
            try:
                await agent.link.connected.wait()
                ref = await agent.link.blobs.put(Path(out["file"]), out["sha256"], int(out["size"]),
                                                out.get("media_type", ""))
                break
            except grpc.aio.AioRpcError as e:
                _stop_if_shutting_down(agent)
                if e.code() in TRANSIENT:
                    await asyncio.sleep(backoff.next())
                    continue
                failures += 1
                if failures >= 3:
                    agent.finish(att, L.LOST, "AgentFault", f"output {out['name']} could not be uploaded: "
                                                          f"{e.code().name}: {e.details()}")
                    return
                await asyncio.sleep(backoff.next())
            except OSError as e:
                agent.finish(att, L.LOST, "AgentFault", f"output {out['name']} could not be read: {e}")
                return
        if ref.sha256 and ref.sha256 != out["sha256"]:
            agent.finish(att, L.LOST, "AgentFault", f"output {out['name']}: the blob store computed sha256 "
                                                  f"{ref.sha256}, the agent {out['sha256']}")
            return
        att.outputs.append({"name": out["name"], "path": out["path"], "sha256": out["sha256"],
                            "size": int(out["size"]), "uri": ref.uri or f"blob://sha256/{out['sha256']}",
                            "rank": int((att.gang or {}).get("rank") or 0)})
        agent.persist()
    agent.finish(att, L.SUCCEEDED, str(fields.get("reason") or "Completed"), str(fields.get("message") or ""),
                finish_time=fields.get("finish_time") or time.time())

async def ship_log(agent: "Agent", att: Attempt) -> None:
    """Streams logs/attempt.log with AppendLog by offset, resuming from the server's size."""
    path = agent.runtime.layout(att.id).log
    offset: int | None = None
    backoff = Backoff(base=0.2, cap=agent.cfg.reconnect_max)
    while True:
        await agent.link.connected.wait()
        try:
            if offset is None:
                offset = await agent.link.blobs.log_size(att.id)
            await agent.link.blobs.append_log(_log_chunks(agent, att, path, offset))
            att.log_done = True
            agent._forget_done()
            return
        except grpc.aio.AioRpcError as e:
            _stop_if_shutting_down(agent)
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("the coordinator has no BlobService.AppendLog; attempt %s's log stays local", att.id)
                att.log_done = True
                agent._forget_done()
                return
            offset = log_size_from_error(e) if e.code() == grpc.StatusCode.FAILED_PRECONDITION else None
            if e.code() not in TRANSIENT and e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                log.warning("attempt %s: log shipping failed: %s: %s", att.id, e.code().name, e.details())
            await asyncio.sleep(backoff.next())

async def _log_chunks(agent: "Agent", att: Attempt, path: Path, offset: int) -> AsyncIterator[blob_pb2.LogChunk]:
    v = agent.volatile[att.id]
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
        v.log_wake.clear()
        await wait_event(v.log_wake, 1.0)
