#!/usr/bin/env python3
"""A fleet on one machine, simulated: many agents speaking the real AgentService against a real coordinator.

    .venv/bin/python bench/fleet.py [--agents 100,500,1000] [--attempts 10000] [--postgres] [--save]

For each fleet size the bench starts a fresh nodus-coordinator (embedded SQLite, or with --postgres a
database on a throwaway PostgreSQL cluster, as tests/postgres.py makes one) and that many simulated agents
in --processes client processes (bench/fleet_agents.py: the real agent's Link around a node that runs
nothing). Figures, each beside its target and an anchor from the same run (see bench/README.md):
  1  enrolment: every node's CSR → client certificate, then the join (Register + Connect over mTLS)
  2  the coordinator's CPU at steady state (heartbeats only): before the burst and after it drained, beside
     a bare grpc.aio AgentService answering the same nodes' heartbeats over mTLS at the same interval
  3  create → assignment reaching its agent, p50 / p99, over --attempts one-GPU Jobs created through REST
     in a burst (the create time is the 201's arrival; the agent stamps the receipt; one clock)
  4  the reconnect storm: with one long attempt per agent, the coordinator is restarted (same data dir and
     ports); the time until every agent is re-synchronised (FullState in, its Hello with its attempts
     acknowledged), beside the coordinator's own start to serving
A benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the client processes inherit it: no C-core INFO lines

import api
import api_procs
import record
from daemons import Coordinator, ready_coordinator, spawn_coordinator, stop_all
from fleet_agents import RUN_ENV, anchor_server_main, worker_main
from fleet_queries import job_phases, lost_attempts, revision, unreached, writes_since
from fleet_diagnostics import profile, terms_lost, unprofile
from fleet_report import report

TESTS = Path(__file__).resolve().parent.parent / "tests"
LONG_RUN_S = 3600
"""How long the reconnect storm's attempts run: past the end of the bench."""


def job_body(name: str, label: str, env: dict[str, str] | None = None) -> bytes:
    spec: dict[str, Any] = {"command": ["true"], "resources": {"gpu": {"count": 1}}}
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "Job",
                         "metadata": {"name": name, "labels": {"bench": label}}, "spec": spec})


@dataclass
class Worker:
    """One client process of simulated agents, driven over a Pipe."""

    proc: mp.process.BaseProcess
    conn: Any

    def ask(self, *command: Any, timeout: float = 120) -> Any:
        self.conn.send(command)
        if not self.conn.poll(timeout):
            raise RuntimeError(f"fleet worker {self.proc.pid} did not answer {command[0]!r} in {timeout:.0f}s")
        answer = self.conn.recv()
        return answer[0] if len(answer) == 1 else answer


class Fleet:
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    def ask(self, *command: Any, timeout: float = 120) -> list[Any]:
        for w in self.workers:
            w.conn.send(command)
        out = []
        for w in self.workers:
            if not w.conn.poll(timeout):
                raise RuntimeError(f"fleet worker {w.proc.pid} did not answer {command[0]!r} in {timeout:.0f}s")
            answer = w.conn.recv()
            out.append(answer[0] if len(answer) == 1 else answer)
        return out

    def status(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for s in self.ask("status"):
            for k, v in s.items():
                total[k] = total.get(k, 0) + v
        return total

    def wait(self, what: str, done: Any, timeout: float) -> tuple[dict[str, int], bool]:
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if done(s):
                return s, True
            if time.monotonic() > deadline:
                api.log(f"{what}: not reached in {timeout:.0f}s ({s})")
                return s, False
            for w in self.workers:
                if not w.proc.is_alive():
                    raise RuntimeError(f"fleet worker {w.proc.pid} exited")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc.pid is not None]

    def stop(self) -> None:
        for w in self.workers:
            try:
                if w.proc.is_alive():
                    w.ask("stop", timeout=20)
            except (RuntimeError, OSError, EOFError):
                pass
            api_procs.stop_process(w.proc)


def cpu_of(pids: list[int], seconds: float) -> list[float]:
    """Each pid's CPU over `seconds`, as % of one core."""
    t0, c0 = time.monotonic(), [api_procs.cpu_seconds(p) for p in pids]
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return [100 * (api_procs.cpu_seconds(p) - c) / dt for p, c in zip(pids, c0)]


