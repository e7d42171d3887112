"""What TLS and mTLS cost a gRPC call (ADR 0039), beside plaintext in the same run.

Two real coordinators on loopback, one with --grpc-insecure (plaintext, the anchor) and one as
deployed (TLS on the gRPC port, mTLS on the agent port). On each, N concurrent clients on one channel
each make unary calls for a fixed time:
- an operator call (ProjectService.ListProjects with the admin token): plaintext vs TLS;
- the agent's call (bench/api_tls.py's Beats): N registered nodes each holding its Connect stream write a
  Heartbeat and wait for its LeaseRenewal; plaintext with the join token vs mTLS with enrolled nodes'
  certificates on the agent port. The coordinator does the same work on either side, so the difference is
  the transport and the authentication, which is what the figure is for.
It also times a fresh connection's first call (the handshake) on each: for the agent port, a BlobService.Stat
that NodeScope refuses once the certificate is checked (the node holds no attempt). Target: TLS costs at
most 15 % of plaintext calls/s.

    .venv/bin/python bench/grpc_tls.py [--seconds 5] [--clients 8] [--tiny] [--save]
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc
import orjson

import record
from api_tls import answered, enrol, heartbeat_streams, measure_each
from daemons import Coordinator, start_coordinator, stop_all
from nodus.v1 import blob_pb2, blob_pb2_grpc, project_pb2, project_pb2_grpc


async def rate(call: Callable[[], Awaitable[Any]], clients: int, seconds: float) -> float:
    """Calls per second that `clients` concurrent loops of `call` sustain for `seconds`."""
    return (await measure_each([call] * clients, seconds, os.getpid())).calls_per_s


async def first_call_ms(open_channel: Callable[[], grpc.aio.Channel], call: Callable[[grpc.aio.Channel],
                        Awaitable[Any]], tries: int) -> float:
    """The median time of a new channel's first call (connect, handshake, call)."""
    times = []
    for _ in range(tries):
        channel = open_channel()
        started = time.perf_counter()
        await call(channel)
        times.append((time.perf_counter() - started) * 1000)
        await channel.close()
    return statistics.median(times)


def _join(c: Coordinator) -> str:
    return (c.data / "join-token").read_text().strip()


async def measure(plain: Coordinator, tls: Coordinator, args: argparse.Namespace) -> None:
    ca = (tls.data / "tls" / "ca.crt").read_bytes()
    admin = (("authorization", f"Bearer {plain.token}"),), (("authorization", f"Bearer {tls.token}"),)
    server_auth = grpc.ssl_channel_credentials(ca)

    # An enrolled node on the TLS coordinator for the handshake's timing, and a digest nobody stores.
    node_creds, agent_port = await enrol(tls.grpc, ca, _join(tls), "bench-tls")
    digest = hashlib.sha256(b"a blob nobody stored").hexdigest()

    rows = []
    async with grpc.aio.insecure_channel(plain.grpc) as p_op, grpc.aio.secure_channel(tls.grpc, server_auth) as t_op, \
            heartbeat_streams(plain, tls, args.clients, "bench-grpc-tls") as (p_beats, m_beats):
        p_list, t_list = project_pb2_grpc.ProjectServiceStub(p_op), project_pb2_grpc.ProjectServiceStub(t_op)
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both alike
            rows.append({
                "operator plaintext": await rate(lambda: p_list.ListProjects(project_pb2.ListProjectsRequest(),
                                                                             metadata=admin[0]), args.clients,
                                                 args.seconds),
                "operator TLS": await rate(lambda: t_list.ListProjects(project_pb2.ListProjectsRequest(),
                                                                       metadata=admin[1]), args.clients, args.seconds),
                "agent plaintext": (await measure_each(p_beats, args.seconds, plain.proc.pid)).calls_per_s,
                "agent mTLS": (await measure_each(m_beats, args.seconds, tls.proc.pid)).calls_per_s,
            })
    first = {
        "operator plaintext": await first_call_ms(lambda: grpc.aio.insecure_channel(plain.grpc), lambda ch: (
            project_pb2_grpc.ProjectServiceStub(ch).ListProjects(project_pb2.ListProjectsRequest(), metadata=admin[0])),
            args.tries),
        "operator TLS": await first_call_ms(lambda: grpc.aio.secure_channel(tls.grpc, server_auth), lambda ch: (
            project_pb2_grpc.ProjectServiceStub(ch).ListProjects(project_pb2.ListProjectsRequest(), metadata=admin[1])),
            args.tries),
        "agent mTLS": await first_call_ms(lambda: grpc.aio.secure_channel(agent_port, node_creds), lambda ch: (
            answered(lambda: blob_pb2_grpc.BlobServiceStub(ch).Stat(blob_pb2.StatBlobRequest(sha256=digest)),
                     grpc.StatusCode.PERMISSION_DENIED)()), args.tries),
    }
    best = {k: max(r[k] for r in rows) for k in rows[0]}
    print(f"gRPC calls/s, best of {args.rounds} rounds of {args.seconds:g}s (each round measures all four, "
          f"alternating): operator calls by {args.clients} concurrent clients on one channel; agent heartbeats "
          f"(Heartbeat → LeaseRenewal) on {args.clients} nodes' Connect streams, a channel each")
    for label, anchor in (("operator TLS", "operator plaintext"), ("agent mTLS", "agent plaintext")):
        cost = (1 - best[label] / best[anchor]) * 100
        verdict = "meets" if cost <= 15 else "MISSES"
        print(f"  {anchor:<20} {best[anchor]:8.0f} calls/s   (anchor)")
        print(f"  {label:<20} {best[label]:8.0f} calls/s   costs {cost:5.1f} % ({verdict} the 15 % target)")
    print(f"first call on a new channel (connect + handshake + call), median of {args.tries}:")
    for label, ms in first.items():
        print(f"  {label:<20} {ms:7.2f} ms")
    print("raw rounds: " + orjson.dumps([{k: round(v) for k, v in r.items()} for r in rows]).decode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tries", type=int, default=20, help="new channels timed for the first call")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"seconds": 0.3, "rounds": 1, "clients": 2, "tries": 2})
    with tempfile.TemporaryDirectory(prefix="nodus-grpc-tls-") as tmp, record.Report("grpc_tls", args):
        root = Path(tmp)
        (root / "plain").mkdir()
        (root / "tls").mkdir()
        plain = start_coordinator(root / "plain", "--grpc-insecure", "--controllers", "off")
        try:
            tls = start_coordinator(root / "tls", "--controllers", "off")
            try:
                asyncio.run(measure(plain, tls, args))
            finally:
                stop_all([tls.proc], [])
        finally:
            stop_all([plain.proc], [])


if __name__ == "__main__":
    main()
