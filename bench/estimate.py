#!/usr/bin/env python3
"""What an estimate adds to a dry run, and how often the actual cost falls within it.

    .venv/bin/python bench/estimate.py [--nodes 200] [--runs 300] [--record 200] [--jobs 30] [--seed 1] [--spread 0.3]

Latency, in-process (the real resource service, no HTTP, no daemons): two stores on SQLite, each with
the same fleet (`--nodes` one-GPU nodes, leases fresh, sold round-robin as bench/placement.py's six x1
offerings), one with that price book active and one without. A dry run (`create(..., dry_run=True)` of
a one-GPU Job with expectedDuration) runs `--runs` times on each, interleaved, so both see the same
machine. Both stores hold `--record` finished Jobs of the project, so the priced estimate sums its
charge over their actual/declared record (money/quote.py spread), as a busy project's would.
A third series runs the priced dry run with the estimate's memos cleared first (money/policy.py
clear_memo), as the first dry run after the project's record, the measured starts or the book changed.

Accuracy, with real daemons: a `nodus-coordinator` with a two-offering book (a 1-vCPU/1Gi dev node
with a simulated A100, interruptible at $1.10/h reclaimed `--interruptions-per-hour`, and on-demand at
$2.20/h; billed by the minute, at least one), on a clock the bench moves (--clock-offset-file, in steps
of at most half the 60 s lease, each waiting for every node's heartbeat at the new time), and
`--spot-nodes` + `--on-demand-nodes` agents on loopback. `--jobs` one-GPU Jobs, every other one with
placement.interruptible Allow (profile Cost: it lands on the interruptible offering), each submitted
when capacity of its kind is free. What the users guess and what really happens, seeded (`--seed`):
  - the guess, spec.expectedDuration, is a whole number of minutes drawn from `--guesses`;
  - the actual run is the guess times a log-normal factor of median 1 and sigma `--spread` (0.3: half
    the runs within 0.82-1.22 of their guess, one in ten past 1.47 times it): a guess is right on the
    median, wrong either way about as often;
  - reclaims of interruptible capacity are a Poisson process at the rate the book declares: each
    attempt on it is reclaimed (NodeService.Reclaim, 60 s grace: it checkpoints, is replaced, restores)
    after an exponential time of running, if it has not finished by then; the checkpoint keeps the work.
A Job's program waits on a gate file the bench creates once the Job has run (over all its attempts, in
coordinator time) its actual duration. The clock moves only while nothing is in transition, so boots,
restores and teardowns take the real seconds they take; the agents read the same offset file
(nodus-agent --clock-offset-file: the times they and their supervisors report move with it), as hosts
keep their clocks in sync with the coordinator's. Each Job's estimate is the create response's
status.estimate.costUSD; its actual cost is status.cost.totalUSD once status.cost.final is true.

Figures, each beside its target:
  1  dry-run latency p50 / p99 with pricing, beside the same dry run without a price book
     (target: the estimate adds at most 5 ms at p99)
  2  how many actual costs were at or below the p90 (target >= 90 %) and the p50 (target 40-60 %),
     with a table per Job, and beside them what the estimator expects of the same seed's draws replayed
     without daemons (`replay`), so a share off target can be told apart as the seed's or the model's
A benchmark, not a test: it asserts nothing. It removes its daemons and temporary directory on exit.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import orjson
import requests
import yaml

import record
from daemons import BIN, start_coordinator, stop_all
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.clock import SystemClock, rfc3339
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet as ResourceFleet
from nodus.coordinator.heap import HeapSettings, settle
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.money.books import PriceBooks
from nodus.coordinator.money.policy import clear_memo
from nodus.coordinator.money.pricebook import parse
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.quote import SPREAD_POINTS, Preview, Shape, Startup, quote
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key
from nodus.v1 import node_pb2, node_pb2_grpc

GI = 1 << 30
JOB = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "quote"},
       "spec": {"command": ["python3", "train.py"], "resources": {"gpu": {"count": 1}}, "expectedDuration": "2h",
                "placement": {"interruptible": "Allow"}}}


def finished(record: int) -> list[dict[str, Any]]:
    """`record` Jobs of the project that succeeded, each declared 2h and run 2h times a log-normal factor
    (median 1, sigma 0.3, seed 0): the record a priced estimate reads its run's spread from."""
    rng, t0, out = random.Random(0), 1_796_000_000.0, []
    for i in range(record):
        ran = 7200 * math.exp(rng.gauss(0, 0.3))
        out.append({"apiVersion": "nodus.dev/v1", "kind": "Job",
                    "metadata": {"name": f"done-{i:05d}", "namespace": "bench", "uid": f"uid-done-{i:05d}"},
                    "spec": {"command": ["python3", "done.py"], "expectedDuration": "2h"},
                    "status": {"phase": "Succeeded", "startTime": rfc3339(t0), "completionTime": rfc3339(t0 + ran)}})
    return out