def steady(cs: list[Coordinator], limit: float) -> float:
    """Waits until two 2-second CPU windows of the coordinators (together) agree (within 2 points or 20 %),
    or `limit` s."""
    pids = [c.proc.pid for c in cs]
    t0 = time.monotonic()
    last = sum(cpu_of(pids, 2.0))
    while time.monotonic() - t0 < limit:
        now = sum(cpu_of(pids, 2.0))
        if abs(now - last) <= max(2.0, 0.2 * last):
            break
        last = now
    return time.monotonic() - t0


def measure_steady(args: argparse.Namespace, cs: list[Coordinator], fleet: Fleet,
                   store_url: str | None = None) -> dict[str, Any]:
    """The coordinators' CPU (their sum, and each replica's) and the clients', over --idle-seconds, and the
    store's writes per second in that window (on PostgreSQL also by kind: fleet_queries.writes_since)."""
    fleet.ask("lag")
    head = revision(cs[0])
    t0 = time.monotonic()
    cpus = cpu_of([*(c.proc.pid for c in cs), *fleet.pids()], args.idle_seconds)
    took = time.monotonic() - t0
    rate = (revision(cs[0]) - head) / took
    kinds = writes_since(store_url, head, took) if store_url else None
    return {"coordinator": sum(cpus[:len(cs)]), "replicas": cpus[:len(cs)], "clients": cpus[len(cs):],
            "lag_p99": max(fleet.ask("lag")), "write_rate": rate, "writes": kinds}


def quiet(cs: list[Coordinator], steady_rate: float, limit: float, every: float = 5.0) -> dict[str, Any]:
    """Waits until the store's write rate over `every` seconds is back near the steady rate measured before
    the burst (the lease renewals: at most 1.5 times it, plus 5/s), or `limit` s. What the drained
    coordinators still write (ADR 0120: the burst's Events, minutes behind its Jobs) is not the steady
    state the CPU figure is for. Returns the seconds waited, the writes made meanwhile, the rates seen and each
    replica's CPU meanwhile (% of a core)."""
    pids = [c.proc.pid for c in cs]
    t0, cpu0 = time.monotonic(), [api_procs.cpu_seconds(p) for p in pids]
    first = last = revision(cs[0])
    rates: list[float] = []
    while time.monotonic() - t0 < limit:
        time.sleep(every)
        now = revision(cs[0])
        rates.append((now - last) / every)
        last = now
        if rates[-1] <= 1.5 * steady_rate + 5:
            break
    took = time.monotonic() - t0
    return {"seconds": took, "writes": last - first, "rates": rates,
            "quiet": bool(rates) and rates[-1] <= 1.5 * steady_rate + 5,
            "replicas": [100 * (api_procs.cpu_seconds(p) - c) / took for p, c in zip(pids, cpu0)]}


