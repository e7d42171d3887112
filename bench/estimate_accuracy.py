#!/usr/bin/env python3
"""bench/estimate.py's second figure: how often the actual cost falls within the estimate, with real daemons.

Run through bench/estimate.py (its docstring says what this part measures); split from it to keep each module
under 500 lines.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import shutil
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
import requests
import yaml

from daemons import BIN, start_coordinator, stop_all
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.pricebook import parse
from nodus.coordinator.money.quote import Preview, Shape, Startup, quote
from nodus.v1 import node_pb2, node_pb2_grpc

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