async def service(root: Path, nodes: int, priced: bool, record: int) -> tuple[ResourceService, SqliteStore, Cache]:
    root.mkdir()
    store = await SqliteStore.open(root / "store.db")
    identity = Identity(store)
    await identity.ensure_project("bench", "bench")
    for job in finished(record):  # in both stores: the same cache either way
        await store.create(f"jobs/bench/{job['metadata']['name']}", orjson.dumps(job))
    offerings = parse(document()).offerings
    expire = rfc3339(time.time() + 86400)
    for i in range(nodes):
        o = offerings[i % len(offerings)]
        assert o.accelerator is not None
        name = f"n{i:05d}"
        await store.create(f"_nodes/{name}", orjson.dumps({
            "name": name, "capacity": {"cpuMillis": 8000, "memoryBytes": 32 * GI, "diskBytes": 100 * GI, "gpus": 1},
            "gpus": [{"index": 0, "name": o.accelerator.family, "memoryBytes": 80 * GI}], "runtimes": ["process"],
            "labels": {}, "region": "us", "offering": o.id}))
        await store.create(f"_leases/{name}", orjson.dumps({"node": name, "expireTime": expire, "expired": False}))
    if priced:
        await PriceBooks(store).apply(document(), rfc3339(time.time()))
    vault = Vault(store, load_or_create_key(root / "secret.key"))
    fleet = ResourceFleet(Cache(store), SystemClock())  # what the coordinator's estimates read, as main.py wires it
    await fleet.cache.start()
    return ResourceService(store, identity, vault, fleet=fleet), store, fleet.cache


def document() -> dict[str, Any]:
    """The operator's document of bench/placement.py's six x1 offerings (its `book()` parses the same)."""
    def offering(oid: str, family: str, rate: str, speed: str, spot: str = "") -> dict[str, Any]:
        o: dict[str, Any] = {
            "id": oid, "accelerator": {"id": f"nvidia-{family.lower()}-sxm-80g", "family": family, "gpusPerNode": 1,
                                       "memory": "80Gi"},
            "vcpu": 8, "memory": "32Gi", "regionClass": "us", "provider": "lab", "region": "us-1",
            "rateUSDPerHour": rate, "billingIncrement": "60s", "minimumCharge": "1m", "relativeSpeed": speed}
        if spot:
            o.update(interruptible=True, interruptionsPerHour=spot)
        return o
    return {"pricebookVersion": "bench", "storageUSDPerGiBMonth": "0.08", "offerings": [
        offering("a100-x1-spot", "A100", "1.10", "0.45", "0.05"), offering("a100-x1", "A100", "2.20", "0.45"),
        offering("h100-x1", "H100", "2.99", "1"), offering("h100-x1-spot", "H100", "1.80", "1", "0.1"),
        offering("l4-x1", "L4", "0.85", "0.12"), offering("b200-x1", "B200", "6.50", "2.2")]}


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(args: argparse.Namespace) -> dict[str, list[float]]:
    info = resolve("jobs")
    with tempfile.TemporaryDirectory() as tmp:
        priced, a, ca = await service(Path(tmp) / "priced", args.nodes, True, args.record)
        plain, b, cb = await service(Path(tmp) / "plain", args.nodes, False, args.record)
        frozen = settle(HeapSettings.of(args.gc_freeze))  # what nodus-coordinator does once its cache has synced
        try:
            times: dict[str, list[float]] = {"priced": [], "plain": [], "priced-gc": [], "plain-gc": [],
                                             "cold": [], "cold-gc": [], "frozen": [float(frozen)],
                                             "priced-cpu": [], "plain-cpu": []}
            for _ in range(args.runs):
                for name, svc in (("priced", priced), ("plain", plain), ("cold", priced)):
                    if name == "cold":  # as the first dry run after the record, the starts or the book changed
                        clear_memo()
                    full = gc.get_stats()[2]["collections"]
                    t, cpu = time.perf_counter(), time.process_time()
                    obj, _ = await svc.create(SYSTEM, info, "bench", copy.deepcopy(JOB), dry_run=True)
                    elapsed = (time.perf_counter() - t) * 1000
                    times[name].append(elapsed)
                    if name != "cold":
                        times[f"{name}-cpu"].append((time.process_time() - cpu) * 1000)
                    if gc.get_stats()[2]["collections"] != full:  # a full collection ran inside this create
                        times[f"{name}-gc"].append(elapsed)
                    estimate = obj["status"]["estimate"]
                    assert estimate["pricebookVersion"] == ("" if name == "plain" else "bench")
                    if name != "plain" and args.record:
                        assert estimate["costUSD"]["p50"] != estimate["costUSD"]["p90"], "priced over the record"
        finally:
            await ca.stop()
            await cb.stop()
            await a.close()
            await b.close()
    return times


