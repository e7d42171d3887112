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
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import record
from estimate_accuracy import accuracy, report_accuracy
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.clock import SystemClock, rfc3339
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet as ResourceFleet
from nodus.coordinator.heap import HeapSettings, settle
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.money.books import PriceBooks
from nodus.coordinator.money.policy import clear_memo
from nodus.coordinator.money.pricebook import parse
from nodus.coordinator.money.quote import SPREAD_POINTS
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key

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
