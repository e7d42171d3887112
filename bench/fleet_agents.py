"""The simulated agents of bench/fleet.py: many nodes in one process, each speaking AgentService through the
real agent's own Link (agent/nodus/agent/link.py), so what reaches the coordinator is what nodus-agent sends.

Each node enrols once (a key made here, a CSR, the join token over the TLS port; the certificate and key kept
in its identity directory as nodus-agent keeps them), then its Link registers with a simulated inventory,
opens Connect over mTLS on the agent port, says Hello with its full state, heartbeats every
heartbeat_interval with its GPUs' readings, acks what it is told and reconnects with the agent's backoff
when the stream breaks. The node runs nothing: an assignment is reported Running at once and Succeeded
after a short time (the Job's env FLEET_RUN_SECONDS, else the bench's --run-seconds); a Cancel or an
attempt FullState no longer names ends it Cancelled. The agent side timestamps each assignment's first
receipt on CLOCK_MONOTONIC (system-wide, so the bench process compares it with the create's 201).

`worker_main` runs one process of them and answers the bench over a Pipe (the commands are in `_serve`).
The anchor (`anchor_server_main`, `_anchor_streams`) is a bare grpc.aio AgentService that answers each
Heartbeat with a LeaseRenewal and nothing else, driven by the same nodes' certificates over mTLS at the
same heartbeat interval: what the gRPC stack alone costs for that heartbeat rate.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, AsyncIterator

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from nodus.agent.backoff import Backoff
from nodus.agent.clock import SystemClock
from nodus.agent.enrolment import NodeCredentials
from nodus.agent.link import CHANNEL_OPTIONS, Link, open_channel
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = logging.getLogger("nodus.bench.fleet")

RUN_ENV = "FLEET_RUN_SECONDS"
RUNNING = common_pb2.ATTEMPT_PHASE_RUNNING
SUCCEEDED = common_pb2.ATTEMPT_PHASE_SUCCEEDED
CANCELLED = common_pb2.ATTEMPT_PHASE_CANCELLED
GPU_MODEL = "NVIDIA H100 80GB HBM3"
LAG_TICK = 0.1
"""The event loop's lag is sampled as the overshoot of a sleep of this length."""