def run(args: argparse.Namespace) -> None:
    load = [os.getloadavg()[0]]
    times = asyncio.run(latency(args))
    load.append(os.getloadavg()[0])
    jobs, minutes = accuracy(args)
    load.append(os.getloadavg()[0])
    with record.Report("estimate", args):
        print(f"load average (1 min) before the latency runs / after them / after the accuracy run: "
              f"{' / '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} CPUs")
        pr, pl = times["priced"], times["plain"]
        print(f"dry run of a one-GPU Job over {args.nodes} nodes, {args.runs} runs each, interleaved; the project has "
              f"{args.record} finished Jobs, whose actual/declared record the priced estimate sums its charge over "
              f"(at most {SPREAD_POINTS} points)")
        print(f"priced p50 / p99     {statistics.median(pr):8.2f} ms / {p(pr, 0.99):8.2f} ms    "
              f"without a book {statistics.median(pl):8.2f} ms / {p(pl, 0.99):8.2f} ms")
        print(f"pricing adds at p99  {p(pr, 0.99) - p(pl, 0.99):8.2f} ms    target <= 5 ms")
        cp, cl = times["priced-cpu"], times["plain-cpu"]
        print(f"  in CPU time (the process's, every thread; not stretched by other work on the host): priced "
              f"p50 / p99 {statistics.median(cp):.2f} / {p(cp, 0.99):.2f} ms, without a book {statistics.median(cl):.2f} / "
              f"{p(cl, 0.99):.2f} ms: pricing adds {p(cp, 0.99) - p(cl, 0.99):.2f} ms at p99")
        cold = times["cold"]
        print(f"  memos cleared before each priced run (the first dry run after the record, the measured starts or "
              f"the book changed): p50 / p99 {statistics.median(cold):.2f} / {p(cold, 0.99):.2f} ms, adds "
              f"{p(cold, 0.99) - p(pl, 0.99):.2f} ms at p99 (money/estimate.py and policy.py memoize the bands, "
              f"expected charges and outlooks, ADR 0052)")
        gp, gl = times["priced-gc"], times["plain-gc"]
        print(f"  runs with a full (generation 2) garbage collection inside: priced {len(gp)}"
              f"{f' (median {statistics.median(gp):.2f} ms)' if gp else ''}, without a book {len(gl)}"
              f"{f' (median {statistics.median(gl):.2f} ms)' if gl else ''}; at p50 pricing adds "
              f"{statistics.median(pr) - statistics.median(pl):.2f} ms")
        print(f"  --gc-freeze {args.gc_freeze} (as nodus-coordinator after start-up): {times['frozen'][0]:.0f} objects frozen")
        report_accuracy(args, jobs, minutes)


# -- accuracy: real daemons, real charges ------------------------------------------------------------------

NS = "/apis/nodus.dev/v1/namespaces/default"
SPOT, ON_DEMAND = "a100-dev-spot", "a100-dev"
STEP = 30.0
"""Seconds of coordinator time per clock step at most: half the 60 s lease, and each step waits for every
node's heartbeat at the new time, so no healthy node looks lost however loaded the machine is."""
TERMINAL = {"Succeeded", "Failed", "Lost", "Cancelled"}
ENDED = {"Succeeded", "Failed"}
PROGRAM = ("import os, sys, time\n"
           "state = os.environ.get('NODUS_STATE_DIR')\n"
           "if state:\n"
           "    open(os.path.join(state, 'alive'), 'w').write('1')\n"
           "while not os.path.exists(sys.argv[1]):\n"
           "    time.sleep(0.2)\n")
