#!/usr/bin/env python3
"""Sweep expansion benchmark: a 10,000-cell Sweep admitted and fully expanded by a real coordinator,
beside the same number of plain Jobs created through the API in the same run.

    .venv/bin/python bench/sweep.py [--cells 10000] [--max-parallel 256] [--concurrency 64]

No agent joins, and the template's `placement.queueTimeout` is 1ms: every cell Job is admitted, queued
and failed with CapacityUnavailable at once, so a slot frees as fast as the coordinator can turn a cell
over and the expansion measures the controllers, not a workload. Figures, each beside its anchor:
  1  admit: POST of the Sweep to its 201 (target ≤ 2 s)
  2  cells created/s: the cells' count over the time from the Sweep's POST to the last cell's ADDED event
     on a watch of the cell Jobs opened before the POST (creationTimestamp has whole seconds only)
     (target ≥ 500/s), beside plain Jobs created/s: the same bodies POSTed by CONCURRENCY clients to a
     fresh coordinator with the same flags
  3  store writes per cell transition: the store's log (every write is a revision) from the Sweep's
     create to its end, split by what was written (the Sweep, its cells, their Attempts, the rest),
     over the cells' phase changes (each cell Job write whose status.phase differs from its last);
     the plain Jobs' writes per phase change beside it (from their first create to 2 s after the last:
     10,000 queued plain Jobs take the Job controller many minutes to fail), and the Sweep's status
     bytes written (a Sweep of more than 256 cells stores its summary only, ADR 0028)
  4  GET of the running Sweep (its status.cells built from the cell Jobs), one every GET_EVERY_S seconds
     (the end of the Sweep is seen on a watch of it, which carries its summary), beside GET of a plain Job
  5  the coordinator's CPU seconds per cell created (from the POST to the last cell seen) beside its CPU
     seconds per plain Job while they were POSTed: a figure the host's load bends less than the rates
A benchmark, not a test: it asserts nothing. Each coordinator is started through bench/daemons.py.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import ssl
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, Callable

import aiohttp
import orjson
import psutil

import record
from nodus.coordinator.controllers.job_controller import WORKERS as JOB_WORKERS
from daemons import Coordinator, start_coordinator, stop_all

NS = "/apis/nodus.dev/v1/namespaces/default"
TARGET_ADMIT_S, TARGET_CELLS_PER_S = 2.0, 500.0
FLAGS = ("--compact-interval", "3600")
"""No compaction within a run: the store's log keeps every write for the count."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def template() -> dict[str, Any]:
    return {"command": ["true"], "placement": {"queueTimeout": "1ms"}}


