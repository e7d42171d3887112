"""The agent's link never stops reconnecting, whatever ends a stream (issue 14's reconnect storm).

During a coordinator restart under load, a stream can end in ways that are not an AioRpcError: grpc.aio
raises `asyncio.InvalidStateError` from a write on a call the coordinator already ended (a restart, a
superseded stream), and `asyncio.CancelledError` from a call whose channel was closed under it. Before
the fix either escaped Link.run, its task ended, and the node never came back: its lease expired, its
attempts were replaced elsewhere while the originals ran on (1,002 long attempts for 1,000 Jobs in
bench/fleet.py's storm). Here the real Link runs against a stub whose streams end in each of those ways,
then one that answers FullState: the link must reach it, and still be running.
"""
from __future__ import annotations

import asyncio
from typing import Any

import grpc

from nodus.agent.backoff import Backoff
from nodus.agent.clock import SystemClock
from nodus.agent.link import Link
from nodus.v1 import agent_pb2, common_pb2


class Node:
    node_name = "n1"

    def __init__(self) -> None:
        self.messages: list[str] = []

    def inventory(self) -> common_pb2.NodeInventory:
        return common_pb2.NodeInventory(hostname="n1")

    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello:
        return agent_pb2.Hello(node_id=session.node_id, session_id=session.session_id, epoch=session.epoch)

    def on_message(self, msg: agent_pb2.CoordinatorMessage, stream_id: int) -> None:
        self.messages.append(msg.WhichOneof("message"))

    def gpus(self) -> list[common_pb2.Gpu]:
        return []

    def disk_free(self) -> int:
        return 0


class Call:
    """One Connect call as grpc.aio's StreamStreamCall looks to the link."""

    def __init__(self, ending: str) -> None:
        self.ending = ending
        self.said = asyncio.Event()
        self.sent = False

    async def write(self, message: agent_pb2.AgentMessage) -> None:
        if self.ending == "write after the end":
            raise asyncio.InvalidStateError("RPC already finished.")
        self.said.set()

    async def read(self) -> Any:
        if self.ending == "write after the end":
            await asyncio.Event().wait()  # the reader has not seen the end yet
        if self.ending == "cancelled under it":
            raise asyncio.CancelledError()  # grpc.aio: the call was cancelled locally (its channel closed)
        if self.ending == "aborted":
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "Internal error from Core")
        await self.said.wait()
        if not self.sent:
            self.sent = True
            return agent_pb2.CoordinatorMessage(seq=1, full_state=agent_pb2.FullState())
        await asyncio.Event().wait()  # stays open
        return None

    def cancel(self) -> bool:
        return True


class Stub:
    def __init__(self, endings: list[str]) -> None:
        self.endings = endings
        self.connects = 0
        self.registers = 0

    async def Register(self, request: agent_pb2.RegisterRequest, **_: Any) -> agent_pb2.RegisterResponse:
        self.registers += 1
        return agent_pb2.RegisterResponse(node_id="node-1", session_id="s1", epoch=1)

    def Connect(self, **_: Any) -> Call:
        ending = self.endings[min(self.connects, len(self.endings) - 1)]
        self.connects += 1
        return Call(ending)


async def _run(endings: list[str]) -> tuple[Link, Stub, Node, bool]:
    node = Node()
    link = _link(node)
    stub = Stub(endings)
    link.stub = stub  # type: ignore[assignment]
    task = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 10)
        alive = not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()
    return link, stub, node, alive


def _link(node: Node) -> Link:
    """The real Link; its stub is replaced, so the channel (never connected) carries nothing."""
    return Link(node, grpc.aio.insecure_channel("127.0.0.1:9"), (), "127.0.0.1:9",
                backoff=Backoff(base=0.001, cap=0.002), clock=SystemClock(), tls=False)


def test_a_write_on_a_stream_the_coordinator_ended_reconnects() -> None:
    link, stub, node, alive = asyncio.run(_run(["write after the end", "open"]))
    assert alive and link.connected.is_set() is False  # cleared when the task stopped
    assert stub.connects == 2 and stub.registers == 1  # the same session: Connect again, no Register
    assert node.messages == ["full_state"]


def test_a_stream_cancelled_under_the_link_reconnects_and_the_link_still_stops_when_told() -> None:
    _, stub, node, alive = asyncio.run(_run(["cancelled under it", "aborted", "cancelled under it", "open"]))
    assert alive and stub.connects == 4
    assert node.messages == ["full_state"]


def test_the_link_ends_when_its_task_is_cancelled() -> None:
    async def scenario() -> bool:
        link = _link(Node())
        link.stub = Stub(["open"])  # type: ignore[assignment]
        task = asyncio.create_task(link.run())
        await asyncio.wait_for(link.connected.wait(), 10)
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        await link.close()
        return task.cancelled()
    assert asyncio.run(scenario())