"""A Job's work: it runs until the bench opens its gate (once its coordinator-time duration has run)."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def book(path: Path, interruptions_per_hour: str) -> Path:
    """Two one-GPU dev offerings this host fits (1 vCPU, 1Gi, a simulated A100): an interruptible one
    reclaimed `interruptions_per_hour`, and an on-demand one at twice its rate; by the minute, at least one."""
    def offering(oid: str, rate: str, spot: bool) -> dict[str, Any]:
        o: dict[str, Any] = {
            "id": oid, "accelerator": {"id": "nvidia-a100-sxm-80g", "family": "A100", "gpusPerNode": 1,
                                       "memory": "80Gi", "interconnect": "PCIe"},
            "vcpu": 1, "memory": "1Gi", "disk": "1Gi", "regionClass": "us", "provider": "dev", "region": "local",
            "rateUSDPerHour": rate, "interruptible": spot, "billingIncrement": "60s", "minimumCharge": "1m",
            "relativeSpeed": "1"}
        if spot:
            o["interruptionsPerHour"] = interruptions_per_hour
        return o
    path.write_text(yaml.safe_dump({"pricebookVersion": "bench-accuracy", "storageUSDPerGiBMonth": "0.08",
                                    "offerings": [offering(SPOT, "1.10", True), offering(ON_DEMAND, "2.20", False)]}))
    return path


@dataclass
class Planned:
    """One Job of the run: what its user guessed, what it really runs, and what came of it."""

    name: str
    spot: bool
    guess_s: int
    actual_s: int
    gate: Path
    p50: Decimal | None = None
    p90: Decimal | None = None
    offering: str = ""
    cost: Decimal | None = None
    segments: dict[str, str] = field(default_factory=dict)
    created: bool = False
    opened: bool = False
    done: bool = False
    reclaims: int = 0
    recorded: float | None = None
    """The Job's run over its guess as the coordinator records it for later estimates (status.startTime to
    completionTime; controllers/fleet.py overruns)."""
    unpriced: bool = False
    """The estimate said Unpriced (no offering fitted at that moment): its costUSD is 0.00."""


def plan(args: argparse.Namespace, gates: Path) -> list[Planned]:
    """Seeded: the guesses, which Jobs may use interruptible capacity (every other one), and the actual run
    time of each, the guess times a log-normal factor of median 1 and `--spread` sigma."""
    rng = random.Random(args.seed)
    out = []
    for i in range(args.jobs):
        guess = rng.choice([int(g) for g in args.guesses.split(",")]) * 60
        factor = math.exp(rng.gauss(0.0, 1.0) * args.spread)  # drawn even at 0: the same seed, the same guesses
        out.append(Planned(f"e{i:03d}", i % 2 == 0, guess, max(30, round(guess * factor)), gates / f"e{i:03d}"))
    return out


def reclaim_after(args: argparse.Namespace, job: Planned, number: int) -> float:
    """Seconds of running after which attempt `number` of `job` is reclaimed: exponential at the offering's
    interruptionsPerHour (reclaims are a Poisson process at the rate the book declares), seeded per attempt."""
    rate = float(Decimal(args.interruptions_per_hour)) / 3600
    if rate <= 0:
        return math.inf
    return random.Random(f"{args.seed}/{job.name}/{number}").expovariate(rate)


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Fleet:
    """A real nodus-coordinator on a clock the bench moves (--clock-offset-file) and real agents on loopback,
    in a temporary directory; `stop` ends every process they started."""

    def __init__(self, root: Path, spot: int, on_demand: int, interruptions_per_hour: str) -> None:
        self.root, self.offset_file, self.offset = root, root / "clock-offset", 0.0
        self.offset_file.write_text("0")
        self.book = book(root / "pricebook.yaml", interruptions_per_hour)
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.kinds = {f"spot-{i}": SPOT for i in range(1, spot + 1)} | {f"od-{i}": ON_DEMAND for i in range(1, on_demand + 1)}
        self.session = requests.Session()
        self.session.trust_env = False
        self.http = self.grpc = self.token = ""
        self.channel: grpc.Channel | None = None

    def start(self) -> None:
        started = start_coordinator(self.root, "--price-book", str(self.book), "--lease-duration", "60s",
                                    "--heartbeat-interval", "1s", "--clock-offset-file", str(self.offset_file))
        self.coordinator, self.http, self.grpc, data = started.proc, started.http, started.grpc, started.data
        self.session.verify = str(started.ca)
        self.token = started.token  # the operator's: Reclaim, ListNodes
        self.session.headers["Authorization"] = "Bearer " + self.token
        self.channel = grpc.secure_channel(self.grpc, grpc.ssl_channel_credentials((data / "tls" / "ca.crt").read_bytes()))
        token = self.root / "join-token"
        shutil.copy(data / "join-token", token)
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        for name, offering in self.kinds.items():
            with open(self.root / f"{name}.log", "ab") as out:
                self.agents[name] = subprocess.Popen(
                    [str(BIN / "nodus-agent"), "--coordinator", self.grpc, "--node", name, "--work-dir",
                     str(self.root / name), "--join-token-file", str(token), "--log-level", "WARNING",
                     "--runtime", "process", "--poll-interval", "0.1", "--stop-grace", "3", "--attempt-uids", "off",
                     "--coordinator-ca", str(data / "tls" / "ca.crt"), "--clock-offset-file", str(self.offset_file),
                     "--simulate-gpus", "A100:1:80Gi", "--offering", offering, "--region", "us",
                     "--interruptible", "true" if offering == SPOT else "false"],
                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.cli("nodus", "credits", "grant", "--project", "default", "1000.00")
        deadline = time.monotonic() + 60
        while {n.name for n in self.nodes() if n.phase == node_pb2.NODE_PHASE_READY} != set(self.kinds):
            if time.monotonic() > deadline:
                raise RuntimeError("the agents did not join: " + "; ".join(
                    (self.root / f"{n}.log").read_text()[-500:] for n in self.kinds))
            time.sleep(0.2)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        stop_all([*self.agents.values(), self.coordinator], [self.root / n for n in self.kinds])

    def cli(self, *argv: str) -> str:
        tool, *rest = argv
        env = {**os.environ, "NODUS_KUBECONFIG": str(self.root / "data" / "kubeconfig"), "NODUS_COORDINATOR": self.grpc,
               "KUBECONFIG": str(self.root / "data" / "kubeconfig"), "HOME": str(self.root)}
        r = subprocess.run([str(BIN / tool), *rest], capture_output=True, text=True, timeout=60, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr}")
        return r.stdout

    def now(self) -> float:
        """The coordinator's clock."""
        return time.time() + self.offset

    def _md(self) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.token}"),)

    def nodes(self) -> list[Any]:
        stub = node_pb2_grpc.NodeServiceStub(self.channel)
        return list(stub.ListNodes(node_pb2.ListNodesRequest(), metadata=self._md(), timeout=10).nodes)

    def reclaim(self, node: str) -> None:
        node_pb2_grpc.NodeServiceStub(self.channel).Reclaim(
            node_pb2.ReclaimRequest(name=node, grace_seconds=60, message="bench: interruptible capacity reclaimed"),
            metadata=self._md(), timeout=10)

    def uncordon(self, node: str) -> None:
        node_pb2_grpc.NodeServiceStub(self.channel).Uncordon(node_pb2.UncordonRequest(name=node), metadata=self._md(),
                                                            timeout=10)

    def advance(self, seconds: float) -> None:
        """Moves the coordinator's clock forward by `seconds` (at most STEP), then waits until every node
        has heartbeated at the new time."""
        self.offset += seconds
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(repr(self.offset))
        os.replace(tmp, self.offset_file)
        since = self.now() - 0.5
        deadline = time.monotonic() + 30
        while not all(n.last_heartbeat_time.ToNanoseconds() / 1e9 >= since for n in self.nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError("a node did not heartbeat at the new time within 30 s")
            time.sleep(0.1)

    def get(self, path: str) -> Any:
        r = self.session.get(self.http + NS + path, timeout=30)
        r.raise_for_status()
        return r.json()


def worked(attempts: list[dict[str, Any]], now: float) -> float:
    """Coordinator seconds the Job's program has run, over all its attempts (a reclaim's checkpoint keeps
    the work done: what ran until the stop was asked counts)."""
    total = 0.0
    for a in attempts:
        st = a.get("status") or {}
        start = parse_time(st.get("startTime"))
        if start is None:
            continue
        ends = [t for t in (parse_time(((a.get("spec") or {}).get("stop") or {}).get("time")),
                            parse_time(st.get("finishTime")), parse_time(st.get("lostTime"))) if t is not None]
        total += max(0.0, (min(ends) if ends else now) - start)
    return total


def accuracy(args: argparse.Namespace) -> tuple[list[Planned], float]:
    """Runs the planned Jobs on a real fleet; returns them with their estimates and charges, and the
    coordinator-time minutes the run spanned."""
    with tempfile.TemporaryDirectory(prefix="nodus-estimate-") as tmp:
        root = Path(tmp)
        (root / "gates").mkdir()
        jobs = plan(args, root / "gates")
        fleet = Fleet(root, args.spot_nodes, args.on_demand_nodes, args.interruptions_per_hour)
        try:
            fleet.start()
            began = fleet.now()
            drive(args, fleet, jobs)
            return jobs, (fleet.now() - began) / 60
        finally:
            fleet.stop()


def drive(args: argparse.Namespace, fleet: Fleet, jobs: list[Planned]) -> None:
    """Submits each Job when capacity of its kind is free (as users do, so the estimate's preview is where
    it runs), opens its gate once it has run its duration, reclaims interruptible attempts at their drawn
    times, and moves the clock only while nothing is in transition (boots, restores and teardowns take the
    real time they take; only the work's own duration is played fast)."""
    reclaimed: dict[str, str] = {}  # attempt name -> its node, until the node is uncordoned
    deadline = time.monotonic() + args.wall_limit
    settle_since: float | None = None
    while not all(j.done for j in jobs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not finish within {args.wall_limit} s of wall time: "
                               + ", ".join(j.name for j in jobs if not j.done))
        now = fleet.now()
        listed = {j["metadata"]["name"]: j for j in fleet.get("/jobs")["items"]}
        attempts: dict[str, list[dict[str, Any]]] = {}
        for a in fleet.get("/attempts")["items"]:
            attempts.setdefault(a["spec"].get("job", ""), []).append(a)
        phase_of = {a["metadata"]["name"]: (a.get("status") or {}).get("phase") for lst in attempts.values()
                    for a in lst}
        for name, node in list(reclaimed.items()):
            if phase_of.get(name) in TERMINAL | {None}:
                fleet.uncordon(node)
                del reclaimed[name]
        cordoned = set(reclaimed.values())
        held = {a["spec"].get("node", "") for lst in attempts.values() for a in lst
                if phase_of[a["metadata"]["name"]] not in TERMINAL and a["spec"].get("node")}
        idle = {n: k for n, k in fleet.kinds.items() if n not in held and n not in cordoned}
        transition = False
        events: list[float] = []
        for job in (j for j in jobs if j.created and not j.done):
            status = listed[job.name].get("status") or {}
            mine = attempts.get(job.name, [])
            if status.get("phase") in ENDED:
                cost = status.get("cost") or {}
                if not cost.get("final"):
                    transition = True  # the last charges are being posted
                    continue
                job.done, job.cost = True, Decimal(cost["totalUSD"])
                job.segments = dict(cost.get("bySegment") or {})
                began, ended = parse_time(status.get("startTime")), parse_time(status.get("completionTime"))
                if began is not None and ended is not None:
                    job.recorded = (ended - began) / job.guess_s
                ordered = sorted(mine, key=lambda a: int(a["spec"].get("number", 1)))
                job.offering = ",".join(dict.fromkeys(str(a["spec"].get("offering", "")) for a in ordered))
                if status["phase"] != "Succeeded":
                    log(f"{job.name} ended {status['phase']}: {status.get('reason')} {status.get('message')}")
                continue
            live = [a for a in mine if phase_of[a["metadata"]["name"]] not in TERMINAL]
            placed = [a for a in live if a["spec"].get("node")]
            running = [a for a in placed if phase_of[a["metadata"]["name"]] == "Running"
                       and not a["spec"].get("stop") and (a.get("status") or {}).get("startTime")]
            fits = bool(idle) if job.spot else ON_DEMAND in idle.values()
            if job.opened or len(placed) != len(running) or (len(placed) < 1 and fits):
                transition = True  # booting, stopping, being placed or replaced, finishing: real time passes
                continue
            if not running:
                continue  # waiting for capacity: time must pass for it
            left = job.actual_s - worked(mine, now)
            if left <= 0:
                job.gate.touch()
                job.opened, transition = True, True
                continue
            events.append(left)
            a = running[0]
            node, number = a["spec"].get("node", ""), int(a["spec"].get("number", 1))
            if fleet.kinds.get(node) == SPOT:
                ran = now - (parse_time(a["status"]["startTime"]) or now)
                due = reclaim_after(args, job, number) - ran
                if due <= 0:
                    log(f"reclaim {node} under {job.name} attempt {number} after {ran:.0f} s of running")
                    fleet.reclaim(node)
                    reclaimed[a["metadata"]["name"]] = node
                    job.reclaims += 1
                    transition = True
                else:
                    events.append(due)
        for kind in (SPOT, ON_DEMAND):
            nodes = sum(1 for k in fleet.kinds.values() if k == kind)
            mine_kind = [j for j in jobs if j.spot == (kind == SPOT)]
            unfinished = sum(1 for j in mine_kind if j.created and not j.done)
            free = sum(1 for k in idle.values() if k == kind)
            for job in [j for j in mine_kind if not j.created][:max(0, nodes - unfinished)]:
                if free <= 0:
                    break  # its node is still held (a teardown, a reclaim's replacement): wait for it
                submit(fleet, job)
                free -= 1
                transition = True
        if transition:
            settle_since = settle_since or time.monotonic()
            if time.monotonic() - settle_since < args.settle_limit:
                time.sleep(0.2)
                continue
            log("still in transition after the settle limit: the clock moves anyway")
        settle_since = None
        if not all(j.done for j in jobs):
            fleet.advance(min([STEP, *[max(1.0, float(math.ceil(e))) for e in events]]))


def submit(fleet: Fleet, job: Planned) -> None:
    placement = {"profile": "Cost", "interruptible": "Allow" if job.spot else "Never"}
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": job.name},
            "spec": {"command": ["python3", "-c", PROGRAM, str(job.gate)], "resources": {"gpu": {"count": 1}},
                     "expectedDuration": f"{job.guess_s // 60}m", "placement": placement}}
    r = fleet.session.post(fleet.http + NS + "/jobs", json=body, timeout=30)
    if r.status_code != 201:
        raise RuntimeError(f"create {job.name}: {r.status_code} {r.text}")
    estimate = r.json()["status"]["estimate"]
    job.p50, job.p90 = Decimal(estimate["costUSD"]["p50"]), Decimal(estimate["costUSD"]["p90"])
    job.unpriced = any(w.get("code") == "Unpriced" for w in estimate.get("warnings") or [])
    job.created = True


