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
  4  create→Running p50/p99 for image Jobs on a warm cache (issue 11): a real docker-registry on loopback
     serves a busybox image (tests/registry.py); the coordinator and the agent are given it with
     --insecure-registry and the agent runs images (its default --runtime auto, which is oci where runc,
     skopeo and umoci are installed). One warm-up image Job pulls and unpacks the image into the agent's
     cache; then --jobs sequential one-index image Jobs of `sleep 0.2`, measured as figure 1, each one
     right after one run of its floor (so both see the same load) and gone from the agent (its pod torn
     down; waited for up to 10 s, and an attempt the agent fails to remove is noted and then ignored)
     before the next.
  floor   a bare subprocess spawn+wait of `true` and of `python3 -c pass`, p50 over 50 runs
  runc floor (figure 4's)  `runc run` of an equivalent bundle, --jobs times, from the command line
     (bench/startup_image.py says how it matches the agent's and how it is timed).
  anchor  Kubernetes' pod-startup SLO: 5 s at p99
Targets (issue 17 part 5, issue 11): p50 ≤ 20 ms, p99 ≤ 60 ms, ≥ 200 indexes/s, idle agent ≤ 60 MB RSS and
≤ 1 % of a core; image Jobs p50 ≤ the runc floor + 30 ms.
Below the table, where the time goes: medians over each phase's Jobs of create's 201 → the Attempt's
provisioningTime (placed), → its inputsReadyTime (the agent has it, its image and its inputs), → its
startTime (the spec written, the supervisor forked from the zygote, its RUNNING: for an image, once
`runc run --detach` returned), → the Running watch event, on this host's wall clock (the Attempt's timestamps
have millisecond resolution). Then the steps an image attempt's supervisor takes that a process
attempt's does not, each run here --jobs times with the agent's own functions: importing
nodus.agent.supervisor.containers in a fork of an interpreter holding what the zygote preloads, the pod's
namespaces (a spare's claimed: oci.slots.IdSlots.claim, ADR 0111; making the spare, which the agent does
after the attempt before ended, is printed beside), its writable layer (mount_layer), `runc run --detach` (Runc.run).
For the many-index Job (bench/startup_phases.py): the medians of its indexes' phases, created → placed →
inputs ready → started → finished and an end → the next index's Attempt created, and the CPU-seconds per
index of the agent, its supervisors (the zygote and what it forked) and the coordinator, with the rate
this host's CPUs allow at that cost.

The image figures need root, runc, skopeo, umoci and docker-registry; without them the image phase is
printed as skipped.

A benchmark, not a test: it asserts nothing. It starts its own coordinator and agent in a temporary
directory and removes them (and whatever they ran: containers, mounts, the registry) when it exits.
"""
from __future__ import annotations

import argparse
import contextlib
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
from datetime import datetime
from typing import Any

import psutil
import requests

import record
from daemons import BIN, start_coordinator, stop_all
from startup_image import agent_steps, clean_pods, image_tools_missing, log, remove_tree, runc_floor
from startup_phases import cpu_seconds, index_phases

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
ATTEMPTS = "/apis/nodus.dev/v1/namespaces/default/attempts"
TARGET_P50_MS, TARGET_P99_MS, TARGET_RATE, TARGET_RSS_MB, TARGET_CPU_PCT = 20.0, 60.0, 200.0, 60.0, 1.0
"""Issue 17 part 5's create→Running p50/p99 and indexes/s; the idle agent's from issue 4."""
ANCHOR_P99_MS = 5000.0
IMAGE_OVER_RUNC_MS = 30.0
"""Issue 11: an image Job's create→Running p50 on a warm cache is at most `runc run`'s + this."""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


# -- processes ---------------------------------------------------------------------------------------------

class Cluster:
    """A coordinator and one agent, as `nodus up` runs them, in a temporary directory."""

    def __init__(self, root: Path, coordinator_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.coordinator_args, self.agent_args = coordinator_args, agent_args
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.session = requests.Session()
        self.session.trust_env = False
        self.http = ""

    def start(self) -> None:
        started = start_coordinator(self.root, *self.coordinator_args)
        self.coordinator, self.http, data, ep = started.proc, started.http, started.data, {"grpc": started.grpc}
        self.session.verify = str(started.ca)
        self.session.headers["Authorization"] = "Bearer " + started.token
        token = self.root / "join-token"
        shutil.copy(data / "join-token", token)
        with open(self.root / "agent.log", "ab") as out:  # the agent's defaults, as a user runs it
            self.agent = subprocess.Popen(
                [str(BIN / "nodus-agent"), "--coordinator", ep["grpc"], "--node", "bench", "--work-dir",
                 str(self.root / "agent"), "--join-token-file", str(token), "--log-level", "WARNING",
                 "--coordinator-ca", str(data / "tls" / "ca.crt"),
                 *self.agent_args],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        return self.http + path

    def stop(self) -> None:
        stop_all([self.agent, self.coordinator], [self.root / "agent"])
        clean_pods(self.root / "agent")


class JobWatch:
    """One watch on the Jobs collection in a thread: when (client monotonic clock) each Job was first
    seen in each phase."""

    def __init__(self, cluster: Cluster, rv: str) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self.seen_wall: dict[tuple[str, str], float] = {}
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
                now, wall = time.monotonic(), time.time()
                event = json.loads(line)
                obj = event.get("object") or {}
                name = (obj.get("metadata") or {}).get("name", "")
                phase = (obj.get("status") or {}).get("phase", "")
                with self.lock:
                    if (name, phase) not in self.seen:
                        self.seen[(name, phase)] = now
                        self.seen_wall[(name, phase)] = wall
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


ACKED_WALL: dict[str, float] = {}
"""Each Job's create 201 on the wall clock (for where the time goes, beside the Attempts' timestamps)."""


def create(cluster: Cluster, name: str, spec: dict[str, Any]) -> float:
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}
    r = cluster.session.post(cluster.url(JOBS), json=body)
    acknowledged = time.monotonic()
    ACKED_WALL[name] = time.time()
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
    return [one_latency(cluster, watch, f"lat-{i}") for i in range(jobs)]


def one_latency(cluster: Cluster, watch: JobWatch, name: str, extra: dict[str, Any] | None = None) -> float:
    """create→Running of one one-index Job, in ms; returns once it Succeeded."""
    # Long enough that Running is always reported before the end; short enough to keep it sequential.
    acknowledged = create(cluster, name, {"command": ["sleep", "0.2"], "backoffLimit": 0, **(extra or {})})
    phase, seen = watch.wait(name, ("Running", "Succeeded", "Failed"), 60)
    if phase != "Running":
        raise RuntimeError(f"{name} went {phase} without a Running event")
    phase, _ = watch.wait(name, ("Succeeded", "Failed"), 60)
    if phase != "Succeeded":
        raise RuntimeError(f"{name} ended {phase}")
    return (seen - acknowledged) * 1000


def throughput(cluster: Cluster, watch: JobWatch, indexes: int, parallelism: int) -> float:
    name = "many"
    acknowledged = create(cluster, name, {"command": ["true"], "completions": indexes, "parallelism": parallelism,
                                          "backoffLimit": 0})
    phase, done = watch.wait(name, ("Succeeded", "Failed"), 600)
    if phase != "Succeeded":
        raise RuntimeError(f"{name} ended {phase}: {cluster.session.get(cluster.url(f'{JOBS}/{name}')).text[:800]}")
    return indexes / (done - acknowledged)


def when(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp).timestamp() if stamp else None


def time_split(cluster: Cluster, watch: JobWatch, names: list[str]) -> tuple[float, float, float, float]:
    """Medians over `names` of create's 201 → placed (provisioningTime), placed → inputs ready
    (inputsReadyTime: the agent has the assignment, the image and the inputs), inputs ready → started
    (startTime: the spec written, the supervisor spawned, its RUNNING), started → the Running watch event;
    in ms, on this host's wall clock."""
    split: list[list[float]] = [[], [], [], []]
    for name in names:
        r = cluster.session.get(cluster.url(ATTEMPTS), params={"labelSelector": f"nodus.dev/job={name}"})
        r.raise_for_status()
        items = r.json()["items"]
        if len(items) != 1:
            continue
        st = items[0].get("status") or {}
        marks = [ACKED_WALL.get(name), when(st.get("provisioningTime")), when(st.get("inputsReadyTime")),
                 when(st.get("startTime")), watch.seen_wall.get((name, "Running"))]
        if None in marks:
            continue
        for i in range(4):
            split[i].append((marks[i + 1] - marks[i]) * 1000)  # type: ignore[operator]
    if not split[0]:
        return (float("nan"),) * 4  # type: ignore[return-value]
    return tuple(statistics.median(v) for v in split)  # type: ignore[return-value]


