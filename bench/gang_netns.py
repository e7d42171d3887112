#!/usr/bin/env python3
"""The mesh probe across real network namespaces, beside plain measurements between the same two.

    .venv/bin/python bench/gang_netns.py [--runs 3] [--probe-bytes 8Mi] [--plain-iters 5] [--tiny] [--save]

Needs root (network namespaces, tc). Two "hosts" of tests/netns.py's Lab on a bridge, each running a
real `nodus-agent` pinned to one CPU (host i on CPU i mod n, as in tests/test_gang_netns.py), and a
coordinator on the bridge's address. Figures, each beside its yardstick from the same run:
  1  a 2-node gang's `status.gang.probe.rttMs`, --runs gangs, each beside a bare TCP echo between the
     same namespaces (1-byte pings, TCP_NODELAY, one process per host as the probe is), the bursts
     taken while the probe pinged; probe ÷ echo per run.
  2  the probe's `busGbps` unlimited, and with a 200 Mbit/s tbf limit on one member's link, each beside
     a plain torch.distributed (gloo) all-reduce loop of the probe's largest size between the same two
     namespaces; probe ÷ plain.
The test keeps the functional half (a figure per gang, the limited gang's all-reduce carried over
the shaped link); the rates against the tbf ceiling, the agreement, and how far below the unlimited
link the limited one reads are read here: on a shared 2-core machine a ~30 µs RTT moves by ±20-30 %
from one burst to the next. A benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the lab and the test's gang helpers
import netns  # noqa: E402
from agent_double import AgentProcess  # noqa: E402
from conftest import Coordinator  # noqa: E402
from e2e import joined  # noqa: E402
from netns import Host, Lab  # noqa: E402
from test_gang_netns import LIMIT_MBIT, agent_in, pinned, probe_gang  # noqa: E402

import record  # noqa: E402

PY = sys.executable
ECHO_PORT, STORE_PORT = 7100, 7101   # each namespace is fresh: fixed ports cannot clash


# One process per host, like a probe: an echo server (a thread per connection) and, once told to go, a
# pinger toward the other host: on a new connection each time, 1-byte exchanges with TCP_NODELAY, 5
# warm-ups and 50 timed back to back, the median; a burst every 50 ms, one line "wall-clock-time
# median-ms" per burst until killed. One process, as the probe is: a server and a pinger in separate
# processes on one pinned core pay a process switch (not a thread switch) on every exchange, which on
# this machine reads ~25 % slower than the probe's threads. A new connection matters too: one that has
# carried thousands of exchanges reads ~25 % lower (Linux stops sending a separate ACK per message).
ECHO_HOST = """
import socket, statistics, sys, threading, time
me, peer, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.create_server((me, port))
def serve(c):
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := c.recv(4096):
            c.sendall(data)
def accept():
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
while True:
    with socket.create_connection((peer, port), timeout=10) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        samples = []
        for i in range(55):
            t = time.perf_counter()
            c.sendall(b".")
            assert c.recv(1) == b"."
            if i >= 5:
                samples.append(time.perf_counter() - t)
    print(time.time(), statistics.median(samples) * 1e3, flush=True)
    time.sleep(0.05)
