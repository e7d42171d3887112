"""bench/gang.py's figure 2: the mesh probe (`python -m nodus.agent.probe`, 2 processes on 127.0.0.1, gloo)
beside a plain all-reduce at its largest size and a raw TCP echo, with the CPU other work used meanwhile.

A benchmark's parts, not a test: nothing here asserts.
"""
from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from nodus.agent.probe import TARGET_S

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' doubles
from agent_double import free_port  # noqa: E402

PLAIN_SECONDS = TARGET_S
"""Length of the plain all-reduce's timed loop: the probe's own timed window at its largest size, so that
both are exposed alike to whatever else runs on the host."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loopback_interface() -> str:
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return "lo"


def probe_pair(max_bytes: int, budget_s: float, env: dict[str, str]) -> dict[str, Any]:
    """Runs the probe as rank 0 and rank 1 on 127.0.0.1, as the agent does (an inherited listening socket per
    member, rank 0 hosting the store); returns rank 0's report with `ranks` holding both."""
    listeners = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        listeners.append(s)
    peers = [{"rank": r, "address": "127.0.0.1", "probe_port": s.getsockname()[1]} for r, s in enumerate(listeners)]
    store = {"address": "127.0.0.1", "port": free_port()}
    procs = []
    try:
        for rank, s in enumerate(listeners):
            plan = {"rank": rank, "size": 2, "peers": peers, "store": store, "backend": "gloo", "max_bytes": max_bytes,
                    "budget_s": budget_s, "listen_fd": s.fileno()}
            plan_file = Path(tempfile.mkstemp(prefix="nodus-bench-plan-")[1])
            plan_file.write_text(json.dumps(plan))
            with open(plan_file, "rb") as stdin:  # a file, not a pipe: both ranks start before either is read
                procs.append(subprocess.Popen([sys.executable, "-m", "nodus.agent.probe"], stdin=stdin,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(s.fileno(),),
                                              env=env))
            plan_file.unlink()
        for s in listeners:
            s.close()
        reports = []
        for p in procs:
            out, err = p.communicate(timeout=budget_s + 30)
            lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
            if not lines:
                raise RuntimeError(f"the probe printed no report (exit {p.returncode}):\n{err.decode()[-2000:]}")
            reports.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in reports:
        if r.get("error"):
            raise RuntimeError(f"the probe's rank {r['rank']} reported: {r['error']}")
    return {**reports[0], "ranks": reports}


PLAIN = """
import sys
from nodus.agent.probe import plain_allreduce_busbw
rank, port, nbytes, iters = (int(x) for x in sys.argv[1:5])
print(plain_allreduce_busbw(rank, 2, "127.0.0.1", port, nbytes, iters))
"""


def plain_pair(nbytes: int, iters: int, env: dict[str, str]) -> float:
    """busbw (Gbit/s) of `plain_allreduce_busbw` on 2 processes; the slower rank's figure."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", PLAIN, str(rank), str(port), str(nbytes), str(iters)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for rank in range(2)]
    figures = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            if p.returncode != 0:
                raise RuntimeError(f"plain all-reduce exited {p.returncode}:\n{err.decode()[-2000:]}")
            figures.append(float(out.decode().split()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return min(figures)


ECHO = """
import socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(4096):
    conn.sendall(data)
"""


def echo_rtt_ms(pings: int = 200) -> float:
    """Median round trip of a 1-byte exchange with a bare echo server in another process, on loopback."""
    p = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            samples = []
            for i in range(pings + 5):
                t = time.perf_counter()
                s.sendall(b".")
                s.recv(1)
                if i >= 5:
                    samples.append(time.perf_counter() - t)
        return statistics.median(samples) * 1e3
    finally:
        p.kill()
        p.wait()


class OthersLoad:
    """The CPU that the rest of the machine used while a block ran, in cores: busy time of all CPUs (steal
    included) minus this process's and its waited-for children's. Other work shares this host's CPUs, and
    both all-reduces are CPU-bound on loopback, so every figure is printed beside it."""

    def __enter__(self) -> "OthersLoad":
        self.cores = 0.0
        self._start = (psutil.cpu_times(), os.times(), time.monotonic())
        return self

    def __exit__(self, *exc: Any) -> None:
        (c0, o0, t0), c1, o1 = self._start, psutil.cpu_times(), os.times()
        fields = ("user", "nice", "system", "irq", "softirq", "steal")
        busy = lambda c: sum(getattr(c, f, 0.0) for f in fields)  # noqa: E731
        ours = lambda o: o.user + o.system + o.children_user + o.children_system  # noqa: E731
        self.cores = max(0.0, (busy(c1) - busy(c0)) - (ours(o1) - ours(o0))) / max(1e-9, time.monotonic() - t0)


def probe_vs_plain(max_bytes: int, rounds: int) -> dict[str, Any]:
    """`rounds` probe/plain pairs, alternating which goes first; the first probe sets the plain loop's size
    (the probe's largest) and its iterations (about PLAIN_SECONDS at the probe's time per iteration)."""
    # The probe binds gloo to the loopback interface itself; the plain loop gets the same, so both use one path.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": loopback_interface()}
    probes: list[dict[str, Any]] = []
    plains: list[float] = []
    others: list[tuple[float, float]] = []
    """(cores used by other work during the probe, during the plain loop) per round."""
    nbytes = iters = 0
    for i in range(rounds):
        load = {}
        for what in ("probe", "plain") if i % 2 == 0 else ("plain", "probe"):
            with OthersLoad() as load[what]:
                if what == "probe":
                    report = probe_pair(max_bytes, 30.0, env)
                    probes.append(report)
                    if not nbytes:
                        nbytes = int(report["bytes"])
                        iters = max(10, math.ceil(PLAIN_SECONDS / max(float(report["sizes"][-1]["seconds"]), 1e-6)))
                else:
                    plains.append(plain_pair(nbytes, iters, env))
        others.append((load["probe"].cores, load["plain"].cores))
        log(f"  round {i + 1}: probe {probes[-1]['bus_gbps']:.2f} Gbit/s ({probes[-1]['sizes'][-1]['iters']} iters, "
            f"others used {others[-1][0]:.2f} cores), plain {plains[-1]:.2f} Gbit/s ({iters} iters, others "
            f"{others[-1][1]:.2f} cores) at {nbytes} B")
    return {"probes": probes, "plains": plains, "others": others, "bytes": nbytes, "iters": iters,
            "echo_ms": echo_rtt_ms()}
