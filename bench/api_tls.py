"""bench/api.py's TLS columns: what TLS and mTLS on gRPC cost, beside plaintext in the same run (ADR 0039, 0056).

Two more coordinators on loopback, controllers off: one with --grpc-insecure (plaintext, the anchor) and
one as deployed (TLS on the gRPC port, mTLS on the agent port). Rounds alternate the two sides, so drift
on a shared machine hits both alike; the best round of each counts. Per side:
- gRPC creates/s: ResourceService.Create of bench/api.py's ~2 KB Job, `concurrency` calls in flight on
  one channel (an operator's call: the operators' port is TLS without client certificates, so creates
  have no mTLS column);
- gRPC calls/s of a cheap operator call (ProjectService.ListProjects): plaintext vs TLS;
- agent heartbeats/s: `clients` nodes, each registered and holding its Connect stream as nodus-agent does,
  write a Heartbeat and wait for the LeaseRenewal the coordinator answers it with as it arrives (ADR 0049):
  the call every agent makes for as long as it runs. The plaintext coordinator's nodes authenticate with
  the join token, the deployed one's with their enrolled certificates over mTLS on the agent port; the
  coordinator's work behind it is the same (an in-memory beat, a renewal, an acknowledgement), so the
  difference is the transport and the authentication.
Beside each rate: the coordinator's CPU-seconds per 1,000 calls and the client's, which say on which side
a cost lies.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import grpc
import orjson
from google.protobuf import json_format, struct_pb2

from api_procs import cpu_seconds
from daemons import Coordinator, start_coordinator, stop_all
from nodus.agent.enrolment import agent_address
from nodus.agent.x509 import csr_pem, key_pem, new_key
from nodus.v1 import (agent_pb2, agent_pb2_grpc, common_pb2, project_pb2, project_pb2_grpc,
                      resource_pb2, resource_pb2_grpc)

TARGET_COST = 0.15
"""TLS may cost at most 15 % of plaintext's rate (issue 15)."""


@dataclass(slots=True)
class Rate:
    calls_per_s: float
    server_cpu_ms: float
    """The coordinator's CPU milliseconds per call."""
    client_cpu_ms: float


async def measure_rate(call: Callable[[], Awaitable[Any]], clients: int, seconds: float, server_pid: int) -> Rate:
    """Calls/s that `clients` concurrent loops of `call` sustain for `seconds`, with each side's CPU per call."""
    return await measure_each([call] * clients, seconds, server_pid)


async def measure_each(calls: Sequence[Callable[[], Awaitable[Any]]], seconds: float, server_pid: int) -> Rate:
    """Calls/s that one loop per call in `calls` sustains for `seconds` (a loop per stream, where each call
    is a round trip on its own stream), with each side's CPU per call."""
    done = 0
    stop = time.perf_counter() + seconds

    async def loop(call: Callable[[], Awaitable[Any]]) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await call()
            done += 1
    server0, client0 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
    started = time.perf_counter()
    await asyncio.gather(*(loop(call) for call in calls))
    wall = time.perf_counter() - started
    per = 1000.0 / max(done, 1)
    return Rate(done / wall, (cpu_seconds(server_pid) - server0) * per, (cpu_seconds(os.getpid()) - client0) * per)


class Beats:
    """One node's Connect stream, held as nodus-agent holds it; calling it is one heartbeat's round trip: a
    Heartbeat written, read up to the LeaseRenewal the coordinator answers it with (the acknowledgements the
    coordinator sends in between, the same on either side, are read past)."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.seq = 1

    @classmethod
    async def open(cls, channel: grpc.aio.Channel, node: str,
                   metadata: tuple[tuple[str, str], ...] | None = None) -> "Beats":
        """Registers `node` (an inventory of one CPU host), connects and says Hello; returns once FullState
        came, as an agent starts."""
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        reg = await stub.Register(agent_pb2.RegisterRequest(node_name=node, inventory=common_pb2.NodeInventory(
            host=common_pb2.HostInventory(cpus=8, memory_bytes=32 << 30, disk_bytes=1 << 40))),
            metadata=metadata, timeout=30)
        call = stub.Connect(metadata=metadata)
        await call.write(agent_pb2.AgentMessage(seq=1, hello=agent_pb2.Hello(
            node_id=reg.node_id, session_id=reg.session_id, epoch=reg.epoch)))
        beats = cls(call)
        await beats._until("full_state")
        return beats

    async def _until(self, kind: str) -> None:
        while True:
            message = await self.call.read()
            if message is grpc.aio.EOF:
                raise RuntimeError(f"the coordinator closed the Connect stream before {kind}: "
                                   f"{await self.call.code()} {await self.call.details()}")
            if message.WhichOneof("message") == kind:
                return

    async def __call__(self) -> None:
        self.seq += 1
        await self.call.write(agent_pb2.AgentMessage(seq=self.seq, heartbeat=agent_pb2.Heartbeat(
            disk_free_bytes=1 << 40)))
        await self._until("lease_renewal")

    def close(self) -> None:
        self.call.cancel()


async def enrol(target: str, ca: bytes, join_token: str, node: str) -> tuple[grpc.ChannelCredentials, str]:
    """A node enrolled with the join token over the TLS port at `target`: its mTLS channel credentials and
    the agent port's address, as nodus-agent enrols."""
    key = new_key()
    async with grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca)) as boot:
        answer = await agent_pb2_grpc.AgentServiceStub(boot).Enrol(agent_pb2.EnrolRequest(
            node_name=node, csr_pem=csr_pem(key, node)), metadata=_bearer(join_token), timeout=30)
    creds = grpc.ssl_channel_credentials(ca, key_pem(key), answer.certificate_pem.encode())
    return creds, agent_address(target, answer.agent_port)


