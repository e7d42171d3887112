#!/usr/bin/env python3
"""Job startup benchmark: a real `nodus-coordinator` and a real, warm `nodus-agent` on loopback.

    .venv/bin/python bench/startup.py [--jobs 50] [--indexes 500] [--parallelism 16] [--idle-seconds 10]

Figures (see bench/README.md), each beside the floor measured in the same run and its anchor:
  1  create→Running latency p50/p99 over N sequential one-index Jobs. Running is the first event of a
     watch on the Jobs collection that shows the Job with status.phase Running; latency is measured on
     this client's monotonic clock from the create's 201 to that event's arrival.
  2  indexes completed per second for one Job of 500 trivial indexes (`true`), parallelism 16:
     indexes / (watch event showing phase Succeeded − create's 201).
  3  an idle agent's RSS and CPU (psutil, over --idle-seconds): the agent alone, and with its zygote.
  floor   a bare subprocess spawn+wait of `true` and of `python3 -c pass`, p50 over 50 runs
  anchor  Kubernetes' pod-startup SLO: 5 s at p99
Targets: p50 ≤ 50 ms, p99 ≤ 200 ms, ≥ 50 indexes/s, idle agent ≤ 60 MB RSS and ≤ 1 % of a core.

A benchmark, not a test: it asserts nothing. It starts its own coordinator and agent in a temporary
directory and removes them (and whatever they ran) when it exits.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

import record
from daemons import stop_all

BIN = Path(sys.executable).parent
JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
TARGET_P50_MS, TARGET_P99_MS, TARGET_RATE, TARGET_RSS_MB, TARGET_CPU_PCT = 50.0, 200.0, 50.0, 60.0, 1.0
ANCHOR_P99_MS = 5000.0


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


# -- processes ---------------------------------------------------------------------------------------------

class Cluster:
    """A coordinator and one agent, as `nodus up` runs them, in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.session = requests.Session()
        self.session.trust_env = False
        self.http = ""

    def start(self) -> None:
        data = self.root / "data"
        with open(self.root / "coordinator.log", "ab") as out:
            self.coordinator = subprocess.Popen(
                [str(BIN / "nodus-coordinator"), "--data-dir", str(data), "--http-listen", "127.0.0.1:0",
                 "--grpc-listen", "127.0.0.1:0", "--log-level", "WARNING"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        endpoints = data / "endpoints.json"
        deadline = time.monotonic() + 60
        while not endpoints.exists():
            if self.coordinator.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("nodus-coordinator did not start:\n" + (self.root / "coordinator.log").read_text())
            time.sleep(0.05)
        ep = json.loads(endpoints.read_text())
        self.http = ep["http"]
        config = yaml.safe_load((data / "kubeconfig").read_text())
        ca = self.root / "ca.crt"
        ca.write_bytes(base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]))
        self.session.verify = str(ca)
        self.session.headers["Authorization"] = "Bearer " + config["users"][0]["user"]["token"]
        token = self.root / "join-token"
        shutil.copy(data / "join-token", token)
        with open(self.root / "agent.log", "ab") as out:  # the agent's defaults, as a user runs it
            self.agent = subprocess.Popen(
                [str(BIN / "nodus-agent"), "--coordinator", ep["grpc"], "--node", "bench", "--work-dir",
                 str(self.root / "agent"), "--join-token-file", str(token), "--log-level", "WARNING"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        return self.http + path

    def stop(self) -> None:
        stop_all([self.agent, self.coordinator], [self.root / "agent"])


class JobWatch:
    """One watch on the Jobs collection in a thread: when (client monotonic clock) each Job was first
    seen in each phase."""

    def __init__(self, cluster: Cluster, rv: str) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self.events: "queue.Queue[tuple[str, str]]" = queue.Queue()
        self.lock = threading.Lock()
        self.response = cluster.session.get(cluster.url(JOBS), params={"watch": "true", "resourceVersion": rv},
                                            stream=True, timeout=(10, None))
        self.response.raise_for_status()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for line in self.response.iter_lines():
                if not line:
                    continue
                now = time.monotonic()
                event = json.loads(line)
                obj = event.get("object") or {}
                name = (obj.get("metadata") or {}).get("name", "")
                phase = (obj.get("status") or {}).get("phase", "")
                with self.lock:
                    if (name, phase) not in self.seen:
                        self.seen[(name, phase)] = now
                        self.events.put((name, phase))
        except Exception:  # noqa: BLE001 - closed at the end of the run
            pass

    def wait(self, name: str, phases: tuple[str, ...], timeout: float) -> tuple[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                for phase in phases:
                    if (name, phase) in self.seen:
                        return phase, self.seen[(name, phase)]
            if time.monotonic() > deadline:
                raise RuntimeError(f"Job {name} reached none of {phases} within {timeout:.0f}s")
            try:
                self.events.get(timeout=0.05)
            except queue.Empty:
                pass


def create(cluster: Cluster, name: str, spec: dict[str, Any]) -> float:
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}
    r = cluster.session.post(cluster.url(JOBS), json=body)
    acknowledged = time.monotonic()
    if r.status_code != 201:
        raise RuntimeError(f"create {name}: HTTP {r.status_code} {r.text[:500]}")
    return acknowledged


# -- the figures ---------------------------------------------------------------------------------------------

def spawn_floor(argv: list[str], runs: int = 50) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def startup_latency(cluster: Cluster, watch: JobWatch, jobs: int) -> list[float]:
    lat = []
    for i in range(jobs):
        name = f"lat-{i}"
        # Long enough that Running is always reported before the end; short enough to keep it sequential.
        acknowledged = create(cluster, name, {"command": ["sleep", "0.2"], "backoffLimit": 0})
        phase, seen = watch.wait(name, ("Running", "Succeeded", "Failed"), 60)
        if phase != "Running":
            raise RuntimeError(f"{name} went {phase} without a Running event")
        lat.append((seen - acknowledged) * 1000)
        phase, _ = watch.wait(name, ("Succeeded", "Failed"), 60)
        if phase != "Succeeded":
            raise RuntimeError(f"{name} ended {phase}")
    return lat


def throughput(cluster: Cluster, watch: JobWatch, indexes: int, parallelism: int) -> float:
    name = "many"
    acknowledged = create(cluster, name, {"command": ["true"], "completions": indexes, "parallelism": parallelism,
                                          "backoffLimit": 0})
    phase, done = watch.wait(name, ("Succeeded", "Failed"), 600)
    if phase != "Succeeded":
        raise RuntimeError(f"{name} ended {phase}: {cluster.session.get(cluster.url(f'{JOBS}/{name}')).text[:800]}")
    return indexes / (done - acknowledged)


def wait_idle(cluster: Cluster, timeout: float = 60) -> None:
    """Until the agent holds no attempt (it forgets one once its end is acknowledged and its log shipped)."""
    attempts = cluster.root / "agent" / "attempts"
    deadline = time.monotonic() + timeout
    while attempts.is_dir() and any(attempts.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)


def idle_usage(agent_pid: int, seconds: float) -> tuple[float, float, float, float, float]:
    """(agent RSS MB, agent % of a core, agent+children RSS MB, agent+children % of a core,
    agent+children PSS MB). RSS counts the pages the agent and its zygote share (libpython, .so
    files) twice; PSS divides each shared page among its sharers, so the family's PSS is its real
    footprint."""
    agent = psutil.Process(agent_pid)
    family = [agent, *agent.children(recursive=True)]

    def cpu(ps: list[psutil.Process]) -> dict[int, float]:
        seconds = {}
        for p in ps:
            try:
                t = p.cpu_times()
                seconds[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return seconds

    def used(before: dict[int, float], after: dict[int, float]) -> float:
        # only processes alive at both ends: a child that exits in between takes its CPU with it
        return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())

    def rss(ps: list[psutil.Process]) -> float:
        total = 0
        for p in ps:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / 1e6

    def pss(ps: list[psutil.Process]) -> float:
        total = 0
        for p in ps:
            try:
                total += p.memory_full_info().pss
            except (psutil.Error, AttributeError):
                pass
        return total / 1e6

    f0, t0 = cpu(family), time.monotonic()
    time.sleep(seconds)
    dt, f1 = time.monotonic() - t0, cpu(family)
    only_agent = {agent.pid}
    return (rss([agent]), 100 * used({k: v for k, v in f0.items() if k in only_agent}, f1) / dt,
            rss(family), 100 * used(f0, f1) / dt, pss(family))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--indexes", type=int, default=500)
    p.add_argument("--parallelism", type=int, default=16)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    record.add_flags(p)
    args = record.shrink(p.parse_args(), {"jobs": 3, "indexes": 20, "parallelism": 4, "idle_seconds": 0.5})

    root = Path(tempfile.mkdtemp(prefix="nodus-bench-startup-"))
    cluster = Cluster(root)
    watch: JobWatch | None = None
    try:
        log("floor: bare subprocess spawns")
        floor_true = spawn_floor(["true"])
        floor_py = spawn_floor(["python3", "-c", "pass"])
        log(f"starting a coordinator and an agent in {root}")
        cluster.start()
        rv = cluster.session.get(cluster.url(JOBS)).json()["metadata"]["resourceVersion"]
        watch = JobWatch(cluster, rv)
        log("warm-up: 3 Jobs")
        for i in range(3):
            create(cluster, f"warm-{i}", {"command": ["true"]})
            if watch.wait(f"warm-{i}", ("Succeeded", "Failed"), 120)[0] != "Succeeded":
                raise RuntimeError(f"warm-{i} failed; see {root}/agent.log")
        wait_idle(cluster)
        log(f"idle agent, fresh and warm: {args.idle_seconds:g} s")
        assert cluster.agent is not None
        fresh = idle_usage(cluster.agent.pid, args.idle_seconds)
        log(f"create→Running: {args.jobs} sequential one-index Jobs")
        lat = startup_latency(cluster, watch, args.jobs)
        log(f"throughput: one Job of {args.indexes} indexes, parallelism {args.parallelism}")
        rate = throughput(cluster, watch, args.indexes, args.parallelism)
        wait_idle(cluster)
        log(f"idle agent after the runs: {args.idle_seconds:g} s")
        after = idle_usage(cluster.agent.pid, args.idle_seconds)
    finally:
        cluster.stop()  # a stopping coordinator ends the watch stream; closing it from here would block
        shutil.rmtree(root, ignore_errors=True)

    p50, p99 = pct(lat, 50), pct(lat, 99)
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    rows = [
        ("create→Running p50", f"{p50:.1f} ms", f"≤ {TARGET_P50_MS:g} ms", ok(p50 <= TARGET_P50_MS),
         f"floor {floor_true:.1f} ms (`true`), {floor_py:.1f} ms (`python3 -c pass`); "
         f"{p50 / floor_true:.0f}× the floor"),
        ("create→Running p99", f"{p99:.1f} ms", f"≤ {TARGET_P99_MS:g} ms", ok(p99 <= TARGET_P99_MS),
         f"anchor: Kubernetes pod startup SLO {ANCHOR_P99_MS / 1000:g} s p99; {ANCHOR_P99_MS / p99:.0f}× under it"),
        ("create→Running max", f"{max(lat):.1f} ms", "", "", f"over {len(lat)} Jobs"),
        (f"indexes/s ({args.indexes} × `true`, par. {args.parallelism})", f"{rate:.1f}/s", f"≥ {TARGET_RATE:g}/s",
         ok(rate >= TARGET_RATE), f"floor: 1 spawn of `true` = {1000 / floor_true:.0f}/s on one core"),
    ]
    for label, (a_rss, a_cpu, f_rss, f_cpu, f_pss) in (("idle, fresh", fresh), ("idle, after runs", after)):
        rows += [
            (f"agent RSS ({label})", f"{a_rss:.1f} MB", f"≤ {TARGET_RSS_MB:g} MB", ok(a_rss <= TARGET_RSS_MB),
             f"with zygote: RSS {f_rss:.1f} MB (shared pages twice), PSS {f_pss:.1f} MB "
             f"{ok(f_pss <= TARGET_RSS_MB)}"),
            (f"agent CPU ({label})", f"{a_cpu:.2f} %", f"≤ {TARGET_CPU_PCT:g} %", ok(a_cpu <= TARGET_CPU_PCT),
             f"with zygote: {f_cpu:.2f} % of a core"),
        ]
    widths = [max(len(str(r[i])) for r in rows + [("figure", "measured", "target", "", "beside")])
              for i in range(5)]
    with record.Report("startup", args):
        print(f"nodus startup benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
        print("Running = the first Job watch event with status.phase Running; latency on the client's monotonic clock")
        print("from the create's 201 to that event. indexes/s = indexes / (Succeeded event − create's 201).")
        header = ("figure", "measured", "target", "", "beside")
        for r in [header, *rows]:
            print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