"""


class RawEcho:
    """A bare TCP echo between two hosts, both directions at once (the probe's members ping each other
    at once too), sampled in bursts for as long as it runs, each end pinned like the agents.

    The RTT of a Python ping-pong on a small shared machine moves between regimes (about 30 and 60 µs
    here) from one second to the next with the machine's other load, so a single measurement taken
    before or after the probe is no yardstick at ±20 %: the bursts taken while the probe pinged are."""

    def __init__(self, a: Host, b: Host) -> None:
        self.hosts = (a, b)
        self.bursts: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> "RawEcho":
        a, b = self.hosts
        for i, (src, dst) in enumerate(((a, b), (b, a))):
            proc = src.popen(pinned(src, [PY, "-c", ECHO_HOST, src.address, dst.address, str(ECHO_PORT)]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for i, proc in enumerate(self.procs):
            assert proc.stdin is not None
            proc.stdin.write("go\n")  # both ends listen: ping
            proc.stdin.flush()
            threading.Thread(target=self._read, args=(proc, self.bursts[i]), daemon=True).start()
        return self

    @staticmethod
    def _read(proc: subprocess.Popen[str], into: list[tuple[float, float]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            at, ms = line.split()
            into.append((float(at), float(ms)))

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()

    def median_ms(self, start: float, end: float) -> tuple[float, float]:
        """Per direction (a→b, b→a): the median of the burst medians taken between `start` and `end`."""
        out = []
        for direction in (0, 1):
            window = [ms for at, ms in list(self.bursts[direction]) if start <= at <= end]
            assert window, f"no raw echo burst between {start} and {end}"
            out.append(statistics.median(window))
        return out[0], out[1]


class ProbeWatch:
    """When each agent's probe subprocess (`python -m nodus.agent.probe`) appeared: it pings its peers
    first thing, so the raw echo bursts of the half second after are the ones beside its pings.

    Reads each agent's /proc children (the agent spawns the probe from its event loop, the main
    thread) every 5 ms: cheap enough not to disturb what is measured, unlike a scan of every process."""

    def __init__(self, agents: list[AgentProcess]) -> None:
        self.pids = [a.proc.pid for a in agents]
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ProbeWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(0.005) and len(self.seen) < len(self.pids):
            for agent in self.pids:
                if agent not in self.seen and any(self._is_probe(child) for child in self._children(agent)):
                    self.seen[agent] = time.time()

    @staticmethod
    def _children(pid: int) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except FileNotFoundError:   # a kernel without CONFIG_PROC_CHILDREN
            try:
                return [p.pid for p in psutil.Process(pid).children()]
            except psutil.Error:
                return []
        except OSError:
            return []

    @staticmethod
    def _is_probe(pid: int) -> bool:
        try:
            return b"nodus.agent.probe" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False


PLAIN_LOOP = ("import sys; from nodus.agent.probe import plain_allreduce_busbw as f; "
              "print(f(int(sys.argv[1]), 2, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))")


def plain_allreduce_gbps(h0: Host, h1: Host, nbytes: int, iters: int) -> float:
    """busbw of a plain gloo all-reduce loop, rank 0 in `h0` and rank 1 in `h1` (rank 0's figure)."""
    procs = [h.popen(pinned(h, [PY, "-c", PLAIN_LOOP, str(rank), h0.address, str(STORE_PORT), str(nbytes), str(iters)]),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     env={**os.environ, "GLOO_SOCKET_IFNAME": h.ifname})
             for rank, h in enumerate((h0, h1))]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    figures = [float(out.strip().splitlines()[-1]) for out, _ in outs]
    print(f"plain all-reduce {nbytes} B x {iters}: {figures} Gbit/s")
    return figures[0]


@dataclass(frozen=True, slots=True)
class Unlimited:
    """The unlimited gang's probe and the raw echo taken beside its pings."""

    probe: dict[str, Any]
    raw_ms: tuple[float, float]
    """Median RTT h0→h1 and h1→h0 of the raw echo bursts taken while the probe pinged."""
    series: list[str]
    """The h0→h1 bursts around the probe's start, for the log."""


def measure_unlimited(c: Coordinator, agents: list[AgentProcess], hosts: tuple[Host, Host], name: str) -> Unlimited:
    """One gang's probe on `hosts` with a raw echo running between the same two namespaces."""
    with RawEcho(*hosts) as raw_echo, ProbeWatch(agents[:2]) as probes:
        probe = probe_gang(c, name, hosts)
    assert len(probes.seen) == 2, "the probe processes were not seen"
    first, last = min(probes.seen.values()), max(probes.seen.values())
    # The probe pings first thing (its all-reduce sweep follows), and both members finish pinging
    # before either moves on: the bursts from the first probe's start to half a second after the
    # second's are the ones beside its pings.
    raw = raw_echo.median_ms(first, last + 0.5)
    series = [f"{at - first:+.2f}s {ms:.3f}" for at, ms in raw_echo.bursts[0] if first - 1 <= at <= last + 1.5]
    return Unlimited(probe, raw, series)




def parse_bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


@dataclass(frozen=True, slots=True)
class Busbw:
    """One link's probe figure beside the plain all-reduce loop's, both in Gbit/s."""

    probe: float
    plain: float


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="unlimited gangs, each beside a raw echo (default 3)")
    ap.add_argument("--probe-bytes", default="8Mi", help="the probe's largest all-reduce (default 8Mi: at 200 "
                                                          "Mbit/s 0.34 s per iteration, far past the tbf burst)")
    ap.add_argument("--plain-iters", type=int, default=5, help="iterations of the plain loop (default 5)")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"runs": 1, "probe_bytes": "1Mi", "plain_iters": 2})
    if (why := netns.available()) is not None:
        print(f"network namespaces unavailable: {why}", file=sys.stderr)
        return 2
    nbytes = parse_bytes(args.probe_bytes)
    limited: Busbw | None = None
    tmp = Path(tempfile.mkdtemp(prefix="nodus-bench-netns-"))
    try:
        with Lab(2) as lab:
            h0, h1 = lab.hosts
            # The 30 s budget (the most allowed): at 200 Mbit/s on a busy machine 20 s ran out before the
            # sweep reached 8 MiB, and the figure was then a smaller size's.
            with Coordinator(tmp / "data").start(
                    host=lab.gateway, extra_args=("--lease-duration", "4s", "--heartbeat-interval", "1s",
                                                  "--gang-probe-bytes", str(nbytes),
                                                  "--gang-probe-budget", "30s")) as c, \
                    joined([agent_in(h, c, c.join_token, tmp) for h in lab.hosts]) as agents:
                runs = [measure_unlimited(c, agents, (h0, h1), f"probe-free-{i}") for i in range(args.runs)]
                unlimited = Busbw(max(float(r.probe["busGbps"]) for r in runs),
                                  plain_allreduce_gbps(h0, h1, nbytes, args.plain_iters))
                if shutil.which("tc") is not None:
                    lab.limit(1, LIMIT_MBIT)
                    try:
                        capped = float(probe_gang(c, "probe-limited", (h0, h1))["busGbps"])
                        limited = Busbw(capped, plain_allreduce_gbps(h0, h1, nbytes, args.plain_iters))
                    finally:
                        lab.unlimit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with record.Report("gang_netns", args):
        report(runs, unlimited, limited, nbytes)
    return 0