def matrix(cells: int) -> dict[str, list[str]]:
    """Two parameters whose product is `cells` (A × B, B the largest divisor ≤ √cells)."""
    b = max(d for d in range(1, int(cells ** 0.5) + 1) if cells % d == 0)
    return {"A": [str(i) for i in range(cells // b)], "B": [str(i) for i in range(b)]}


def session(c: Coordinator, limit: int) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(c.ca))
    return aiohttp.ClientSession(base_url=c.http, connector=aiohttp.TCPConnector(limit=limit, ssl=ctx),
                                 timeout=aiohttp.ClientTimeout(total=600),
                                 headers={"Authorization": f"Bearer {c.token}", "Content-Type": "application/json"})


@dataclass
class Writes:
    """The store's log between two revisions, by what was written."""

    by_kind: Counter[str]
    phase_changes: int
    sweep_bytes: int
    sweep_last: int = 0
    """Bytes of the Sweep's last stored write."""
    rows_stored: bool = False
    """Whether that write held status.cells (a small Sweep) or the summary only (a large one)."""

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def writes(data: Path, after: int, sweep: str = "") -> Writes:
    """Counts the log rows after revision `after`: Sweeps, cell or plain Jobs, Attempts, anything else;
    and the Jobs' phase changes (a write whose status.phase differs from the key's previous write)."""
    db = sqlite3.connect(f"file:{data / 'store.db'}?mode=ro", uri=True)
    try:
        kinds: Counter[str] = Counter()
        last: dict[str, str] = {}
        changes = sweep_bytes = sweep_last = 0
        rows_stored = False
        for key, value in db.execute("SELECT key, value FROM log WHERE revision > ? ORDER BY revision", (after,)):
            kind = key.split("/", 1)[0]
            kinds[kind] += 1
            if kind == "sweeps" and key.endswith(f"/{sweep}"):
                sweep_bytes += len(value)
                sweep_last = len(value)
                rows_stored = "cells" in (orjson.loads(value).get("status") or {})
            if kind == "jobs":
                phase = str((orjson.loads(value).get("status") or {}).get("phase") or "")
                if phase != last.get(key, ""):
                    changes += 1
                last[key] = phase
        return Writes(kinds, changes, sweep_bytes, sweep_last, rows_stored)
    finally:
        db.close()


def head(data: Path) -> int:
    db = sqlite3.connect(f"file:{data / 'store.db'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0])
    finally:
        db.close()


TERMINAL = ("Succeeded", "Failed", "Cancelled")
GET_EVERY_S = 15.0
"""Seconds between the timed GETs of the running Sweep: a 10,000-cell GET is ~1 MB built from the cell
Jobs (~0.6 s of the coordinator's loop under load), paid by the cells it measures; one every 5 s, as
the end was polled before, cost ~0.9 ms of CPU per cell of a 10,000-cell run."""


async def wait_terminal(s: aiohttp.ClientSession, name: str, rv: str, limit: float) -> None:
    """Follows a watch of the Sweep `name` from `rv` until its phase is terminal: after its initial
    events (none here: it starts at `rv`) a large Sweep's events carry its stored summary (ADR 0028), so
    following it costs the coordinator nothing per cell."""
    params = {"watch": "1", "fieldSelector": f"metadata.name={name}", "resourceVersion": rv,
              "timeoutSeconds": str(int(limit))}
    async with s.get(f"{NS}/sweeps", params=params, timeout=aiohttp.ClientTimeout(total=None)) as r:
        async for line in r.content:
            if line.strip() and ((orjson.loads(line).get("object") or {}).get("status") or {}).get("phase") \
                    in TERMINAL:
                return
    raise RuntimeError(f"Sweep {name}: not finished after {limit:.0f} s")


async def timed_gets(s: aiohttp.ClientSession, path: str, took: list[float]) -> None:
    """GETs `path` every GET_EVERY_S seconds (the first after 5 s), the seconds of each going to `took`."""
    await asyncio.sleep(5.0)
    while True:
        t0 = time.monotonic()
        async with s.get(path) as r:
            await r.read()
        took.append(time.monotonic() - t0)
        await asyncio.sleep(GET_EVERY_S)


def cpu_seconds(c: Coordinator) -> float:
    """The coordinator process's CPU time so far (user + system)."""
    times = psutil.Process(c.proc.pid).cpu_times()
    return float(times.user + times.system)


async def watch_added(s: aiohttp.ClientSession, selector: str, expect: int, seen: list[float],
                      on_last: Callable[[], None] = lambda: None) -> None:
    """Appends the monotonic time of each Job matching `selector` first seen ADDED on a watch, until
    `expect` distinct Jobs were seen (then calls `on_last`); the watch starts at the list's
    resourceVersion, so no create is missed."""
    async with s.get(f"{NS}/jobs", params={"labelSelector": selector, "limit": "1"}) as r:
        rv = orjson.loads(await r.read())["metadata"]["resourceVersion"]
    names: set[str] = set()
    while len(names) < expect:
        params = {"watch": "1", "labelSelector": selector, "resourceVersion": rv, "timeoutSeconds": "1800"}
        async with s.get(f"{NS}/jobs", params=params, timeout=aiohttp.ClientTimeout(total=None)) as r:
            async for line in r.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                obj = event.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                name = (obj.get("metadata") or {}).get("name")
                if event.get("type") == "ADDED" and name and name not in names:
                    names.add(name)
                    seen.append(time.monotonic())
                    if len(names) >= expect:
                        on_last()
                        return


@dataclass
class SweepRun:
    admit_s: float
    created: int
    expand_s: float
    finished_s: float
    writes: Writes
    status_bytes: int
    gets: list[float]
    """Seconds of each GET of the Sweep while it ran (its status.cells built from the cell Jobs)."""
    cpu_s: float
    """The coordinator's CPU seconds from the POST to the last cell's ADDED (the bench's GETs included)."""


async def run_sweep(c: Coordinator, cells: int, max_parallel: int) -> SweepRun:
    body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "big"}, "spec": {
        "template": {"kind": "Job", "spec": template()}, "matrix": {"params": matrix(cells)},
        "maxParallel": max_parallel}}
    async with session(c, 4) as s:
        before = head(c.data)
        seen: list[float] = []
        cpu: list[float] = []
        watcher = asyncio.create_task(watch_added(s, "nodus.dev/sweep=big", cells, seen,
                                                  lambda: cpu.append(cpu_seconds(c))))
        await asyncio.sleep(0.5)  # the watch is open before the POST
        cpu.append(cpu_seconds(c))
        t0 = time.monotonic()
        async with s.post(f"{NS}/sweeps", data=orjson.dumps(body)) as r:
            text = await r.read()
            if r.status != 201:
                raise RuntimeError(f"the Sweep was refused: {r.status} {text[:500]!r}")
        admit = time.monotonic() - t0
        gets: list[float] = []
        getter = asyncio.create_task(timed_gets(s, f"{NS}/sweeps/big", gets))
        try:
            await wait_terminal(s, "big", orjson.loads(text)["metadata"]["resourceVersion"], 1800)
        finally:
            getter.cancel()
        finished = time.monotonic() - t0
        await asyncio.wait_for(watcher, 60)
        async with s.get(f"{NS}/sweeps/big") as r:  # the finished Sweep as served, its rows built from the cells
            done = orjson.loads(await r.read())
        if not gets:  # a run shorter than the first GET's wait: time this one
            g0 = time.monotonic()
            async with s.get(f"{NS}/sweeps/big") as r:
                await r.read()
            gets.append(time.monotonic() - g0)
    status_bytes = len(orjson.dumps(done["status"]))
    return SweepRun(admit, len(seen), max(seen) - t0, finished, writes(c.data, before, "big"),
                    status_bytes, gets, cpu[-1] - cpu[0])


@dataclass
class JobsRun:
    created: int
    errors: int
    seconds: float
    writes: Writes
    gets: list[float]
    """Seconds of GETs of one plain Job after the creates (the anchor of the Sweep's GET)."""
    cpu_s: float
    """The coordinator's CPU seconds while the Jobs were POSTed."""


async def run_jobs(c: Coordinator, count: int, concurrency: int) -> JobsRun:
    bodies = [orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "Job",
                            "metadata": {"name": f"plain-{i}", "labels": {"bench": "plain"}},
                            "spec": {**template(), "env": [{"name": "NODUS_PARAM_A", "value": str(i)}]}})
              for i in range(count)]
    errors = 0
    async with session(c, concurrency) as s:
        before = head(c.data)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for b in bodies:
            queue.put_nowait(b)

        async def client() -> None:
            nonlocal errors
            while not queue.empty():
                body = queue.get_nowait()
                try:
                    async with s.post(f"{NS}/jobs", data=body) as r:
                        await r.read()
                        errors += r.status != 201
                except aiohttp.ClientError:
                    errors += 1

        t0, cpu0 = time.monotonic(), cpu_seconds(c)
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds, cpu_s = time.monotonic() - t0, cpu_seconds(c) - cpu0
        await asyncio.sleep(2.0)  # the writes the creates set off (a first status, an Attempt) land
        gets = []
        for _ in range(20):
            t0 = time.monotonic()
            async with s.get(f"{NS}/jobs/plain-0") as r:
                await r.read()
            gets.append(time.monotonic() - t0)
    return JobsRun(count - errors, errors, seconds, writes(c.data, before), gets, cpu_s)


