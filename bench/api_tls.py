"""bench/api.py's TLS columns: what TLS and mTLS on gRPC cost, beside plaintext in the same run (ADR 0039, 0056).

Two more coordinators on loopback, controllers off: one with --grpc-insecure (plaintext, the anchor) and
one as deployed (TLS on the gRPC port, mTLS on the agent port). Rounds alternate the two sides, so drift
on a shared machine hits both alike; the best round of each counts. Per side:
- gRPC creates/s: ResourceService.Create of bench/api.py's ~2 KB Job, `concurrency` calls in flight on
  one channel (an operator's call: the operators' port is TLS without client certificates, so creates
  have no mTLS column);
- gRPC calls/s of a cheap operator call (ProjectService.ListProjects): plaintext vs TLS;
- gRPC calls/s of an agent call (BlobService.Stat of a digest nobody stored) with the join token on the
  plaintext coordinator vs an enrolled node's certificate on the agent port (mTLS). The mTLS side is
  answered PermissionDenied by NodeScope after its certificate is checked, the plaintext side NotFound:
  neither touches the disk, so the difference is transport and authentication.
Beside each rate: the coordinator's CPU-seconds per 1,000 calls and the client's, which say on which side
a cost lies.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc
import orjson
from google.protobuf import json_format, struct_pb2

from api_procs import cpu_seconds
from daemons import Coordinator, start_coordinator, stop_all
from nodus.agent.enrolment import agent_address, csr_pem, key_pem, new_key
from nodus.v1 import (agent_pb2, agent_pb2_grpc, blob_pb2, blob_pb2_grpc, project_pb2, project_pb2_grpc,
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
    done = 0
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await call()
            done += 1
    server0, client0 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    wall = time.perf_counter() - started
    per = 1000.0 / max(done, 1)
    return Rate(done / wall, (cpu_seconds(server_pid) - server0) * per, (cpu_seconds(os.getpid()) - client0) * per)


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
    ca = (tls.data / "tls" / "ca.crt").read_bytes()
    server_auth = grpc.ssl_channel_credentials(ca)
    key = new_key()
    async with grpc.aio.secure_channel(tls.grpc, server_auth) as boot:
        answer = await agent_pb2_grpc.AgentServiceStub(boot).Enrol(agent_pb2.EnrolRequest(
            node_name="bench-api-tls", csr_pem=csr_pem(key, "bench-api-tls")),
            metadata=_bearer((tls.data / "join-token").read_text().strip()), timeout=30)
    node_creds = grpc.ssl_channel_credentials(ca, key_pem(key), answer.certificate_pem.encode())
    plain_join = _bearer((plain.data / "join-token").read_text().strip())
    digest = hashlib.sha256(b"a blob nobody stored").hexdigest()
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
            grpc.aio.insecure_channel(plain.grpc) as p_ag, \
            grpc.aio.secure_channel(agent_address(tls.grpc, answer.agent_port), node_creds) as m_ag:
        p_res, t_res = resource_pb2_grpc.ResourceServiceStub(p_op), resource_pb2_grpc.ResourceServiceStub(t_op)
        p_list, t_list = project_pb2_grpc.ProjectServiceStub(p_op), project_pb2_grpc.ProjectServiceStub(t_op)
        p_stat, m_stat = blob_pb2_grpc.BlobServiceStub(p_ag), blob_pb2_grpc.BlobServiceStub(m_ag)
        stat = blob_pb2.StatBlobRequest(sha256=digest)
        listing = project_pb2.ListProjectsRequest()
        for call in (create_of(p_res, plain.token), create_of(t_res, tls.token),  # connect and warm up, uncounted
                     lambda: p_list.ListProjects(listing, metadata=_bearer(plain.token)),
                     lambda: t_list.ListProjects(listing, metadata=_bearer(tls.token)),
                     answered(lambda: p_stat.Stat(stat, metadata=plain_join), grpc.StatusCode.NOT_FOUND),
                     answered(lambda: m_stat.Stat(stat), grpc.StatusCode.PERMISSION_DENIED)):
            await measure_rate(call, 2, min(seconds, 0.5), os.getpid())
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
                "agent plaintext": await measure_rate(answered(lambda: p_stat.Stat(stat, metadata=plain_join),
                                                                grpc.StatusCode.NOT_FOUND), clients, seconds,
                                                      pid["plain"]),
                "agent mTLS": await measure_rate(answered(lambda: m_stat.Stat(stat),
                                                           grpc.StatusCode.PERMISSION_DENIED), clients, seconds,
                                                 pid["tls"]),
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
         ("gRPC calls/s (agent)", "agent mTLS", "agent plaintext"))


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
