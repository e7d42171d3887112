"""Gangs across real network namespaces: three "hosts" on a bridge, a coordinator on the host side.

Each host is a network namespace (tests/netns.py) running its own `nodus-agent`, advertising its
own 198.18.X.Y address; the coordinator listens on the bridge's address in the root namespace.

- The mesh probe agrees with plain measurements taken between the same two namespaces in the same
  run: `status.gang.probe.rttMs` with a bare TCP echo (1-byte pings, TCP_NODELAY, median), and, with
  a 200 Mbit/s tbf limit on one member's link, `busGbps` with a plain torch.distributed all-reduce
  loop of the probe's largest size (and clearly below the unlimited figure).
  Every host's processes run on one CPU (host i on CPU i mod n), the agent and so its probe as
  much as the yardsticks: a Python ping-pong's RTT on a small shared machine depends on whether its
  two ends share a core. Even so it moves by ±20-30 % from one burst to the next with the machine's
  other load, which is the tolerance: the RTT test is the one likely to fail on a busy machine.
- A link cut while Running: the cut member is Lost when its node's lease lapses, the gang restarts
  as a whole at epoch 2 with that rank on the spare host and the other rank on its own, and once the
  link heals the old agent reconnects with nothing of its stale attempt left running.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import grpc
import psutil
import pytest

import netns
from conftest import Coordinator
from e2e import AGENT_ENV, attempts_of, create, ended, joined, wait_job
from netns import Host, Lab
from nodus.agent.layout import AttemptLayout
from nodus.agent.statefile import read_json
from agent_double import AgentProcess, wait_for
from nodus.v1 import node_pb2, node_pb2_grpc

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))]

PY = sys.executable
PROBE_BYTES = 8 << 20
"""The probe's largest all-reduce: 0.34 s per iteration at 200 Mbit/s, far past the tbf burst."""
LIMIT_MBIT = 200
ECHO_PORT, STORE_PORT = 7100, 7101   # each namespace is fresh: fixed ports cannot clash
TOLERANCE = 0.20


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab(3) as lab:
        yield lab


@pytest.fixture(scope="module")
def c(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    # The 30 s budget (the most allowed): at 200 Mbit/s and on a busy machine, 20 s ran out before the
    # sweep reached PROBE_BYTES, and the figure was then a smaller size's.
    with Coordinator(tmp_path_factory.mktemp("netns-coordinator") / "data").start(
            host=lab.gateway, extra_args=("--lease-duration", "4s", "--heartbeat-interval", "1s", "--gang-probe-bytes",
                                          str(PROBE_BYTES), "--gang-probe-budget", "30s")) as coordinator:
        yield coordinator


CPUS = sorted(os.sched_getaffinity(0))


def pinned(host: Host, cmd: list[str]) -> list[str]:
    """`cmd` on one CPU per host (host i on the i-th CPU, round robin), inherited by its children.

    Microsecond RTTs on a small shared machine depend on where the scheduler puts the two ends (the
    same core or two, which changes from moment to moment); pinning every host's processes, the agent
    (and so its probe) as much as the plain yardsticks, makes both see the same placement."""
    if shutil.which("taskset") is None:
        return cmd
    cpu = CPUS[int(host.name.removeprefix("host")) % len(CPUS)]
    return ["taskset", "-c", str(cpu), *cmd]


def node_name(host: Host) -> str:
    return f"netns-{host.name}"


def agent_in(host: Host, c: Coordinator, token: str, root: Path) -> AgentProcess:
    """A real nodus-agent inside `host`'s namespace (`ip netns exec` and taskset exec it: the pid is the
    agent's)."""
    a = AgentProcess(root / host.name, c.grpc, token, node=node_name(host), env=AGENT_ENV,
                     extra_args=("--advertise-address", host.address))
    with open(a.log_path, "ab") as log:
        a.proc = host.popen(pinned(host, a.argv()), stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **AGENT_ENV}, start_new_session=True)
    return a


@pytest.fixture(scope="module")
def agents(lab: Lab, c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AgentProcess]]:
    root = tmp_path_factory.mktemp("netns-agents")
    with joined([agent_in(h, c, c.join_token, root) for h in lab.hosts]) as started:
        yield started


def _nodes(c: Coordinator, method: str, request: Any) -> Any:
    with grpc.insecure_channel(c.grpc) as channel:
        rpc = getattr(node_pb2_grpc.NodeServiceStub(channel), method)
        return rpc(request, metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)


def cordon(c: Coordinator, host: Host, on: bool) -> None:
    """Keeps gangs off `host` (the spare) until a test wants it used."""
    if on:
        _nodes(c, "Cordon", node_pb2.CordonRequest(name=node_name(host), message="spare"))
    else:
        _nodes(c, "Uncordon", node_pb2.UncordonRequest(name=node_name(host)))