def fresh(root: Path, name: str, job_workers: int) -> Coordinator:
    (root / name).mkdir()
    return start_coordinator(root / name, *FLAGS, *(("--job-workers", str(job_workers)) if job_workers else ()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=10_000)
    ap.add_argument("--max-parallel", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--job-workers", type=int, default=0,
                    help="nodus-coordinator --job-workers for both coordinators (default: the coordinator's own)")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"cells": 200, "max_parallel": 32, "concurrency": 16})
    root = Path(tempfile.mkdtemp(prefix="nodus-bench-sweep-"))
    started: list[Coordinator] = []
    try:
        load_before = os.getloadavg()
        log(f"a {args.cells}-cell Sweep, maxParallel {args.max_parallel}")
        c = fresh(root, "sweep", args.job_workers)
        started.append(c)
        sw = asyncio.run(run_sweep(c, args.cells, args.max_parallel))
        stop_all([c.proc], [])  # the anchor gets the machine to itself
        log(f"{args.cells} plain Jobs, {args.concurrency} clients, on a fresh coordinator")
        c = fresh(root, "jobs", args.job_workers)
        started.append(c)
        jobs = asyncio.run(run_jobs(c, args.cells, args.concurrency))
        load_after = os.getloadavg()
        with record.Report("sweep", args):
            cell_rate = sw.created / sw.expand_s
            job_rate = jobs.created / jobs.seconds
            ok = lambda met: "ok" if met else "MISSED"  # noqa: E731
            print(f"Sweep of {args.cells} cells (maxParallel {args.max_parallel}, cells fail at once: no agent, "
                  f"queueTimeout 1ms); plain Jobs by {args.concurrency} clients; Job controller workers "
                  f"{args.job_workers or JOB_WORKERS}")
            print(f"load average (1, 5, 15 min)   before {' '.join(f'{x:.2f}' for x in load_before)}   "
                  f"after {' '.join(f'{x:.2f}' for x in load_after)}")
            print(f"admit (POST to 201)           {sw.admit_s * 1000:10.1f} ms   target ≤ {TARGET_ADMIT_S:.0f} s   "
                  f"{ok(sw.admit_s <= TARGET_ADMIT_S)}")
            print(f"cells created/s               {cell_rate:10.1f}/s   target ≥ {TARGET_CELLS_PER_S:.0f}/s   "
                  f"{ok(cell_rate >= TARGET_CELLS_PER_S)}   plain Jobs created/s (API) {job_rate:.1f}/s")
            print(f"  cells created {sw.created} in {sw.expand_s:.2f} s after the POST (seen on a watch); Sweep ended in "
                  f"{sw.finished_s:.2f} s; {jobs.created} plain Jobs in {jobs.seconds:.2f} s "
                  f"({jobs.errors} errors); ratio cells/plain {cell_rate / job_rate:.2f}")
            print(f"coordinator CPU per cell created  {sw.cpu_s / max(sw.created, 1) * 1000:6.2f} ms   per plain Job "
                  f"created (API) {jobs.cpu_s / max(jobs.created, 1) * 1000:.2f} ms   (CPU seconds of the process over "
                  f"the count: less bent by the host's load than the rates)")
            w = sw.writes
            per = w.total / max(w.phase_changes, 1)
            print(f"store writes per cell transition {per:7.2f}   plain Jobs' writes per transition "
                  f"{jobs.writes.total / max(jobs.writes.phase_changes, 1):.2f}")
            print(f"  Sweep: {w.total} writes over {w.phase_changes} cell phase changes: sweeps {w.by_kind['sweeps']}, "
                  f"jobs {w.by_kind['jobs']}, attempts {w.by_kind['attempts']}, other "
                  f"{w.total - w.by_kind['sweeps'] - w.by_kind['jobs'] - w.by_kind['attempts']}; "
                  f"plain: {jobs.writes.total} writes over {jobs.writes.phase_changes} phase changes")
            rows = "stored" if w.rows_stored else "from the cell Jobs"
            print(f"GET of the Sweep ({args.cells} cell rows {rows}) p50 {median(sw.gets) * 1000:.1f} ms, "
                  f"max {max(sw.gets) * 1000:.1f} ms over {len(sw.gets)}   GET of a plain Job p50 "
                  f"{median(jobs.gets) * 1000:.1f} ms")
            print(f"Sweep status writes per cell transition {w.by_kind['sweeps'] / max(w.phase_changes, 1):7.3f}   "
                  f"status bytes written {w.sweep_bytes / 1e6:.1f} MB   final status {sw.status_bytes / 1e6:.2f} MB "
                  f"as served, {w.sweep_last / 1e3:.1f} KB as stored")
    finally:
        stop_all([c.proc for c in started], [])
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