def stamp(t: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


@dataclass(slots=True)
class SimAttempt:
    """One attempt as the node reports it."""

    id: str
    phase: common_pb2.AttemptPhase
    start: float
    finish: float | None = None
    reason: str = ""
    exit_code: int | None = None
    terminal_seq: tuple[int, int] | None = None
    """(stream, seq) of the message that reported its end; dropped once the coordinator acks it."""
    timer: asyncio.TimerHandle | None = None

    @property
    def terminal(self) -> bool:
        return self.phase != RUNNING

    def update(self) -> agent_pb2.AttemptUpdate:
        u = agent_pb2.AttemptUpdate(attempt_id=self.id, phase=self.phase, reason=self.reason, time=stamp(time.time()),
                                    start_time=stamp(self.start), inputs_ready_time=stamp(self.start))
        if self.exit_code is not None:
            u.exit_code = self.exit_code
        if self.finish is not None:
            u.finish_time.CopyFrom(stamp(self.finish))
        return u


class SimNode:
    """link.Node for a host that runs nothing: what its Hello says and what each message does."""

    def __init__(self, name: str, gpus: int, run_seconds: float) -> None:
        self.node_name = name
        self.run_seconds = run_seconds
        self.link: Link | None = None
        self._gpus = [common_pb2.Gpu(index=i, name=GPU_MODEL, uuid=f"GPU-fleet-{name}-{i}", memory_bytes=80 << 30,
                                     simulated=True) for i in range(gpus)]
        self.attempts: dict[str, SimAttempt] = {}
        self.ended: set[str] = set()
        """Attempts whose end the coordinator acknowledged (a repeated assignment gets the end again)."""
        self.received: dict[str, tuple[str, float]] = {}
        """attempt id → (Job name, monotonic time its assignment first arrived)."""
        self.stream = 0
        self.full_state = False
        self.hello_acked = False
        self.synced_at = 0.0
        """Monotonic time the current stream was re-synchronised: FullState in and the Hello acknowledged."""
        self.measuring = False
        """Set by the storm's resync: only the stream a node is on when it is counted re-synchronises it."""

    # -- link.Node --------------------------------------------------------------------------------
    def inventory(self) -> common_pb2.NodeInventory:
        return common_pb2.NodeInventory(
            hostname=self.node_name, agent_version="bench-fleet", runtimes=[common_pb2.RUNTIME_PROCESS],
            region_class="us", host=common_pb2.HostInventory(cpus=64, memory_bytes=512 << 30, disk_bytes=4 << 40),
            gpus=self._gpus)

    def gpus(self) -> list[common_pb2.Gpu]:
        return self._gpus

    def disk_free(self) -> int:
        return 2 << 40

    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello:
        self.stream, self.full_state, self.hello_acked = stream_id, False, False
        if self.synced_at >= 0 and self.measuring:
            self.synced_at = -1.0  # synced on a stream that ended (the stopping coordinator's): not yet
        hello = agent_pb2.Hello(node_id=session.node_id, session_id=session.session_id, epoch=session.epoch)
        for att in self.attempts.values():
            hello.attempts.add(status=att.update())
            if att.terminal:
                att.terminal_seq = (stream_id, hello_seq)
        return hello

    def on_message(self, msg: agent_pb2.CoordinatorMessage, stream_id: int) -> None:
        kind = msg.WhichOneof("message")
        if kind == "full_state":
            wanted = {a.attempt_id for a in msg.full_state.assignments}
            for a in msg.full_state.assignments:
                self._accept(a)
            for c in msg.full_state.cancels:
                self._stop(c.attempt_id, c.reason)
                wanted.discard(c.attempt_id)
            for attempt_id in [i for i, a in self.attempts.items() if not a.terminal and i not in wanted]:
                self._stop(attempt_id, "Unassigned")
            self.full_state = True
            self._synced()
        elif kind == "assignment":
            self._accept(msg.assignment)
        elif kind == "cancel":
            self._stop(msg.cancel.attempt_id, msg.cancel.reason)
        elif kind == "ack" and stream_id == self.stream:
            self.hello_acked = True
            for attempt_id in [i for i, a in self.attempts.items()
                               if a.terminal_seq is not None and a.terminal_seq[0] == stream_id
                               and a.terminal_seq[1] <= msg.ack.seq]:
                del self.attempts[attempt_id]
                self.ended.add(attempt_id)
            self._synced()

    # -- the simulated attempts -------------------------------------------------------------------
    def _synced(self) -> None:
        if self.full_state and self.hello_acked and self.synced_at < 0:
            self.synced_at = time.monotonic()
            log.info("node %s re-synchronised (stream %d): %d attempts running", self.node_name, self.stream,
                     sum(1 for a in self.attempts.values() if not a.terminal))

    def _accept(self, a: agent_pb2.Assignment) -> None:
        if a.attempt_id in self.attempts:
            return  # a repeated assignment is a no-op
        if a.attempt_id in self.ended:
            self._report(SimAttempt(a.attempt_id, SUCCEEDED, time.time(), time.time(), "Completed", 0))
            return
        self.received.setdefault(a.attempt_id, (a.job.name, time.monotonic()))
        att = SimAttempt(a.attempt_id, RUNNING, time.time())
        self.attempts[a.attempt_id] = att
        self._report(att)
        run = float(a.env.get(RUN_ENV) or self.run_seconds)
        att.timer = asyncio.get_running_loop().call_later(run, self._finish, att)

    def _finish(self, att: SimAttempt) -> None:
        if att.terminal:
            return
        att.phase, att.reason, att.exit_code, att.finish = SUCCEEDED, "Completed", 0, time.time()
        self._report(att)

    def _stop(self, attempt_id: str, reason: str) -> None:
        att = self.attempts.get(attempt_id)
        if att is None or att.terminal:
            return
        if att.timer is not None:
            att.timer.cancel()
        att.phase, att.reason, att.exit_code, att.finish = CANCELLED, reason or "Cancelled", 143, time.time()
        self._report(att)

    def _report(self, att: SimAttempt) -> None:
        assert self.link is not None
        seq = self.link.send(attempt_update=att.update())
        if seq is not None and att.terminal:
            att.terminal_seq = (self.link.stream_id, seq)


# -- one process of nodes ---------------------------------------------------------------------------
def worker_main(conn: Connection, cfg: dict[str, Any]) -> None:
    # A thousand links each saying once that the coordinator went away is noise on the terminal; errors still
    # show. With --agent-log DIR every link's story goes to a file at INFO (why a node did not come back).
    logging.basicConfig(level=logging.INFO if cfg.get("log_file") else logging.ERROR, filename=cfg.get("log_file"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_worker(conn, cfg))


class _Lag:
    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            self.samples.append(time.monotonic() - t0 - LAG_TICK)

    def take(self) -> float:
        """The p99 lag since the last take, in seconds."""
        got, self.samples = sorted(self.samples), []
        return got[min(len(got) - 1, int(0.99 * len(got)))] if got else 0.0


async def _enrol(stub: agent_pb2_grpc.AgentServiceStub, md: Any, creds: NodeCredentials, name: str,
                 gate: asyncio.Semaphore) -> float:
    """As the Link enrols (a key, its CSR, Enrol with the join token, the answer saved): seconds it took."""
    async with gate:
        t0 = time.monotonic()
        answer = await stub.Enrol(agent_pb2.EnrolRequest(node_name=name, csr_pem=creds.csr(name)), metadata=md,
                                  timeout=300)
        creds.save(answer)
        return time.monotonic() - t0


async def _worker(conn: Connection, cfg: dict[str, Any]) -> None:
    ca = Path(cfg["ca"]).read_bytes()
    root = Path(cfg["identity_root"])
    # Each node talks to its own coordinator (with several replicas, the nodes are spread over them).
    target = dict(zip(cfg["names"], cfg["targets"]))
    bootstraps = {t: open_channel(t, token, ca) for t, token in zip(cfg["targets"], cfg["tokens"])}
    nodes = [SimNode(name, cfg["gpus"], cfg["run_seconds"]) for name in cfg["names"]]
    creds = {n.node_name: NodeCredentials(root / n.node_name, ca) for n in nodes}
    lag = _Lag()
    tasks = [asyncio.create_task(lag.run())]
    gate = asyncio.Semaphore(cfg["enrol_concurrency"])
    took = await asyncio.gather(*(
        _enrol(agent_pb2_grpc.AgentServiceStub(bootstraps[target[n.node_name]][0]), bootstraps[target[n.node_name]][1],
               creds[n.node_name], n.node_name, gate) for n in nodes))
    conn.send(("enrolled", list(took)))
    loop = asyncio.get_running_loop()
    anchor: list[asyncio.Task[None]] = []
    while True:
        command, *rest = await loop.run_in_executor(None, conn.recv)
        if command == "anchor":
            echo, interval = rest
            anchor = [asyncio.create_task(_anchor_stream(echo, creds[n.node_name], n, interval)) for n in nodes]
            conn.send(("ok",))
        elif command == "anchor_stop":
            for t in anchor:
                t.cancel()
            await asyncio.gather(*anchor, return_exceptions=True)
            conn.send(("ok",))
        elif command == "join":
            for n in nodes:
                n.synced_at = -1.0
                bootstrap, md = bootstraps[target[n.node_name]]
                n.link = Link(n, bootstrap, md, target[n.node_name], backoff=Backoff(base=0.2, cap=10.0),
                              clock=SystemClock(), tls=True, identity_dir=root / n.node_name, coordinator_ca=ca)
                tasks.append(asyncio.create_task(n.link.run()))
            conn.send(("ok",))
        elif command == "status":
            conn.send(({"connected": sum(1 for n in nodes if n.link is not None and n.link.connected.is_set()),
                        "received": sum(len(n.received) for n in nodes),
                        "live": sum(1 for n in nodes for a in n.attempts.values() if not a.terminal),
                        "ended": sum(len(n.ended) for n in nodes)},))
        elif command == "resync":
            for n in nodes:  # the next stream's FullState and its Hello's ack set it
                n.synced_at, n.full_state, n.hello_acked, n.measuring = -1.0, False, False, True
            conn.send(("ok",))
        elif command == "synced":
            times = [n.synced_at for n in nodes if n.synced_at >= 0 and n.link is not None and n.link.connected.is_set()]
            conn.send((len(times), max(times, default=0.0)))
        elif command == "receipts":
            conn.send(([job_t for n in nodes for job_t in n.received.values()],))
        elif command == "lag":
            conn.send((lag.take(),))
        elif command == "stop":
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            conn.send(("ok",))
            return


# -- the anchor: a bare grpc.aio AgentService -------------------------------------------------------
async def _anchor_stream(target: str, creds: NodeCredentials, node: SimNode, interval: float) -> None:
    """One node's Connect to the anchor server: Hello, then a Heartbeat every `interval` (the phase drawn at
    random, as agents that joined at different times heartbeat), replies read and dropped."""
    cert = creds.load()
    assert cert is not None
    async with grpc.aio.secure_channel(target, creds.channel_credentials(cert), options=CHANNEL_OPTIONS) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await call.write(agent_pb2.AgentMessage(seq=1, hello=agent_pb2.Hello(node_id=node.node_name)))

        async def drain() -> None:
            while await call.read() is not grpc.aio.EOF:
                pass
        reader = asyncio.create_task(drain())
        try:
            await asyncio.sleep(random.uniform(0, interval))
            seq = 1
            while True:
                seq += 1
                await call.write(agent_pb2.AgentMessage(seq=seq, heartbeat=agent_pb2.Heartbeat(
                    time=stamp(time.time()), gpus=node.gpus(), disk_free_bytes=node.disk_free())))
                await asyncio.sleep(interval)
        finally:
            reader.cancel()
            call.cancel()


class _EchoAgents(agent_pb2_grpc.AgentServiceServicer):
    async def Connect(self, request_iterator: AsyncIterator[agent_pb2.AgentMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        seq = 0
        async for message in request_iterator:
            seq += 1
            if message.WhichOneof("message") == "heartbeat":
                yield agent_pb2.CoordinatorMessage(seq=seq, lease_renewal=agent_pb2.LeaseRenewal(
                    valid_for={"seconds": 15}, expire_time=stamp(time.time() + 15)))
            else:
                yield agent_pb2.CoordinatorMessage(seq=seq, ack=agent_pb2.Ack(seq=message.seq))


def anchor_server_main(conn: Connection, tls_dir: str) -> None:
    """Serves the echo AgentService over mTLS with the coordinator's own serving certificate and CA."""
    async def serve() -> None:
        d = Path(tls_dir)
        creds = grpc.ssl_server_credentials([((d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes())],
                                            root_certificates=(d / "ca.crt").read_bytes(),
                                            require_client_auth=True)
        server = grpc.aio.server(options=CHANNEL_OPTIONS)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(_EchoAgents(), server)
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        conn.send(f"127.0.0.1:{port}")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await server.stop(None)
    asyncio.run(serve())