def node_ready(c: Coordinator, host: Host) -> bool:
    return bool(_nodes(c, "GetNode", node_pb2.GetNodeRequest(name=node_name(host))).phase == node_pb2.NODE_PHASE_READY)


def gang(obj: dict[str, Any]) -> dict[str, Any]:
    return (obj.get("status") or {}).get("gang") or {}


def nodes_by_rank(c: Coordinator, name: str, epoch: int) -> dict[int, str]:
    return {a["spec"]["gang"]["rank"]: a["spec"]["node"] for a in attempts_of(c, name)
            if a["spec"]["gang"]["epoch"] == epoch}


# --- plain measurements, the yardsticks ---------------------------------------------------------------

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


def within(measured: float, reference: float, tolerance: float = TOLERANCE) -> bool:
    return abs(measured - reference) <= tolerance * reference


def probe_gang(c: Coordinator, name: str, hosts: tuple[Host, Host]) -> dict[str, Any]:
    """Runs a trivial 2-node Plain gang on `hosts` to the end and returns its status.gang.probe."""
    create(c, name, command=["true"], distributed={"nodes": 2, "launcher": "Plain"})
    status = ended(c, name)["status"]
    assert status["phase"] == "Succeeded", status
    assert set(nodes_by_rank(c, name, 1).values()) == {node_name(h) for h in hosts}
    probe = status["gang"]["probe"]
    assert probe.get("rttMs") and probe.get("busGbps") and probe.get("path") == "Private", probe
    members = [a["status"].get("gang", {}).get("probe", {}) for a in attempts_of(c, name)]
    print(f"{name}: gang probe {probe}; members {members}")
    return probe


@dataclass(frozen=True)
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


@pytest.fixture(scope="module")
def unlimited(lab: Lab, c: Coordinator, agents: list[AgentProcess]) -> list[Unlimited]:
    """Gangs' probes, each beside a raw echo between the same namespaces: up to RTT_RUNS, until one
    agrees within the tolerance."""
    h0, h1, spare = lab.hosts
    runs: list[Unlimited] = []
    cordon(c, spare, True)
    try:
        for i in range(RTT_RUNS):
            runs.append(measure_unlimited(c, agents, (h0, h1), f"probe-free-{i}"))
            if within(*_rtt_pair(runs[-1])):
                break
    finally:
        cordon(c, spare, False)
    return runs


def _rtt_pair(run: Unlimited) -> tuple[float, float]:
    """(the probe's RTT, the raw echo's: the mean of its two directions' medians over the same window)."""
    return float(run.probe["rttMs"]), sum(run.raw_ms) / len(run.raw_ms)


RTT_RUNS = 3


def test_the_probe_rtt_agrees_with_a_raw_tcp_echo_between_the_same_namespaces(unlimited: list[Unlimited]) -> None:
    """Within ±20 % of a raw TCP echo taken beside it (one process per host, as the probe is; see
    ECHO_HOST). At ~30 µs on a shared 2-core machine one moment of load moves a single measurement by
    about the tolerance, so up to three gangs are measured and the last must agree; none may be off
    by a factor of two (a probe timing its own process, not the network, read 1.2 ms for 40 µs)."""
    for run in unlimited:
        rtt, reference = _rtt_pair(run)
        print(f"rtt: probe {rtt:.3f} ms, raw echo {run.raw_ms[0]:.3f} / {run.raw_ms[1]:.3f} ms (h0->h1 / h1->h0), "
              f"{(rtt / reference - 1) * 100:+.0f} %; h0->h1 bursts around the probe's start: "
              f"{', '.join(run.series)}")
        assert reference / 2 <= rtt <= reference * 2, (rtt, run.raw_ms)
    assert within(*_rtt_pair(unlimited[-1])), [_rtt_pair(r) for r in unlimited]


@pytest.mark.skipif(shutil.which("tc") is None, reason="`tc` is not installed")
def test_the_probe_busbw_at_200_mbit_agrees_with_a_plain_all_reduce_loop(
        lab: Lab, c: Coordinator, agents: list[AgentProcess], unlimited: list[Unlimited]) -> None:
    h0, h1, spare = lab.hosts
    cordon(c, spare, True)
    lab.limit(1, LIMIT_MBIT)
    try:
        limited = probe_gang(c, "probe-limited", (h0, h1))
        plain = plain_allreduce_gbps(h0, h1, PROBE_BYTES, 5)
    finally:
        lab.unlimit(1)
        cordon(c, spare, False)
    free, capped = min(float(run.probe["busGbps"]) for run in unlimited), float(limited["busGbps"])
    print(f"busbw: probe {free:.3f} Gbit/s unlimited, {capped:.3f} Gbit/s at {LIMIT_MBIT} Mbit/s; plain loop "
          f"{plain:.3f} Gbit/s, {(capped / plain - 1) * 100:+.0f} %")
    assert within(capped, plain), (capped, plain)
    assert capped < 0.5 * free, (capped, free)
    assert capped < LIMIT_MBIT / 1000 * 1.1, capped


