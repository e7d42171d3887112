"""The supervisor's share of a process attempt's start and end, without the coordinator or the agent.

This interpreter preloads what the agent's zygote preloads and then plays the zygote: for each attempt
it writes the attempt's directory and run/spec.json (`true`, under an own uid and cgroups where this
runs as root with a writable hierarchy, as an agent's attempts run), takes the supervisor lock and forks;
the child becomes the attempt's supervisor exactly as a zygote's child does (`_from_zygote`). The
supervisor pokes a datagram socket after each status write it notifies; its first poke is RUNNING.

Figures, per attempt: fork → RUNNING and fork → the supervisor's exit (wall), and the CPU and the page
faults of the supervisor and what it ran. Beside them, measured in the same run, the floor: the same
interpreter forking a child that only runs `true` (subprocess, vfork) and exits.

Run from the repository root: `.venv/bin/python bench/supervisor.py [--attempts 200]`.
"""
from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import record

ZYGOTE_PRELOAD = ("tarfile", "psutil", "zstandard", "nodus.agent.supervisor.containers")
UID_BASE = 230_000
"""Attempt uids of this bench: above the agent's default range start, apart from the tests' ids."""
CGROUP_ROOT = "nodus-bench-supervisor"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def usage() -> tuple[float, int]:
    """CPU seconds and minor page faults of the reaped children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def as_root_with_cgroups() -> bool:
    if os.geteuid() != 0:
        return False
    from nodus.agent.cgroups import Cgroup

    probe = Cgroup.create(CGROUP_ROOT, f"probe-{os.getpid()}")
    try:
        return probe.usable and not probe.missing
    finally:
        probe.remove()


def measure(n: int, fork_one: Callable[[int], tuple[int, Callable[[], None]]]) -> dict[str, list[float] | float]:
    """Runs `fork_one(i)` n times (it forks and returns the pid and a wait for its first poke); wall times in ms."""
    first: list[float] = []
    ended: list[float] = []
    cpu0, faults0 = usage()
    for i in range(n):
        t0 = time.perf_counter()
        pid, poked = fork_one(i)
        poked()
        first.append((time.perf_counter() - t0) * 1e3)
        os.waitpid(pid, 0)
        ended.append((time.perf_counter() - t0) * 1e3)
    cpu1, faults1 = usage()
    return {"first": first, "ended": ended, "cpu_ms": (cpu1 - cpu0) * 1e3 / n, "faults": (faults1 - faults0) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=200)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"attempts": 5})
    for module in ZYGOTE_PRELOAD:
        importlib.import_module(module)
    from nodus.agent.layout import AttemptLayout
    from nodus.agent.statefile import write_json
    from nodus.agent.supervisor.__main__ import _from_zygote

    privileged = as_root_with_cgroups()
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="nodus-bench-supervisor-"))
    work.chmod(0o711)
    (work / "attempts").mkdir(mode=0o711)
    (work / "attempts").chmod(0o711)
    pokes = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = f"\0nodus-bench-supervisor-{os.getpid()}"
    pokes.bind(address)
    pokes.settimeout(60)

    def poked() -> None:
        pokes.recv(512)

    def supervisor(i: int) -> tuple[int, Callable[[], None]]:
        layout = AttemptLayout(work / "attempts" / f"att-{i}")
        layout.make()
        layout.progress.touch()
        user = None
        if privileged:
            uid = UID_BASE + i
            layout.own(uid, uid)
            user = {"name": f"nodus-attempt-{uid}", "uid": uid, "gid": uid, "groups": []}
        write_json(layout.spec, {"attempt_id": f"att-{i}", "command": ["true"], "env": {"PATH": "/usr/bin:/bin"},
                                 "working_dir": str(layout.root), "outputs": [], "user": user,
                                 "resources": {"memory_bytes": 0, "cpu_millis": 0}, "cgroups": privileged,
                                 "cgroup_root": CGROUP_ROOT, "cgroup_name": f"att-{i}", "stop_grace": 1},
                   durable=False)
        lock = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        pid = os.fork()
        if pid == 0:  # as the zygote's child does
            code = 0
            try:
                pokes.close()
                os.setsid()
                _from_zygote({"attempt_dir": str(layout.root), "notify": "@" + address[1:], "secrets": {}}, lock)
            except BaseException:  # noqa: BLE001 - never return into the bench's loop
                code = 1
            finally:
                os._exit(code)
        os.close(lock)
        return pid, poked

    def floor(i: int) -> tuple[int, Callable[[], None]]:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                subprocess.run(["true"], stdin=subprocess.DEVNULL, close_fds=True, check=True)
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(b"ran", address)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        return pid, poked

    try:
        measure(min(3, args.attempts), supervisor)  # warm: the first ones create the cgroup root and fill caches
        sup = measure(args.attempts, supervisor)
        bare = measure(args.attempts, floor)
    finally:
        pokes.close()
        shutil.rmtree(work, ignore_errors=True)
        if privileged:
            from nodus.agent.cgroups import V1_CONTROLLERS, DEFAULT_FS, version
            parents = [DEFAULT_FS / CGROUP_ROOT] if version() == 2 else [DEFAULT_FS / c / CGROUP_ROOT
                                                                         for c in V1_CONTROLLERS]
            for parent in parents:
                try:
                    parent.rmdir()
                except OSError:
                    pass
    with record.Report("supervisor", args):
        first, ended = sup["first"], sup["ended"]
        bare_first = bare["first"]
        assert isinstance(first, list) and isinstance(ended, list) and isinstance(bare_first, list)
        print(f"nodus supervisor benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
              f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (1 min); {args.attempts} attempts "
              f"of `true`, " + ("each under its own uid and cgroups (root)" if privileged else
                                "as this user without cgroups (not root, or no writable cgroup hierarchy)"))
        print(f"{'figure':34s}{'supervisor':>14s}{'floor':>12s}   floor: this interpreter forks a child that runs "
              f"`true` and exits")
        print(f"{'fork → RUNNING p50 / p99 (ms)':34s}{percentile(first, .5):>7.2f} / {percentile(first, .99):<6.2f}"
              f" {percentile(bare_first, .5):>5.2f} / {percentile(bare_first, .99):.2f}   (floor: fork → `true` ran)")
        print(f"{'fork → exit p50 (ms)':34s}{percentile(ended, .5):>14.2f}{percentile(bare['ended'], .5):>12.2f}")  # type: ignore[arg-type]
        print(f"{'CPU per attempt (ms)':34s}{sup['cpu_ms']:>14.2f}{bare['cpu_ms']:>12.2f}")
        print(f"{'page faults per attempt':34s}{sup['faults']:>14.0f}{bare['faults']:>12.0f}")


if __name__ == "__main__":
    main()