def report(runs: list[Unlimited], unlimited: Busbw, limited: Busbw | None, nbytes: int) -> None:
    print(f"nodus mesh probe across network namespaces: 2 hosts on a bridge, each pinned to one of "
          f"{os.cpu_count()} CPUs; probe up to {nbytes >> 20} MiB; busbw = algbw × 2(n−1)/n, 1 Gbit = 1e9 bits")
    for i, run in enumerate(runs):
        rtt = float(run.probe["rttMs"])
        raw = sum(run.raw_ms) / len(run.raw_ms)
        print(f"probe RTT, gang {i}: {rtt:.3f} ms  beside raw TCP echo {raw:.3f} ms "
              f"({run.raw_ms[0]:.3f} / {run.raw_ms[1]:.3f} ms h0→h1 / h1→h0, bursts while the probe pinged); "
              f"probe ÷ echo {rtt / raw:.2f}")
    print(f"probe busbw, unlimited (best of {len(runs)}): {unlimited.probe:.3f} Gbit/s  beside plain all-reduce "
          f"{unlimited.plain:.3f} Gbit/s; probe ÷ plain {unlimited.probe / unlimited.plain:.2f}")
    if limited is None:
        print("probe busbw, tbf-limited: n/a, `tc` is not installed")
    else:
        print(f"probe busbw, {LIMIT_MBIT} Mbit/s tbf: {limited.probe:.3f} Gbit/s  beside plain all-reduce "
              f"{limited.plain:.3f} Gbit/s; probe ÷ plain {limited.probe / limited.plain:.2f}; "
              f"unlimited ÷ limited probe {unlimited.probe / limited.probe:.1f}")


if __name__ == "__main__":
    sys.exit(main())