@contextlib.asynccontextmanager
async def heartbeat_streams(plain: Coordinator, tls: Coordinator, nodes: int,
                            prefix: str) -> AsyncIterator[tuple[list[Beats], list[Beats]]]:
    """`nodes` agents' Connect streams on each coordinator, each node on its own channel: on the plaintext
    one with the join token, on the deployed one enrolled and over mTLS on the agent port."""
    ca = (tls.data / "tls" / "ca.crt").read_bytes()
    plain_join = _bearer((plain.data / "join-token").read_text().strip())
    tls_join = (tls.data / "join-token").read_text().strip()
    async with contextlib.AsyncExitStack() as stack:
        plain_beats, mtls_beats = [], []
        for i in range(nodes):
            name = f"{prefix}-{i}"
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(plain.grpc))
            plain_beats.append(await Beats.open(channel, name, plain_join))
            creds, address = await enrol(tls.grpc, ca, tls_join, name)
            channel = await stack.enter_async_context(grpc.aio.secure_channel(address, creds))
            mtls_beats.append(await Beats.open(channel, name))
        try:
            yield plain_beats, mtls_beats
        finally:
            for beats in plain_beats + mtls_beats:
                beats.close()


def answered(call: Callable[[], Awaitable[Any]], code: grpc.StatusCode) -> Callable[[], Awaitable[None]]:
    """The call, whose expected refusal (`code`) counts as its answer; any other error stops the bench."""
    async def one() -> None:
        try:
            await call()
        except grpc.aio.AioRpcError as e:
            if e.code() != code:
                raise
    return one


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _measure(plain: Coordinator, tls: Coordinator, job: Callable[[int], bytes], concurrency: int,
                   clients: int, seconds: float, rounds: int) -> list[dict[str, Rate]]:
    server_auth = grpc.ssl_channel_credentials((tls.data / "tls" / "ca.crt").read_bytes())
    pid = {"plain": plain.proc.pid, "tls": tls.proc.pid}
    seq = [0]

    def create_of(stub: resource_pb2_grpc.ResourceServiceStub, token: str) -> Callable[[], Awaitable[Any]]:
        meta = _bearer(token)

        def one() -> Awaitable[Any]:
            seq[0] += 1
            obj = struct_pb2.Struct()
            json_format.ParseDict(orjson.loads(job(seq[0])), obj)
            return stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=obj), metadata=meta)
        return one

    rows: list[dict[str, Rate]] = []
    async with grpc.aio.insecure_channel(plain.grpc) as p_op, grpc.aio.secure_channel(tls.grpc, server_auth) as t_op, \
            heartbeat_streams(plain, tls, clients, "bench-api-tls") as (p_beats, m_beats):
        p_res, t_res = resource_pb2_grpc.ResourceServiceStub(p_op), resource_pb2_grpc.ResourceServiceStub(t_op)
        p_list, t_list = project_pb2_grpc.ProjectServiceStub(p_op), project_pb2_grpc.ProjectServiceStub(t_op)
        listing = project_pb2.ListProjectsRequest()
        for call in (create_of(p_res, plain.token), create_of(t_res, tls.token),  # connect and warm up, uncounted
                     lambda: p_list.ListProjects(listing, metadata=_bearer(plain.token)),
                     lambda: t_list.ListProjects(listing, metadata=_bearer(tls.token))):
            await measure_rate(call, 2, min(seconds, 0.5), os.getpid())
        for beats in (p_beats, m_beats):
            await measure_each(beats, min(seconds, 0.5), os.getpid())
        for _ in range(rounds):
            rows.append({
                "creates plaintext": await measure_rate(create_of(p_res, plain.token), concurrency, seconds,
                                                        pid["plain"]),
                "creates TLS": await measure_rate(create_of(t_res, tls.token), concurrency, seconds, pid["tls"]),
                "operator plaintext": await measure_rate(lambda: p_list.ListProjects(listing,
                                                                                     metadata=_bearer(plain.token)),
                                                         clients, seconds, pid["plain"]),
                "operator TLS": await measure_rate(lambda: t_list.ListProjects(listing, metadata=_bearer(tls.token)),
                                                   clients, seconds, pid["tls"]),
                "agent plaintext": await measure_each(p_beats, seconds, pid["plain"]),
                "agent mTLS": await measure_each(m_beats, seconds, pid["tls"]),
            })
    return rows


