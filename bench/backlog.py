#!/usr/bin/env python3
"""A queue of waiting Jobs against the control plane, each figure beside an idle coordinator measured in
the same run.

    .venv/bin/python bench/backlog.py [--jobs 10000] [--wait-seconds 60] [--watchers 100] [--nodes 8]

The fleet has room for none of the Jobs (each asks for one GPU): one real agent without GPUs joined.
Figures (see bench/README.md):
  1  the coordinator's CPU while nothing waits (the anchor), then while --jobs Jobs wait, over
     --wait-seconds (60 s covers one retry period of the unschedulable queue)
  2  GET p99 and watch delivery p99 (--watchers streams) during a burst of creates, on the idle
     coordinator and again on top of the queue
  3  the drain: --nodes nodes with simulated GPUs for every waiting Job register at once (the
     inventory `nodus-agent --simulate-gpus` sends, which caps a real agent at 64 GPUs; they never
     connect, so nothing placed there starts on this machine) and the bench counts the attempts bound
     to them (NodeService active attempts) until all are: attempts placed per second.
The wait is measured once the queue is at rest: every Job admitted, its attempt created and decided (parked
with its explain), which the bench sees as the store's revision standing still (`quiesce`): the work of
admitting 10,000 Jobs is the create path's, not the waiting queue's.
A benchmark, not a test: it asserts nothing. Reuses bench/api.py's load, watch and CPU helpers.
Named backlog.py, not queue.py as issue 17 calls it: a bench/queue.py would shadow the standard library's
`queue` module for every script run from bench/ (asyncio and multiprocessing import it).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson

import api
import api_procs
import record
from daemons import BIN, Coordinator, start_coordinator, stop_all
from fleet_diagnostics import profile, unprofile
from nodus.agent.enrolment import agent_address
from nodus.agent.x509 import csr_pem, key_pem, new_key
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

TARGET_CPU = 5.0
TARGET_GET_P99_MS = 20.0
TARGET_WATCH_P99_MS = 50.0
TARGET_DRAIN = 200.0
SEED_JOBS = 100
"""Jobs created before the first burst, for its GETs to read (they wait with the rest)."""


def body(name: str) -> bytes:
    return orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "Job",
                         "metadata": {"name": name, "labels": {"bench": "queue"}},
                         "spec": {"command": ["true"], "resources": {"gpu": {"count": 1}}}})


class Fleet:
    """The fleet: one real agent without GPUs (heartbeating, so the fleet has room for none), then, for
    the drain, nodes that join with simulated GPUs."""

    def __init__(self, root: Path, c: Coordinator) -> None:
        self.root, self.c = root, c
        self.agent: subprocess.Popen[bytes] | None = None
        self.gpu_nodes: list[str] = []
        self.channel = grpc.secure_channel(c.grpc, grpc.ssl_channel_credentials((c.data / "tls" / "ca.crt").read_bytes()))
        self.nodes = node_pb2_grpc.NodeServiceStub(self.channel)
        self.agents = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.md = (("authorization", f"Bearer {c.token}"),)

    def start_agent(self) -> None:
        with open(self.root / "agent.log", "ab") as out:
            self.agent = subprocess.Popen(
                [str(BIN / "nodus-agent"), "--coordinator", self.c.grpc, "--node", "no-gpus", "--work-dir",
                 str(self.root / "agent"), "--join-token-file", str(self.c.data / "join-token"), "--runtime",
                 "process", "--advertise-address", "127.0.0.1", "--coordinator-ca", str(self.c.data / "tls" / "ca.crt"),
                 "--log-level", "WARNING", "--attempt-uids", "off"],  # its temp dir is 0700 (ADR 0040)
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def listed(self) -> list[node_pb2.Node]:
        return list(self.nodes.ListNodes(node_pb2.ListNodesRequest(), metadata=self.md, timeout=30).nodes)

    def wait_ready(self, name: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(n.name == name and n.phase == node_pb2.NODE_PHASE_READY for n in self.listed()):
            if self.agent is not None and self.agent.poll() is not None:
                raise RuntimeError("nodus-agent exited:\n" + (self.root / "agent.log").read_text()[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name} not ready in {timeout:.0f}s")
            time.sleep(0.2)

    def join(self, name: str, gpus: int) -> None:
        """Registers `name` as an agent with `gpus` simulated GPUs does (nodus-agent --simulate-gpus sends
        the same inventory, but takes at most 64); it never connects, so nothing placed there starts."""
        token = (self.c.data / "join-token").read_text().strip()
        inventory = common_pb2.NodeInventory(
            hostname=name, agent_version="bench", runtimes=[common_pb2.RUNTIME_PROCESS], region_class="us",
            host=common_pb2.HostInventory(cpus=64, memory_bytes=512 << 30, disk_bytes=4 << 40),
            gpus=[common_pb2.Gpu(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-bench-{name}-{i}",
                                 memory_bytes=80 << 30, simulated=True) for i in range(gpus)])
        # As nodus-agent joins: enrol with the join token, then Register over mTLS with the certificate.
        key = new_key()
        answer = self.agents.Enrol(agent_pb2.EnrolRequest(node_name=name, csr_pem=csr_pem(key, name)),
                                   metadata=(("authorization", f"Bearer {token}"),), timeout=60)
        creds = grpc.ssl_channel_credentials((self.c.data / "tls" / "ca.crt").read_bytes(), key_pem(key),
                                             answer.certificate_pem.encode())
        with grpc.secure_channel(agent_address(self.c.grpc, answer.agent_port), creds) as channel:
            agent_pb2_grpc.AgentServiceStub(channel).Register(
                agent_pb2.RegisterRequest(node_name=name, inventory=inventory), timeout=60)
        self.gpu_nodes.append(name)

    def placed(self) -> int:
        """Live attempts on the GPU nodes."""
        return sum(n.active_attempts for n in self.listed() if n.name in self.gpu_nodes)

    def stop(self) -> None:
        stop_all([self.agent], [self.root / "agent"])
        self.channel.close()


async def create_all(session: aiohttp.ClientSession, url: str, names: list[str], concurrency: int) -> float:
    """Creates every name (201 expected), `concurrency` in flight; returns creates/s."""
    todo = iter(names)
    errors: list[str] = []

    async def worker() -> None:
        for name in todo:
            async with session.post(url, data=body(name)) as r:
                payload = await r.read()
                if r.status != 201 and len(errors) < 3:
                    errors.append(f"HTTP {r.status} {payload[:300]!r}")
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if errors:
        raise RuntimeError(f"creates failed: {errors}")
    return len(names) / (time.monotonic() - t0)


def cpu_percent(pid: int, seconds: float) -> float:
    t0, c0 = time.monotonic(), api_procs.cpu_seconds(pid)
    time.sleep(seconds)
    return 100 * (api_procs.cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def settle(pid: int, limit: float) -> float:
    """Waits until the coordinator spends under 10 % of a core over a second (or `limit` s); seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and cpu_percent(pid, 1.0) >= 10.0:
        pass
    return time.monotonic() - t0