def replay(args: argparse.Namespace) -> tuple[int, int, int]:
    """The same seed's draws (guesses, actual runs, reclaim times) through the estimator alone, no daemons:
    what this model expects of these very Jobs, so a share off its target can be told apart as the
    seed's draws or the model's error. The first Jobs of each kind (one per node) are quoted with no
    record, each later one with the runs of the Jobs before it in plan order; boots take 1 s, a reclaimed
    allocation 3 s more (its grace). Returns (at or below the p50, at or below the p90, Jobs)."""
    with tempfile.TemporaryDirectory(prefix="nodus-estimate-replay-") as tmp:
        priced = parse(yaml.safe_load(book(Path(tmp) / "pricebook.yaml", args.interruptions_per_hour).read_text()))
        jobs = plan(args, Path(tmp))
    boot, at50, at90 = Decimal(1), 0, 0
    record: list[Decimal] = []
    starts: dict[bool, list[Decimal]] = {True: [], False: []}
    seen = {True: 0, False: 0}
    for job in jobs:
        offering = priced.offering(SPOT if job.spot else ON_DEMAND)
        assert offering is not None
        left, allocations, number = float(job.actual_s), [], 1
        while (ran := reclaim_after(args, job, number) if job.spot else math.inf) < left:
            allocations.append(float(boot) + ran + 3)
            left, number = left - ran, number + 1
        allocations.append(float(boot) + left)
        charged = sum((Tariff.of(offering).charge(Decimal(str(round(a, 3)))) for a in allocations), Decimal(0))
        first = seen[job.spot] < (args.spot_nodes if job.spot else args.on_demand_nodes)
        seen[job.spot] += 1
        estimate = quote(priced, Shape.of({"expectedDuration": f"{job.guess_s // 60}m"}, overruns=[] if first else record),
                         Preview(offering, ""), Startup(cold=() if first else tuple(starts[job.spot])), 0.0)
        at50 += charged <= Decimal(estimate["costUSD"]["p50"])
        at90 += charged <= Decimal(estimate["costUSD"]["p90"])
        starts[job.spot] += [boot] * len(allocations)
        record.append(Decimal(job.actual_s) / Decimal(job.guess_s))
    return at50, at90, len(jobs)