def run(root: Path, job: Callable[[int], bytes], concurrency: int, clients: int, seconds: float,
        rounds: int) -> dict[str, Any]:
    """Starts the plaintext and the TLS coordinator under ROOT, measures, stops them; the figures and the load."""
    (root / "plain").mkdir(parents=True)
    (root / "tls").mkdir()
    load_before = os.getloadavg()
    plain = start_coordinator(root / "plain", "--grpc-insecure", "--controllers", "off")
    try:
        tls = start_coordinator(root / "tls", "--controllers", "off")
        try:
            rows = asyncio.run(_measure(plain, tls, job, concurrency, clients, seconds, rounds))
        finally:
            stop_all([tls.proc], [])
    finally:
        stop_all([plain.proc], [])
    best = {k: max((r[k] for r in rows), key=lambda x: x.calls_per_s) for k in rows[0]}
    return {"best": best, "rows": rows, "load": (load_before, os.getloadavg()), "concurrency": concurrency, "clients": clients,
            "seconds": seconds, "rounds": rounds}


PAIRS = (("gRPC creates/s", "creates TLS", "creates plaintext"),
         ("gRPC calls/s (operator)", "operator TLS", "operator plaintext"),
         ("agent heartbeats/s", "agent mTLS", "agent plaintext"))


def report_lines(tls: dict[str, Any]) -> list[str]:
    """The TLS section of bench/api.py's report: each TLS figure beside its plaintext anchor, its cost, the verdict."""
    best: dict[str, Rate] = tls["best"]
    before, after = tls["load"]
    out = [f"TLS on gRPC: best of {tls['rounds']} alternating rounds of {tls['seconds']:g}s; creates "
           f"{tls['concurrency']} in flight, calls {tls['clients']} clients, one channel each side; load average "
           f"before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}"]
    widths = [26, 16, 22, 14, 10, 30]
    header = ("figure", "with TLS", "anchor", "anchor value", "cost", "CPU ms/call server, client")
    out.append("".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    verdicts = []
    for figure, label, anchor in PAIRS:
        t, a = best[label], best[anchor]
        cost = 1 - t.calls_per_s / a.calls_per_s if a.calls_per_s else 0.0
        row = (f"{figure}", f"{t.calls_per_s:,.0f} ({label.split()[-1]})", f"{anchor}", f"{a.calls_per_s:,.0f}/s",
               f"{cost * 100:.1f} %",
               f"{t.server_cpu_ms:.3f}, {t.client_cpu_ms:.3f} vs {a.server_cpu_ms:.3f}, {a.client_cpu_ms:.3f}")
        out.append("".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
        verdicts.append(f"{label} costs <= {TARGET_COST * 100:.0f} %: {'met' if cost <= TARGET_COST else 'NOT met'} "
                        f"({cost * 100:.1f} %)")
    out.append("TLS targets: " + "; ".join(verdicts))
    cpu = [f"{label} {(best[label].server_cpu_ms / best[anchor].server_cpu_ms - 1) * 100:+.1f} %"
           for _, label, anchor in PAIRS if best[anchor].server_cpu_ms]
    out.append("coordinator CPU per call beside plaintext (less sensitive to a loaded machine than rates): "
               + ", ".join(cpu))
    out.append("raw rounds (calls/s): " + "; ".join(
        ", ".join(f"{k} {r[k].calls_per_s:,.0f}" for k in r) for r in tls["rows"]))
    return out