def wait_idle(cluster: Cluster, timeout: float = 60) -> None:
    """Until the agent holds no attempt (it forgets one once its end is acknowledged and its log shipped)."""
    attempts = cluster.root / "agent" / "attempts"
    deadline = time.monotonic() + timeout
    while attempts.is_dir() and any(attempts.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)


def wait_gone(cluster: Cluster, stuck: set[str], timeout: float = 10) -> set[str]:
    """Until the agent holds no attempt but the `stuck` ones; returns those still there after `timeout`
    (an attempt the agent could not remove stays: see its agent.log), which later waits then ignore."""
    attempts = cluster.root / "agent" / "attempts"
    deadline = time.monotonic() + timeout
    while True:
        left = {p.name for p in attempts.iterdir()} - stuck if attempts.is_dir() else set()
        if not left:
            return set()
        if time.monotonic() > deadline:
            log(f"attempts still on the agent after {timeout:g} s, ignored from now on: {sorted(left)}")
            return left
        time.sleep(0.02)


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
    p.add_argument("--process-only", action="store_true",
                   help="skip the image rows (a process-runtime change measured without the image phase's minutes)")
    record.add_flags(p)
    args = record.shrink(p.parse_args(), {"jobs": 3, "indexes": 20, "parallelism": 4, "idle_seconds": 0.5})

    load_start = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="nodus-bench-startup-"))
    root.chmod(0o711)  # a pod's root resolves its bundle and bind sources through it (docs/adr/0020)
    skip = "--process-only" if args.process_only else image_tools_missing()
    cluster: Cluster | None = None
    watch: JobWatch | None = None
    image_lat: list[float] = []
    runc_running: list[float] = []
    runc_exited: list[float] = []
    splits: dict[str, tuple[float, float, float, float]] = {}
    steps: dict[str, float] = {}
    stuck: set[str] = set()
    try:
        with contextlib.ExitStack() as stack:
            flags: tuple[str, ...] = ()
            if not skip:
                sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
                from registry import build_busybox_layout, push, serve_registry

                log("image: a docker-registry on loopback, a busybox image pushed to it")
                layout = build_busybox_layout(root / "image")
                registry = stack.enter_context(serve_registry(root / "registry"))
                push(layout, registry, "bench/busybox", "v1")
                image_ref = f"{registry.host}/bench/busybox:v1"
                flags = ("--insecure-registry", registry.host)
            cluster = Cluster(root, flags, flags)
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
                assert cluster.coordinator is not None
                cpu = cpu_seconds(cluster.agent.pid, cluster.coordinator.pid)
                cpu_before = cpu()
                rate = throughput(cluster, watch, args.indexes, args.parallelism)
                cpu_used = {k: v - cpu_before[k] for k, v in cpu().items()}
                many = cluster.session.get(cluster.url(ATTEMPTS), params={"labelSelector": "nodus.dev/job=many"})
                many.raise_for_status()
                phases = index_phases(many.json()["items"], args.parallelism)
                wait_idle(cluster)
                log(f"idle agent after the runs: {args.idle_seconds:g} s")
                after = idle_usage(cluster.agent.pid, args.idle_seconds)
                splits["process"] = time_split(cluster, watch, [f"lat-{i}" for i in range(args.jobs)])
                if not skip:
                    log("image: a warm-up Job (the image pulled and unpacked into the agent's cache)")
                    create(cluster, "img-warm", {"image": image_ref, "command": ["true"], "backoffLimit": 0})
                    if watch.wait("img-warm", ("Succeeded", "Failed"), 300)[0] != "Succeeded":
                        raise RuntimeError(f"img-warm failed; see {root}/agent.log")
                    wait_idle(cluster)
                    log(f"image create→Running: {args.jobs} sequential one-index image Jobs, each after a "
                        f"`runc run` of the same bundle")
                    def image_job(i: int) -> None:
                        image_lat.append(one_latency(cluster, watch, f"img-{i}", {"image": image_ref}))
                        stuck.update(wait_gone(cluster, stuck))  # its pod torn down before the next runc run

                    runc_running, runc_exited = runc_floor(layout, root / "runc-floor", args.jobs, image_job)
                    splits["image"] = time_split(cluster, watch, [f"img-{i}" for i in range(args.jobs)])
                    log(f"image: the supervisor's extra steps, run here {args.jobs} times")
                    steps = agent_steps(layout, root / "steps", args.jobs)
            finally:
                cluster.stop()  # a stopping coordinator ends the watch stream; closing it from here would block
    finally:
        remove_tree(root)

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
    if skip:
        rows.append(("create→Running p50 (image, warm cache)", "skipped", "", "", skip))
    else:
        i50, r50, x50 = pct(image_lat, 50), pct(runc_running, 50), pct(runc_exited, 50)
        rows += [
            ("create→Running p50 (image, warm cache)", f"{i50:.1f} ms",
             f"≤ floor + {IMAGE_OVER_RUNC_MS:g} ms = {r50 + IMAGE_OVER_RUNC_MS:.1f} ms",
             ok(i50 <= r50 + IMAGE_OVER_RUNC_MS),
             f"runc run p50 {r50:.1f} ms (spawn → process running; spawn → exit {x50:.1f} ms); "
             f"{i50 - r50:+.1f} ms over it"),
            ("create→Running p99 (image, warm cache)", f"{pct(image_lat, 99):.1f} ms", "", "",
             f"runc run p99 {pct(runc_running, 99):.1f} ms; image max {max(image_lat):.1f} ms over "
             f"{len(image_lat)} Jobs"),
        ]
    widths = [max(len(str(r[i])) for r in rows + [("figure", "measured", "target", "", "beside")])
              for i in range(5)]
    with record.Report("startup", args):
        print(f"nodus startup benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
              f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (1 min)")
        print("Running = the first Job watch event with status.phase Running; latency on the client's monotonic clock")
        print("from the create's 201 to that event. indexes/s = indexes / (Succeeded event − create's 201).")
        header = ("figure", "measured", "target", "", "beside")
        for r in [header, *rows]:
            print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
        print("where the time goes (medians, ms, this host's wall clock; the Attempt's timestamps are to the ms):")
        print("  Jobs       201 → placed   placed → inputs ready   inputs ready → started   started → Running event")
        for kind, (placed, ready, started, reported) in splits.items():
            print(f"  {kind:<9}  {placed:>12.1f}   {ready:>21.1f}   {started:>22.1f}   {reported:>22.1f}")
        print("  placed = the Attempt's provisioningTime; inputs ready = its inputsReadyTime (the agent accepted it,")
        print("  pulled its image: a cache hit, and made its inputs); started = its startTime, the supervisor's RUNNING")
        print("  (for an image, once `runc run --detach` returned)")
        print(f"  the many-index Job's indexes (medians, ms): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
        per = {k: 1000 * v / args.indexes for k, v in cpu_used.items()}
        total = sum(per.values())
        cores = os.cpu_count() or 1
        print(f"  CPU per index (ms): agent {per['agent']:.1f}, supervisors {per['supervisors']:.1f}, coordinator "
              f"{per['coordinator']:.1f}; sum {total:.1f}: this host's {cores} CPUs allow at most "
              f"{1000 * cores / total:.0f} indexes/s at that cost")
        if steps:
            extra = steps["namespaces"] + steps["layer"] + steps["run"]
            print("an image attempt's supervisor steps a process attempt's does not take, each run here with the agent's")
            print(f"own functions (medians over {args.jobs}, ms): pod namespaces {steps['namespaces']:.1f} (a spare's, "
                  f"claimed), writable layer {steps['layer']:.1f}, runc run --detach {steps['run']:.1f}; "
                  f"sum {extra:.1f} (off the attempt's path: import nodus.agent.supervisor.containers in a fresh "
                  f"process {steps['import']:.1f}, the zygote preloads it; a spare pod's namespaces made by the agent "
                  f"after the attempt before {steps['spare']:.1f})")
            if stuck:
                print(f"  note: {len(stuck)} image attempt(s) stayed on the agent after their Job ended (it could not "
                      f"remove them; see its log); the runc runs after them did not wait for them")
            if "image" in splits and "process" in splits:
                print(f"  image − process, inputs ready → started: {splits['image'][2] - splits['process'][2]:.1f}; "
                      f"placed → inputs ready: {splits['image'][1] - splits['process'][1]:.1f}")


if __name__ == "__main__":
    main()