def pct(n: int, of: int) -> str:
    return f"{Decimal(100 * n) / Decimal(max(of, 1)):.1f}"


def report_accuracy(args: argparse.Namespace, jobs: list[Planned], minutes: float) -> None:
    n = len(jobs)
    at90 = sum(1 for j in jobs if j.cost is not None and j.p90 is not None and j.cost <= j.p90)
    at50 = sum(1 for j in jobs if j.cost is not None and j.p50 is not None and j.cost <= j.p50)
    spot = sum(1 for j in jobs if j.spot)
    hit = sum(1 for j in jobs if j.reclaims)
    print(f"accuracy over {n} Jobs on a real coordinator and {args.spot_nodes + args.on_demand_nodes} agents "
          f"({spot} allowed interruptible capacity, {hit} reclaimed mid-run), {minutes:.0f} min of coordinator time")
    print(f"  actual run = expectedDuration x log-normal factor (median 1, sigma {args.spread}), seed {args.seed}; "
          f"reclaims Poisson at the book's {args.interruptions_per_hour}/h")
    print(f"actual <= p90  {at90:4d} of {n:<4d} ({pct(at90, n)} %)    target >= 90 %")
    print(f"actual <= p50  {at50:4d} of {n:<4d} ({pct(at50, n)} %)    target 40-60 %")
    below = sum(1 for j in jobs if j.cost is not None and j.p50 is not None and j.cost < j.p50)
    print(f"  actual < p50 {below:4d} of {n:<4d} ({pct(below, n)} %)    (costs come in whole increments: the p50 is "
          f"the charge whose modelled share at or below it is nearest a half, ADR 0026)")
    r50, r90, rn = replay(args)
    print(f"  the same draws replayed through the estimator without daemons (what the model expects of these Jobs, "
          f"1 s boots, plan order): <= p90 {r90} of {rn} ({pct(r90, rn)} %), <= p50 {r50} of {rn} ({pct(r50, rn)} %)")
    for label, kind in (("interruptible allowed", True), ("on-demand only", False)):
        part = [j for j in jobs if j.spot == kind]
        p90s = sum(1 for j in part if j.cost is not None and j.p90 is not None and j.cost <= j.p90)
        p50s = sum(1 for j in part if j.cost is not None and j.p50 is not None and j.cost <= j.p50)
        print(f"  {label:22s} <= p90 {p90s} of {len(part)}, <= p50 {p50s} of {len(part)}")
    print(f"  {'job':6s} {'offering':24s} {'guess':>6s} {'actual':>7s} {'p50':>7s} {'p90':>7s} {'cost':>7s}  "
          f"{'reclaims':>8s} {'record':>6s}  segments (boot/running/restore/teardown, covered)")
    for j in jobs:
        seg = j.segments
        covered = ",".join(seg.get("coveredByNodus") or []) if isinstance(seg.get("coveredByNodus"), list) else \
            str(seg.get("coveredByNodus") or "")
        print(f"  {j.name:6s} {j.offering:24s} {j.guess_s / 60:5.0f}m {j.actual_s / 60:6.1f}m {j.p50!s:>7s} "
              f"{j.p90!s:>7s} {j.cost!s:>7s}  {j.reclaims:8d} {'-' if j.recorded is None else f'{j.recorded:.2f}':>6s}  {seg.get('bootUSD', '-')}/{seg.get('runningUSD', '-')}/"
              f"{seg.get('restoreUSD', '-')}/{seg.get('teardownUSD', '-')} {covered}{' (estimate Unpriced)' if j.unpriced else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--record", type=int, default=200,
                    help="finished Jobs of the project in the latency stores: the record the estimate's spread reads")
    ap.add_argument("--jobs", type=int, default=30, help="Jobs whose actual cost is compared with their estimate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--spread", type=float, default=0.3,
                    help="sigma of the log-normal factor from the guess to the actual run (0: the guess is exact)")
    ap.add_argument("--guesses", default="3,4,5,6,8,10,12", help="the expectedDuration minutes guesses are drawn from")
    ap.add_argument("--interruptions-per-hour", default="4",
                    help="the interruptible offering's interruptionsPerHour, and the rate the bench reclaims it at")
    ap.add_argument("--gc-freeze", choices=("on", "off"), default="on",
                    help="settle the heap after the stores and caches are up as nodus-coordinator --gc-freeze does")
    ap.add_argument("--spot-nodes", type=int, default=2)
    ap.add_argument("--on-demand-nodes", type=int, default=2)
    ap.add_argument("--settle-limit", type=float, default=20.0,
                    help="wall seconds the clock waits for a boot, restore or teardown before it moves anyway")
    ap.add_argument("--wall-limit", type=float, default=3000.0, help="wall seconds the accuracy run may take")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"nodes": 12, "runs": 20, "record": 10, "jobs": 4, "guesses": "1,2",
                                           "wall_limit": 150.0})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the daemons and the temporary directory go too
    run(args)


if __name__ == "__main__":
    main()