async def revision(session: aiohttp.ClientSession, url: str) -> int:
    """The store's revision, as a one-item list reports it."""
    async with session.get(url, params={"limit": "1"}) as r:
        return int(orjson.loads(await r.read())["metadata"]["resourceVersion"])


async def quiesce(session: aiohttp.ClientSession, url: str, limit: float, still: float = 3.0) -> float:
    """Waits until the store's revision stands still for `still` seconds (nothing left to write: every Job
    admitted and its attempt decided), or `limit` s; seconds waited."""
    t0 = time.monotonic()
    last, since = await revision(session, url), time.monotonic()
    while time.monotonic() - t0 < limit:
        await asyncio.sleep(0.5)
        now = await revision(session, url)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            break
    return time.monotonic() - t0


async def burst(args: argparse.Namespace, c: Coordinator, tag: str, gets: list[str]) -> dict[str, Any]:
    """Watchers open, then creates at --burst-rate for --burst-seconds while a closed loop GETs `gets`."""
    url = c.http + api.JOBS
    ctx = api.client_ssl(c.ca)
    headers = {"Authorization": f"Bearer {c.token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, ssl=ctx), headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.get(url, params={"limit": "1"}) as r:
            rv = orjson.loads(await r.read())["metadata"]["resourceVersion"]
        spawn = mp.get_context("spawn")
        parent, child = spawn.Pipe()
        watch = spawn.Process(target=api_procs.watch_client_main, args=([c.http], c.token, str(c.ca), args.watchers, rv, child),
                              daemon=True, name="bench-watch")
        watch.start()
        loop = asyncio.get_running_loop()
        try:
            if not await loop.run_in_executor(None, parent.poll, 60):
                raise RuntimeError("watch client did not report ready in 60s")
            parent.recv()
            acked: dict[str, float] = {}

            async def create(name: str) -> None:
                async with s.post(url, data=body(name)) as r:
                    await r.read()
                    if r.status == 201:
                        acked[name] = time.monotonic()

            async def creates() -> None:
                await asyncio.sleep(api.WARMUP_S)
                n = int(args.burst_rate * args.burst_seconds)
                t0 = time.monotonic()
                tasks = []
                for k in range(n):
                    await asyncio.sleep(max(0.0, t0 + k / args.burst_rate - time.monotonic()))
                    tasks.append(asyncio.create_task(create(f"{tag}-{k:06d}")))
                await asyncio.gather(*tasks)

            spies = profile(args, [c], args.jobs, f"-{tag.split('-')[0]}", stem="backlog", rate=200)
            try:
                got, _ = await asyncio.gather(
                    api.closed_loop(s, args.get_concurrency, args.burst_seconds, 200,
                                    lambda i: ("GET", f"{url}/{gets[(i * 7919) % len(gets)]}", None, ""),
                                    {"server": c.proc.pid}),
                    creates())
            finally:
                unprofile(spies)
            parent.send((list(acked), 10.0))
            if not await loop.run_in_executor(None, parent.poll, 40):
                raise RuntimeError("watch client did not report results")
            _, per_watcher, _, errors = parent.recv()
        finally:
            api_procs.stop_process(watch)
    lat = [t - acked[name] for arrivals in per_watcher for name, t in arrivals.items()]
    return {"get_p99": api.pct(got.latencies, .99) * 1e3, "get_p50": api.pct(got.latencies, .5) * 1e3, "gets": got.ok,
            "get_errors": sum(got.errors.values()), "cpu": got.cpu,
            "watch_p99": api.pct(lat, .99) * 1e3, "watch_p50": api.pct(lat, .5) * 1e3,
            "missed": len(acked) * args.watchers - len(lat), "created": list(acked), "errors": errors[:3]}


async def run(args: argparse.Namespace, tmp: Path, out: dict[str, Any]) -> None:
    c = start_coordinator(tmp, "--lease-duration", "30m")
    out["coordinator"] = c
    fleet = Fleet(tmp, c)
    out["fleet"] = fleet
    fleet.start_agent()
    fleet.wait_ready("no-gpus")
    api.log(f"coordinator at {c.http}; an agent without GPUs joined")
    assert c.proc is not None
    pid = c.proc.pid
    api.log(f"idle: coordinator CPU over {args.idle_seconds:.0f}s, nothing waiting")
    settle(pid, 30)
    out["idle_cpu"] = cpu_percent(pid, args.idle_seconds)
    run_id = secrets.token_hex(3)
    url = c.http + api.JOBS
    headers = {"Authorization": f"Bearer {c.token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency, ssl=api.client_ssl(c.ca)),
                                     headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as s:
        seeds = [f"s-{run_id}-{k:04d}" for k in range(SEED_JOBS)]
        await create_all(s, url, seeds, args.concurrency)
        settle(pid, 60)
        api.log(f"burst on the idle coordinator: {args.watchers} watchers, {args.burst_rate:.0f} creates/s")
        out["idle_burst"] = await burst(args, c, f"a-{run_id}", seeds)
        names = [f"q-{run_id}-{k:06d}" for k in range(args.jobs)]
        api.log(f"creating {args.jobs} Jobs that fit nowhere, concurrency {args.concurrency}")
        out["create_rate"] = await create_all(s, url, names, args.concurrency)
        out["settle_s"] = await quiesce(s, url, 600)
    settle(pid, 30)
    api.log(f"at rest after {out['settle_s']:.0f}s; coordinator CPU over {args.wait_seconds:.0f}s while they wait")
    out["queue_cpu"] = cpu_percent(pid, args.wait_seconds)
    api.log("burst on top of the queue")
    out["queue_burst"] = await burst(args, c, f"b-{run_id}", names)
    waiting = SEED_JOBS + args.jobs + len(out["idle_burst"]["created"]) + len(out["queue_burst"]["created"])
    out["waiting"] = waiting
    per_node = math.ceil(waiting / args.nodes)
    api.log(f"drain: {args.nodes} nodes of {per_node} simulated GPUs join for {waiting} waiting attempts")
    t0 = time.monotonic()
    for i in range(args.nodes):
        fleet.join(f"gpu-{i}", per_node)
    placed, deadline = 0, t0 + args.drain_timeout
    while placed < waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        placed = fleet.placed()
    out["drain"] = (placed, time.monotonic() - t0)


def report(args: argparse.Namespace, out: dict[str, Any]) -> None:
    lines: list[str] = []
    p = lines.append
    idle, queued = out["idle_burst"], out["queue_burst"]
    placed, drain_s = out["drain"]
    rate = placed / drain_s if drain_s else 0.0
    p("")
    p(f"nodus placement-queue benchmark - {os.cpu_count()} CPUs; {args.jobs} Jobs of one GPU each on a fleet with "
      f"room for none (1 agent without GPUs), then {args.nodes} nodes with GPUs for all join; {args.watchers} watchers")
    p(f"  created the queue at {out['create_rate']:,.0f}/s; at rest (the store's revision still for 3 s) {out['settle_s']:.0f}s after; "
      f"{out['waiting']} attempts waited at the drain")
    for label, b in (("idle", idle), ("queue", queued)):
        p(f"  burst ({label}): {b['gets']} GETs ({b['get_errors']} errors), {len(b['created'])} creates; watch "
          f"p50 {b['watch_p50']:.1f} ms, {b['missed']} missed; GET p50 {b['get_p50']:.1f} ms; CPU during it: {b['cpu']}"
          + (f"; errors {b['errors']}" if b["errors"] else ""))
    p("")
    widths = [38, 22, 24, 10]
    p("".join(h.ljust(w) for h, w in zip(("figure", f"{args.jobs} waiting", "idle (same run)", "target"), widths))
      .rstrip())
    rows = [("coordinator CPU (% of a core)", f"{out['queue_cpu']:.1f} %", f"{out['idle_cpu']:.1f} %",
             f"<= {TARGET_CPU:.0f} %"),
            ("GET p99 during a burst", f"{queued['get_p99']:.1f} ms", f"{idle['get_p99']:.1f} ms",
             f"<= {TARGET_GET_P99_MS:.0f} ms"),
            (f"watch p99 during a burst ({args.watchers} w.)", f"{queued['watch_p99']:.1f} ms",
             f"{idle['watch_p99']:.1f} ms", f"<= {TARGET_WATCH_P99_MS:.0f} ms"),
            ("drain: attempts placed/s", f"{rate:,.0f}/s", f"{placed} in {drain_s:.1f}s", f">= {TARGET_DRAIN:.0f}/s")]
    for row in rows:
        p("".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
    p("")

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"
    p("targets: " + "; ".join((
        f"CPU <= {TARGET_CPU:.0f} %: {met(out['queue_cpu'] <= TARGET_CPU)}",
        f"GET p99 <= {TARGET_GET_P99_MS:.0f} ms: {met(queued['get_p99'] <= TARGET_GET_P99_MS)}",
        f"watch p99 <= {TARGET_WATCH_P99_MS:.0f} ms: "
        f"{met(queued['watch_p99'] <= TARGET_WATCH_P99_MS and queued['missed'] == 0)}",
        f"drain >= {TARGET_DRAIN:.0f}/s: {met(rate >= TARGET_DRAIN and placed >= out['waiting'])}")))
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000, help="Jobs in the queue (default 10,000)")
    ap.add_argument("--idle-seconds", type=float, default=10, help="the idle CPU window (default 10)")
    ap.add_argument("--wait-seconds", type=float, default=60,
                    help="the CPU window while the queue waits (default 60, one retry period)")
    ap.add_argument("--watchers", type=int, default=100, help="watch streams during a burst (default 100)")
    ap.add_argument("--burst-rate", type=float, default=50, help="creates/s during a burst (default 50)")
    ap.add_argument("--burst-seconds", type=float, default=5, help="length of a burst (default 5)")
    ap.add_argument("--get-concurrency", type=int, default=8, help="GETs in flight during a burst (default 8)")
    ap.add_argument("--concurrency", type=int, default=64, help="creates in flight while the queue fills (default 64)")
    ap.add_argument("--nodes", type=int, default=8, help="GPU nodes whose capacity joins for the drain (default 8)")
    ap.add_argument("--drain-timeout", type=float, default=600, help="how long the drain may take (default 600)")
    ap.add_argument("--py-spy", metavar="DIR", default=None,
                    help="record the coordinator's stacks (`py-spy record --gil`, collapsed, 200 Hz) during each burst "
                         "into DIR/backlog-<jobs>-r0-a.txt (idle) and -b.txt (on the queue); needs py-spy on PATH")
    ap.add_argument("--tmp-dir", default=None, help="parent of the temporary directory (default: system temp)")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"jobs": 60, "idle_seconds": 1.0, "wait_seconds": 2.0, "watchers": 4,
                                           "burst_rate": 20.0, "burst_seconds": 1.0, "nodes": 2,
                                           "drain_timeout": 120.0})
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(prefix="nodus-bench-queue-", dir=args.tmp_dir))
    out: dict[str, Any] = {}
    try:
        asyncio.run(run(args, tmp, out))
        with record.Report("backlog", args):
            report(args, out)
    except KeyboardInterrupt:
        api.log("interrupted; cleaning up")
        sys.exit(130)
    except Exception:
        log = tmp / "coordinator.log"
        if log.exists():
            api.log(f"coordinator log tail:\n{log.read_text(errors='replace')[-4000:]}")
        raise
    finally:
        if "fleet" in out:
            out["fleet"].stop()
        if "coordinator" in out:
            stop_all([out["coordinator"].proc], [])
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