# --- a link cut while Running -------------------------------------------------------------------------

LONG_IN_EPOCH_1 = textwrap.dedent("""
    import os, sys, time
    epoch, rank = int(os.environ["NODUS_GANG_EPOCH"]), os.environ["NODUS_RANK"]
    for step in range(60 if epoch == 1 else 1):
        print(f"rank {rank} epoch {epoch} step {step}", flush=True)
        time.sleep(1)
""")


def survivors(host: Host, agent: AgentProcess, attempt_id: str, script: Path) -> list[str]:
    """Processes in `host`'s namespace that belong to the attempt: its supervisor, its process groups,
    or anything running its script."""
    status = read_json(AttemptLayout.of(agent.work_dir, attempt_id).status) or {}
    pids = {int(p) for p in [status.get("supervisor_pid"), *(status.get("process_groups") or [])] if p}
    out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=True).stdout
    found = []
    for pid in map(int, out.split()):
        try:
            p = psutil.Process(pid)
            cmdline = " ".join(p.cmdline())
            if pid in pids or os.getpgid(pid) in pids or str(script) in cmdline:
                found.append(f"{pid} {cmdline}")
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def test_a_link_cut_while_running_restarts_the_gang_on_the_spare_host(
        lab: Lab, c: Coordinator, agents: list[AgentProcess], tmp_path: Path) -> None:
    h0, h1, spare = lab.hosts
    script = tmp_path / "long_in_epoch_1.py"
    script.write_text(LONG_IN_EPOCH_1)
    cordon(c, spare, True)
    try:
        create(c, "cut", command=["python3", str(script)], distributed={"nodes": 2, "launcher": "Plain"})
        wait_job(c, "cut", lambda o: gang(o).get("phase") == "Running", what="the gang to run")
    finally:
        cordon(c, spare, False)
    first = nodes_by_rank(c, "cut", 1)
    assert set(first.values()) == {node_name(h0), node_name(h1)}, first
    cut_rank = next(r for r, n in first.items() if n == node_name(h1))
    kept_rank = 1 - cut_rank
    stale = next(a["spec"]["id"] for a in attempts_of(c, "cut")
                 if a["spec"]["gang"]["epoch"] == 1 and a["spec"]["gang"]["rank"] == cut_rank)
    assert survivors(h1, agents[1], stale, script), "rank on host1 is not running"

    lab.cut(1)
    cut_at = time.monotonic()
    try:
        second = wait_job(c, "cut", lambda o: gang(o).get("epoch") == 2, timeout=40, what="epoch 2")
        restarted_after = time.monotonic() - cut_at
        assert gang(second)["restarts"] == 1, gang(second)
        lost = next(a for a in attempts_of(c, "cut") if a["spec"]["id"] == stale)
        assert lost["status"]["phase"] == "Lost", lost["status"]
        assert not node_ready(c, h1)
        nodes = wait_for(lambda: (n := nodes_by_rank(c, "cut", 2)) and all(n.get(r) for r in (0, 1)) and n, 30,
                         what="epoch 2 placed")
        assert nodes[kept_rank] == node_name(h0), "the rank on the healthy host keeps it"
        assert nodes[cut_rank] == node_name(spare), "the cut rank moves to the spare host"
    finally:
        lab.restore(1)
    restored_at = time.monotonic()

    # The old agent comes back: its stale attempt stays terminal and nothing of it runs on host1.
    wait_for(lambda: node_ready(c, h1), 30, what="host1's agent to reconnect")
    reconnected_after = time.monotonic() - restored_at
    wait_for(lambda: not survivors(h1, agents[1], stale, script), 20, what=f"no process of {stale} left in host1")
    clean_after = time.monotonic() - restored_at
    end = ended(c, "cut", timeout=90)
    print(f"cut: epoch 2 {restarted_after:.1f}s after the cut (lease 4s); after the restore host1 was Ready in "
          f"{reconnected_after:.1f}s and clear of {stale} in {clean_after:.1f}s")
    status = end["status"]
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["epoch"] == 2 and status["gang"]["restarts"] == 1, status["gang"]
    lost = next(a for a in attempts_of(c, "cut") if a["spec"]["id"] == stale)
    assert lost["status"]["phase"] == "Lost", lost["status"]
    assert agents[1].proc.poll() is None, "the old agent survived the partition"
    assert not survivors(h1, agents[1], stale, script)
