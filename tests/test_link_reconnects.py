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
from agent_double import restart_ports
from nodus.agent.link import CHANNEL_OPTIONS, Link
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2


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


class _Coordinator(agent_pb2_grpc.AgentServiceServicer):
    """Just enough AgentService for a link to connect: a session, then FullState on each stream."""

    def __init__(self, refuse: bool = False) -> None:
        self.connects = 0
        self.refuse = refuse

    async def Register(self, request: agent_pb2.RegisterRequest, context: Any) -> agent_pb2.RegisterResponse:
        return agent_pb2.RegisterResponse(node_id="node-1", session_id="s1", epoch=1)

    async def Connect(self, request_iterator: Any, context: Any) -> Any:
        self.connects += 1
        if self.refuse:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        await request_iterator.__anext__()  # Hello
        yield agent_pb2.CoordinatorMessage(seq=1, full_state=agent_pb2.FullState())
        async for _ in request_iterator:
            pass


async def _serve(port: int, servicer: _Coordinator) -> grpc.aio.Server:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server


def test_a_restarted_coordinator_is_reconnected_to_without_waiting_out_the_backoff() -> None:
    """The coordinator goes away and comes back on the same port while the link's backoff says a minute: the
    link reconnects once its channel does, not after the minute (before: the minute, however early it came
    back; in bench/fleet.py's storm the agents that had reached the 10 s cap came back up to 10 s late)."""
    async def scenario() -> int:
        port = restart_ports(1)
        servicer = _Coordinator()
        server = await _serve(port, servicer)
        link = Link(Node(), grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS), (),
                    f"127.0.0.1:{port}", backoff=Backoff(base=60.0, cap=60.0), clock=SystemClock(), tls=False)
        task = asyncio.create_task(link.run())
        try:
            await asyncio.wait_for(link.connected.wait(), 20)
            await server.stop(None)  # the restart: every stream ends, the port refuses
            await asyncio.wait_for(_until(lambda: not link.connected.is_set()), 20)
            await asyncio.sleep(1.0)  # down a while: the channel's own reconnects are refused meanwhile
            server = await _serve(port, servicer)
            await asyncio.wait_for(link.connected.wait(), 20)  # far less than the 30-60 s backoff
            assert not task.done()
            return servicer.connects
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await link.close()
            await server.stop(None)
    assert asyncio.run(scenario()) == 2


async def _until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


def test_a_coordinator_that_is_up_and_refuses_is_retried_only_after_the_backoff() -> None:
    """The shortcut is for a coordinator that was away: one that answers (its channel READY) and refuses the
    stream is not hammered; the link waits its whole backoff (30-60 s here) before the next Connect."""
    async def scenario() -> int:
        port = restart_ports(1)
        servicer = _Coordinator(refuse=True)
        server = await _serve(port, servicer)
        link = Link(Node(), grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS), (),
                    f"127.0.0.1:{port}", backoff=Backoff(base=60.0, cap=60.0), clock=SystemClock(), tls=False)
        task = asyncio.create_task(link.run())
        try:
            await asyncio.wait_for(_until(lambda: servicer.connects >= 1), 20)
            await asyncio.sleep(1.0)  # well inside the backoff: no second try may come
            assert not task.done()
            return servicer.connects
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await link.close()
            await server.stop(None)
    assert asyncio.run(scenario()) == 1