async def create_jobs(cs: list[Coordinator], names: list[str], label: str, concurrency: int,
                      env: dict[str, str] | None = None) -> tuple[dict[str, float], list[str], float]:
    """Creates every Job, `concurrency` in flight spread over the replicas: the monotonic time each 201
    arrived, errors, seconds taken."""
    acked: dict[str, float] = {}
    errors: list[str] = []
    todo = iter(names)
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, ssl=api.client_ssl(c.ca)),
            headers={"Authorization": f"Bearer {c.token}", "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=300))) for c in cs]

        async def worker(k: int) -> None:
            s, url = sessions[k % len(cs)], cs[k % len(cs)].http + api.JOBS
            for name in todo:
                async with s.post(url, data=job_body(name, label, env)) as r:
                    payload = await r.read()
                    if r.status == 201:
                        acked[name] = time.monotonic()
                    else:
                        errors.append(f"HTTP {r.status} {payload[:200]!r}")
        t0 = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return acked, errors, time.monotonic() - t0


def gpus_per_agent(args: argparse.Namespace, n: int) -> int:
    """Room for every attempt of the burst at once beside each agent's long attempt, at least 8."""
    return int(args.gpus or max(8, math.ceil(args.attempts / n) + 1))


def start_fleet(args: argparse.Namespace, cs: list[Coordinator], n: int, identity_root: Path) -> Fleet:
    """The client processes; node i talks to replica i mod len(cs)."""
    spawn = mp.get_context("spawn")
    procs = max(1, min(args.processes, n))
    names = [f"sim-{i:04d}" for i in range(n)]
    gpus = gpus_per_agent(args, n)
    workers = []
    for k in range(procs):
        parent, child = spawn.Pipe()
        mine = range(k, n, procs)
        cfg = {"names": [names[i] for i in mine], "targets": [cs[i % len(cs)].grpc for i in mine],
               "tokens": [(cs[i % len(cs)].data / "join-token").read_text().strip() for i in mine],
               "ca": str(cs[0].data / "tls" / "ca.crt"), "identity_root": str(identity_root), "gpus": gpus,
               "run_seconds": args.run_seconds, "enrol_concurrency": args.enrol_concurrency,
               "log_file": str(Path(args.agent_log) / f"fleet-agents-{n}-{k}.log") if args.agent_log else None}
        proc = spawn.Process(target=worker_main, args=(child, cfg), daemon=True, name=f"fleet-{k}")
        proc.start()
        workers.append(Worker(proc, parent))
    return Fleet(workers)


def anchor(args: argparse.Namespace, c: Coordinator, fleet: Fleet) -> dict[str, Any]:
    """The bare grpc.aio AgentService's CPU answering the same nodes' heartbeats at the same interval."""
    spawn = mp.get_context("spawn")
    parent, child = spawn.Pipe()
    server = spawn.Process(target=anchor_server_main, args=(child, str(c.data / "tls")), daemon=True,
                           name="fleet-anchor")
    server.start()
    try:
        if not parent.poll(60):
            raise RuntimeError("the anchor server did not start")
        target = parent.recv()
        fleet.ask("anchor", target, args.heartbeat)
        time.sleep(args.heartbeat * 1.5)
        fleet.ask("lag")
        assert server.pid is not None
        cpus = cpu_of([server.pid, *fleet.pids()], args.idle_seconds)
        out = {"server": cpus[0], "clients": cpus[1:], "lag_p99": max(fleet.ask("lag"))}
        fleet.ask("anchor_stop")
        parent.send("stop")
        server.join(10)
    finally:
        api_procs.stop_process(server)
    return out


def start_replicas(args: argparse.Namespace, root: Path, store: list[str],
                   listen: list[tuple[str, str, str]] | None = None) -> list[Coordinator]:
    """--replicas coordinators on one store (ROOT/rN/data): the first makes the CA and the vault key, the
    others get copies (ADR 0043), so each starts once the one before serves. `listen`: each one's (https,
    gRPC, agent port) again, for a restart: then all of them start at once, as a cluster restarted (ADR 0099)."""
    cs: list[Coordinator] = []
    spawned: list[tuple[Path, subprocess.Popen[bytes]]] = []
    for i in range(args.replicas):
        r = root / f"r{i}"
        r.mkdir(exist_ok=True)
        data = r / "data"
        if i and not data.exists():
            data.mkdir(mode=0o700)
            shutil.copytree(cs[0].data / "tls", data / "tls")
            shutil.copy2(cs[0].data / "secret.key", data / "secret.key")
        (data / "endpoints.json").unlink(missing_ok=True)
        ports = [] if listen is None else ["--http-listen", listen[i][0], "--grpc-listen", listen[i][1],
                                           *(["--agent-listen", listen[i][2]] if listen[i][2] else [])]
        spawned.append((r, spawn_coordinator(r, "--heartbeat-interval", f"{args.heartbeat:g}s", *store, *ports)))
        if listen is None:
            cs.append(ready_coordinator(*spawned[-1]))
    try:
        return cs if listen is None else [ready_coordinator(r, proc) for r, proc in spawned]
    except BaseException:
        stop_all([proc for _, proc in spawned], [])  # the caller still holds the replicas before the restart
        raise


def endpoints(c: Coordinator) -> tuple[str, str, str]:
    """Where the coordinator listens: https, gRPC and the agent port (what a restart must take again)."""
    ep = json.loads((c.data / "endpoints.json").read_text())
    return c.http.split("://", 1)[1], c.grpc, str(ep.get("agent") or "")


async def one_size(args: argparse.Namespace, n: int, root: Path, store: list[str], out: dict[str, Any]) -> None:
    cs = start_replicas(args, root, store)
    out["coordinators"] = cs
    for c in cs:
        api.log(f"{n} agents: coordinator at {c.http}, gRPC {c.grpc}, agent port {endpoints(c)[2]}")
    identity = Path(tempfile.mkdtemp(prefix="nodus-fleet-id-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    out["identity"] = identity
    t0 = time.monotonic()
    fleet = start_fleet(args, cs, n, identity)
    out["fleet"] = fleet
    enrolled = []
    for w in fleet.workers:
        if not w.conn.poll(600):
            raise RuntimeError("the fleet did not enrol in 600 s")
        enrolled += w.conn.recv()[1]
    out["enrol"] = {"latencies": enrolled, "wall": time.monotonic() - t0}
    api.log(f"{n} enrolled in {out['enrol']['wall']:.1f}s; anchor: bare grpc.aio heartbeats for {args.idle_seconds:g}s")
    out["anchor"] = anchor(args, cs[0], fleet)
    t0 = time.monotonic()
    fleet.ask("join")
    _, ok = fleet.wait("join", lambda s: s["connected"] >= n, args.drain_timeout)
    out["join"] = {"seconds": time.monotonic() - t0, "ok": ok}
    api.log(f"{n} joined in {out['join']['seconds']:.1f}s; steady state before the burst")
    time.sleep(args.heartbeat * 2)
    out["settle_before"] = steady(cs, 60)
    spies = profile(args, cs, n, "-before")  # the same steady state's stacks, to set beside "-after"
    try:
        out["before"] = measure_steady(args, cs, fleet, out.get("store_url"))
    finally:
        unprofile(spies)
    api.log(f"anchor: {args.trickle} Jobs one at a time on the idle fleet")
    trickle: dict[str, float] = {}
    for k in range(args.trickle):
        before = fleet.status()["received"]
        one, _, _ = await create_jobs(cs[k % len(cs):][:1], [f"t-{k:03d}"], "fleet-trickle", 1)
        trickle.update(one)
        fleet.wait("trickle", lambda s: s["received"] > before, 60)
    out["trickle"] = trickle
    if not args.no_storm:
        await storm(args, n, root, store, out)
    await burst(args, out["coordinators"], fleet, out)
    if "storm" in out:  # after the burst: any lease the restart let run out has been expired by now
        out["storm"]["lost"] = await lost_attempts(out["coordinators"][0], "long-")


async def storm(args: argparse.Namespace, n: int, root: Path, store: list[str], out: dict[str, Any]) -> None:
    """One long attempt on every agent, then every coordinator restarted on the same data dir and ports: the
    time until every agent is re-synchronised."""
    cs: list[Coordinator] = out["coordinators"]
    api.log(f"reconnect storm: one long attempt on each of {n} agents, then a restart")
    fleet: Fleet = out["fleet"]
    long_names = [f"long-{k:04d}" for k in range(n)]
    long_created, long_errors, _ = await create_jobs(cs, long_names, "fleet-long", args.concurrency,
                                                     {RUN_ENV: str(LONG_RUN_S)})
    live, _ = fleet.wait("long attempts", lambda s: s["live"] >= len(long_created), args.drain_timeout)
    fleet.ask("resync")
    listen = [endpoints(c) for c in cs]
    t_stop = time.monotonic()
    stop_all([c.proc for c in cs], [])
    stopped = time.monotonic() - t_stop
    t_spawn = time.monotonic()
    out["coordinators"] = cs = start_replicas(args, root, store, listen)
    serving = time.monotonic() - t_spawn
    deadline = t_spawn + args.storm_timeout
    synced, last = 0, 0.0
    while time.monotonic() < deadline:
        answers = fleet.ask("synced")
        synced, last = sum(a[0] for a in answers), max(a[1] for a in answers)
        if synced >= n:
            break
        time.sleep(0.2)
    kept = fleet.status()["live"]
    out["storm"] = {"synced": synced, "resync_s": (last - t_spawn) if synced >= n else None, "serving_s": serving,
                    "stopped_s": stopped, "live_before": live["live"], "kept": kept, "long_errors": long_errors[:3]}
    api.log(f"{synced} of {n} re-synchronised")


async def burst(args: argparse.Namespace, cs: list[Coordinator], fleet: Fleet, out: dict[str, Any]) -> None:
    """--attempts one-GPU Jobs through REST at once: each one's create → its first assignment at an agent."""
    trickle = out["trickle"]
    names = [f"j-{k:05d}" for k in range(args.attempts)]
    api.log(f"burst: {args.attempts} Jobs, concurrency {args.concurrency}")
    t0 = time.monotonic()
    ended0 = fleet.status()["ended"]
    spies = profile(args, cs, out["n"])
    try:
        created, errors, took = await create_jobs(cs, names, "fleet", args.concurrency)
        out["create"] = {"acked": len(created), "errors": errors[:3], "n_errors": len(errors), "seconds": took}
        status, ok = fleet.wait("drain", lambda s: s["ended"] - ended0 >= len(created), args.drain_timeout)
        drained = time.monotonic() - t0
    finally:
        unprofile(spies)
    first: dict[str, float] = {}
    attempts = 0
    for job, t in (job_t for per in fleet.ask("receipts") for job_t in per):
        if job in created or job in trickle:
            attempts += job in created
            first[job] = min(t, first.get(job, t))
    missing = [j for j in created if j not in first]
    if missing:
        api.log(f"{len(missing)} Jobs' assignments never reached an agent; the first of them:\n"
                + "\n".join(await unreached(cs, missing[:5])))
    phases: dict[str, int] = {}
    if ok:
        api.log(f"drained in {drained:.1f}s; waiting for every Job to be Succeeded")
        deadline = time.monotonic() + args.drain_timeout
        phases = await job_phases(cs[0], "fleet")
        while phases.get("Succeeded", 0) < len(created) and time.monotonic() < deadline:
            await asyncio.sleep(5)
            phases = await job_phases(cs[0], "fleet")
    out["burst"] = {"lat": [first[j] - created[j] for j in created if j in first], "attempts": attempts,
                    "ended": status["ended"] - ended0, "drained_s": drained, "ok": ok, "phases": phases,
                    "succeeded_s": time.monotonic() - t0, "trickle": [first[j] - trickle[j] for j in trickle if j in first]}
    if ok:
        api.log("waiting for the store to go quiet after the drain")
        out["quiet"] = quiet(cs, out["before"]["write_rate"], args.quiet_timeout)
        api.log(f"steady state after the drain ({out['quiet']['writes']:,} writes in {out['quiet']['seconds']:.0f} s "
                f"until the store was quiet)")
        out["settle_after"] = steady(cs, 120)
        spies = profile(args, cs, out["n"], "-after")  # what the drained coordinator still does
        try:
            out["after"] = measure_steady(args, cs, fleet, out.get("store_url"))
        finally:
            unprofile(spies)
    else:
        api.log(f"the burst did not drain in {args.drain_timeout:g}s: no steady state after it")


def run_size(args: argparse.Namespace, n: int, tmp: Path, pg: Any) -> dict[str, Any]:
    root = tmp / f"agents-{n}"
    root.mkdir()
    store = ["--store-url", pg.database()] if pg is not None else []
    out: dict[str, Any] = {"n": n, "gpus": gpus_per_agent(args, n), "store_url": store[1] if store else None}
    try:
        asyncio.run(one_size(args, n, root, store, out))
    except Exception:
        for log in sorted(root.glob("r*/coordinator.log")):
            api.log(f"{log} tail:\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        if "fleet" in out:
            out.pop("fleet").stop()
        if "coordinators" in out:
            stop_all([c.proc for c in out.pop("coordinators")], [])
        out["terms_lost"] = terms_lost(root)
        if "identity" in out:
            shutil.rmtree(out.pop("identity"), ignore_errors=True)
    return out


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="100,500,1000", help="fleet sizes, comma-separated (default 100,500,1000)")
    ap.add_argument("--attempts", type=int, default=10_000, help="one-GPU Jobs created in the burst (default 10,000)")
    ap.add_argument("--run-seconds", type=float, default=1.0,
                    help="how long a simulated attempt runs before it reports Succeeded (default 1)")
    ap.add_argument("--gpus", type=int, default=0,
                    help="simulated GPUs per agent (default: room for every attempt at once, at least 8)")
    ap.add_argument("--heartbeat", type=float, default=3.0,
                    help="the coordinator's --heartbeat-interval in seconds (default 3, its own default)")
    ap.add_argument("--idle-seconds", type=float, default=20, help="each steady-state CPU window (default 20)")
    ap.add_argument("--processes", type=int, default=2, help="client processes the agents are split over (default 2)")
    ap.add_argument("--enrol-concurrency", type=int, default=16, help="enrolments in flight per process (default 16)")
    ap.add_argument("--trickle", type=int, default=20,
                    help="Jobs created one at a time on the idle fleet before the burst, the latency anchor (default 20)")
    ap.add_argument("--concurrency", type=int, default=64, help="creates in flight during the burst (default 64)")
    ap.add_argument("--drain-timeout", type=float, default=900, help="how long the burst may take to drain")
    ap.add_argument("--quiet-timeout", type=float, default=600,
                    help="how long to wait after the drain for the store's writes to fall back to the lease "
                         "renewals' rate before the steady state after it is measured (default 600)")
    ap.add_argument("--storm-timeout", type=float, default=180, help="how long the re-synchronisation may take")
    ap.add_argument("--postgres", action="store_true",
                    help="the store on PostgreSQL: a throwaway cluster (tests/postgres.py), a database per size")
    ap.add_argument("--replicas", type=int, default=1,
                    help="coordinator replicas on one PostgreSQL store (with --postgres; ADR 0043): REST creates and "
                         "the agents are spread over them (default 1)")
    ap.add_argument("--quick", action="store_true", help="a small run of a few agents and attempts (as --tiny)")
    ap.add_argument("--tmp-dir", default=None, help="parent of the temporary directory (default: system temp)")
    ap.add_argument("--no-storm", action="store_true",
                    help="skip the reconnect storm (and its long attempts): only enrolment, CPU and the burst")
    ap.add_argument("--py-spy", metavar="DIR", default=None,
                    help="record each coordinator's stacks with `py-spy record --gil` during the burst into "
                         "DIR/fleet-<agents>-r<i>.txt and during the steady state after it into "
                         "DIR/fleet-<agents>-r<i>-after.txt (collapsed stacks; needs py-spy on PATH and ptrace rights)")
    ap.add_argument("--agent-log", metavar="DIR", default=None, help="the simulated agents' logs at INFO, one file "
                    "per client process (DIR/fleet-agents-<agents>-<k>.log): why a node did or did not come back")
    record.add_flags(ap)
    args = ap.parse_args()
    args.tiny = args.tiny or args.quick
    args = record.shrink(args, {"agents": "3", "attempts": 12, "run_seconds": 0.2, "idle_seconds": 1.0,
                                "processes": 1, "trickle": 3, "drain_timeout": 120.0, "storm_timeout": 60.0,
                                "quiet_timeout": 60.0})
    sizes = [int(x) for x in str(args.agents).split(",") if x.strip()]
    if args.replicas < 1 or (args.replicas > 1 and not args.postgres):
        ap.error("--replicas N takes N >= 1, and more than one replica needs --postgres (one shared store)")
    # The phases wait in plain loops inside asyncio.run, where SIGINT only cancels at the next await: both
    # signals raise at once instead, so the cleanup below runs whatever the bench is waiting on.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="nodus-bench-fleet-", dir=args.tmp_dir))
    pg, pg_root = None, None
    results = []
    try:
        if args.postgres:
            sys.path.insert(0, str(TESTS))
            from postgres import PostgresCluster  # tests/postgres.py: the suite's throwaway cluster
            pg_root = Path(tempfile.mkdtemp(prefix="nodus-bench-fleet-pg-"))
            pg = PostgresCluster(pg_root)
            pg.start()
        for n in sizes:
            results.append(run_size(args, n, tmp, pg))
        load = os.getloadavg()
        with record.Report("fleet", args):
            report(args, results, load)
    except KeyboardInterrupt:
        api.log("interrupted; cleaning up")
        sys.exit(130)
    finally:
        if pg is not None:
            try:
                pg.stop()
            except (RuntimeError, subprocess.SubprocessError) as e:
                api.log(f"stopping PostgreSQL: {e}")
        if pg_root is not None:
            shutil.rmtree(pg_root, ignore_errors=True)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
