#!/usr/bin/env python3
"""What an estimate adds to a dry run: the real resource service in-process, no HTTP, no daemons.

    .venv/bin/python bench/estimate.py [--nodes 200] [--runs 300]

Two stores on SQLite, each with the same fleet (`--nodes` one-GPU nodes, leases fresh, sold round-robin
as bench/placement.py's six x1 offerings), one with that price book active and one without. A dry run
(`create(..., dry_run=True)` of a one-GPU Job with expectedDuration) runs `--runs` times on each,
interleaved, so both see the same machine. Figures, each beside its anchor measured in the same run:
  1  dry-run latency p50 / p99 with pricing, beside the same dry run without a price book
     (target: the estimate adds at most 5 ms at p99)
  2  accuracy (actual costs at or below the p90 and the p50): not measurable yet, and why
A benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import record
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.clock import SystemClock, rfc3339
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.money.books import PriceBooks
from nodus.coordinator.money.pricebook import parse
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key

GI = 1 << 30
JOB = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "quote"},
       "spec": {"command": ["python3", "train.py"], "resources": {"gpu": {"count": 1}}, "expectedDuration": "2h",
                "placement": {"interruptible": "Allow"}}}


async def service(root: Path, nodes: int, priced: bool) -> tuple[ResourceService, SqliteStore, Cache]:
    root.mkdir()
    store = await SqliteStore.open(root / "store.db")
    identity = Identity(store)
    await identity.ensure_project("bench", "bench")
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
    fleet = Fleet(Cache(store), SystemClock())  # what the coordinator's estimates read, as main.py wires it
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


async def run(args: argparse.Namespace) -> None:
    info = resolve("jobs")
    with tempfile.TemporaryDirectory() as tmp:
        priced, a, ca = await service(Path(tmp) / "priced", args.nodes, True)
        plain, b, cb = await service(Path(tmp) / "plain", args.nodes, False)
        try:
            times: dict[str, list[float]] = {"priced": [], "plain": []}
            for _ in range(args.runs):
                for name, svc in (("priced", priced), ("plain", plain)):
                    t = time.perf_counter()
                    obj, _ = await svc.create(SYSTEM, info, "bench", copy.deepcopy(JOB), dry_run=True)
                    times[name].append((time.perf_counter() - t) * 1000)
                    assert obj["status"]["estimate"]["pricebookVersion"] == ("bench" if name == "priced" else "")
        finally:
            await ca.stop()
            await cb.stop()
            await a.close()
            await b.close()
    with record.Report("estimate", args):
        pr, pl = times["priced"], times["plain"]
        print(f"dry run of a one-GPU Job over {args.nodes} nodes, {args.runs} runs each, interleaved")
        print(f"priced p50 / p99     {statistics.median(pr):8.2f} ms / {p(pr, 0.99):8.2f} ms    "
              f"without a book {statistics.median(pl):8.2f} ms / {p(pl, 0.99):8.2f} ms")
        print(f"pricing adds at p99  {p(pr, 0.99) - p(pl, 0.99):8.2f} ms    target <= 5 ms")
        print("accuracy (actual <= p90, <= p50)  not measurable yet: no actual costs exist until the ledger "
              "posts charges (issue 12, part 4)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--runs", type=int, default=300)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"nodes": 12, "runs": 20})
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
