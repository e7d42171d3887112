"""The gang mesh probe: `python -m nodus.agent.probe < plan.json`, one per member, on every member's host.

Before a multi-node gang starts its program, every member measures the network it will run on: the
TCP round trip to every other member (an echo server here, 1-byte pings there, the median) and the
gang's all-reduce bus bandwidth with torch.distributed, for sizes from 8 B doubling up to `max_bytes`
(nccl-tests' definitions: algbw = bytes / time, busbw = algbw × 2(n−1)/n). The agent reads the last
line of stdout, one JSON object (`Report.to_json`).

The whole probe is bounded by `budget_s`: each phase has a deadline (a fraction of the budget), and a
watchdog prints what was measured so far, with an error, and exits when the budget is spent, whatever
hangs. The exit status is 0 whenever a report is printed (a missing torch, an absent peer or a failed
all-reduce are reported in `error`), and 2 only for a malformed plan, the field named on stderr.

Every rank must issue the same sequence of collectives, so each decision that shapes it (iterations
per size, whether to try the next size) is a pure function of values every rank agrees on through a
MAX all-reduce: no rank waits in a collective that a peer decided to skip.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import socket
import statistics
import struct
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Literal

log = logging.getLogger("nodus.agent.probe")

NetworkPath = Literal["Private", "Public"]

RTT_END = 0.35      # connects (with retries while peers start) and pings end here
INIT_END = 0.6      # the all-reduce rendezvous (store, process group) must be done by here
SIZES_END = 0.85    # no all-reduce size starts unless it is predicted to finish by here
ECHO_END = 0.95     # the echo server waits for late pingers until here
WATCHDOG = 0.98     # whatever still runs here is cut short: the report is printed, the process exits

WARMUP_PINGS = 5
PING_BURSTS = 4
PING_BURST_GAP = 0.02
"""Seconds between bursts of pings to one peer."""
WARMUP_ITERS = 2
CALIBRATION_ITERS = 2   # timed to choose the iteration count; one alone is too noisy
MIN_ITERS = 2
MAX_ITERS = 10_000
TARGET_S = 0.2      # timed window per size, shrunk when the budget cannot afford it
DTYPE_BYTES = 4     # float32 elements
HELLO = struct.Struct("!I")   # the pinger's rank, echoed back: proves the port is a probe
MORE = 1 << 31
"""Set in HELLO on every connection of a pinger but its last: its close does not mean it is done."""

# CGNAT (RFC 6598) and the benchmarking range (RFC 2544, our multi-host tests): not `is_private` everywhere.
_PRIVATE_EXTRA = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("198.18.0.0/15"))


class PlanError(ValueError):
    """The plan on stdin is malformed; `field` names what is wrong (for example `peers[1].probe_port`)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, slots=True)
class Peer:
    """One gang member as the probe reaches it."""

    rank: int
    address: str
    probe_port: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What one member's probe does; `peers` holds every member, this one included, ordered by rank."""

    rank: int
    size: int
    peers: tuple[Peer, ...]
    listen_fd: int | None = None
    """An inherited socket already listening on this member's probe_port; None: bind it here."""
    store_address: str = ""
    store_port: int = 0
    """Where rank 0 hosts torch.distributed's TCPStore."""
    backend: str = "auto"
    max_bytes: int = 64 << 20
    budget_s: float = 30.0
    pings: int = 200
    allreduce: bool = True

    @property
    def me(self) -> Peer:
        return self.peers[self.rank]

    @property
    def others(self) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p.rank != self.rank)


@dataclass(frozen=True, slots=True)
class SizeResult:
    """One all-reduce size, timed over `iters` back-to-back iterations (the slowest rank's window)."""

    bytes: int
    seconds: float
    """Per iteration."""
    algbw_gbps: float
    busbw_gbps: float
    iters: int


@dataclass(frozen=True, slots=True)
class Budget:
    """The probe's time: phase deadlines are fractions of `total` seconds from `start`."""

    start: float
    total: float
    clock: Callable[[], float] = time.monotonic

    def deadline(self, fraction: float) -> float:
        return self.start + self.total * fraction

    def left(self, fraction: float) -> float:
        return max(0.0, self.deadline(fraction) - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.start


_PLAN_KEYS = {"rank", "size", "peers", "listen_fd", "store", "backend", "max_bytes", "budget_s", "pings",
              "allreduce"}


def _int(obj: dict[str, Any], key: str, where: str, lo: int, hi: int | None = None,
         default: int | None = None) -> int:
    name = f"{where}{key}"
    if key not in obj:
        if default is None:
            raise PlanError(name, "is required")
        return default
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise PlanError(name, f"must be an integer, not {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        raise PlanError(name, f"must be in {lo}..{hi if hi is not None else ''}, not {value}")
    return value


def _address(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PlanError(f"{where}{key}", "must be a non-empty string")
    return value.strip()


def parse_plan(raw: Any) -> Plan:
    """Validates the stdin object; raises PlanError naming the first bad field."""
    if not isinstance(raw, dict):
        raise PlanError("plan", "must be a JSON object")
    unknown = sorted(set(raw) - _PLAN_KEYS)
    if unknown:
        raise PlanError(unknown[0], "is not a plan field")
    size = _int(raw, "size", "", 1)
    rank = _int(raw, "rank", "", 0, size - 1)
    peers_raw = raw.get("peers")
    if not isinstance(peers_raw, list) or len(peers_raw) != size:
        raise PlanError("peers", f"must be a list of {size} members (one per rank)")
    peers = []
    for i, p in enumerate(peers_raw):
        where = f"peers[{i}]."
        if not isinstance(p, dict):
            raise PlanError(f"peers[{i}]", "must be an object")
        if _int(p, "rank", where, 0, size - 1) != i:
            raise PlanError(f"{where}rank", f"must be {i}: peers are ordered by rank")
        peers.append(Peer(i, _address(p, "address", where), _int(p, "probe_port", where, 1, 65535)))
    listen_fd = _int(raw, "listen_fd", "", 0) if "listen_fd" in raw else None
    allreduce = raw.get("allreduce", True)
    if not isinstance(allreduce, bool):
        raise PlanError("allreduce", "must be true or false")
    store_address, store_port = "", 0
    if "store" in raw or (allreduce and size > 1):
        store = raw.get("store")
        if not isinstance(store, dict):
            raise PlanError("store", "must be an object {address, port} (required for the all-reduce)")
        store_address, store_port = _address(store, "address", "store."), _int(store, "port", "store.", 1, 65535)
    backend = raw.get("backend", "auto")
    if backend not in ("auto", "gloo", "nccl"):
        raise PlanError("backend", f"must be auto, gloo or nccl, not {backend!r}")
    budget = raw.get("budget_s", 30.0)
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget < 86400:
        raise PlanError("budget_s", "must be a number of seconds > 0")
    return Plan(rank=rank, size=size, peers=tuple(peers), listen_fd=listen_fd, store_address=store_address,
                store_port=store_port, backend=backend, max_bytes=_int(raw, "max_bytes", "", 8, None, 64 << 20),
                budget_s=float(budget), pings=_int(raw, "pings", "", 1, 100_000, 200), allreduce=allreduce)


def classify_path(local_address: str, peer_address: str) -> NetworkPath:
    """Private when both ends are private, loopback, link-local, CGNAT or benchmarking addresses."""
    return "Private" if _is_private(local_address) and _is_private(peer_address) else "Public"


def _is_private(address: str) -> bool:
    try:
        ips = [ipaddress.ip_address(address.strip("[]"))]
    except ValueError:
        try:
            ips = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in socket.getaddrinfo(address, None)]
        except (OSError, UnicodeError, ValueError):
            return False
    if not ips:
        return False
    for ip in ips:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not (ip.is_private or ip.is_loopback or ip.is_link_local
                or any(ip in net for net in _PRIVATE_EXTRA if net.version == ip.version)):
            return False
    return True


def gang_path(plan: Plan) -> NetworkPath:
    """Public when this member reaches any peer over a public address."""
    me = plan.me.address
    return "Public" if any(classify_path(me, p.address) == "Public" for p in plan.others) else "Private"


def bus_factor(size: int) -> float:
    """nccl-tests' all-reduce busbw / algbw: 2(n−1)/n, the share of the data each link carries."""
    return 2 * (size - 1) / size


def message_sizes(max_bytes: int) -> list[int]:
    """8 B doubling while ≤ max_bytes."""
    sizes, n = [], 8
    while n <= max_bytes:
        sizes.append(n)
        n *= 2
    return sizes


def _sig(x: float) -> float:
    """Six significant digits: a slow link's figure must not round to zero."""
    return float(f"{x:.6g}")


class Report:
    """What the probe has measured so far; the main thread writes it, the watchdog may print it."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.rtt_ms: dict[int, float] = {}
        self.sizes: list[SizeResult] = []
        self.errors: list[str] = []
        self.backend = plan.backend if plan.backend != "auto" else "none"
        self.phase = "start"
        self.path: NetworkPath = gang_path(plan)
        self._lock = threading.Lock()
        self._printed = False

    def set_rtt(self, rank: int, ms: float) -> None:
        with self._lock:
            self.rtt_ms[rank] = ms

    def add_size(self, result: SizeResult) -> None:
        with self._lock:
            self.sizes.append(result)

    def fail(self, message: str) -> None:
        log.warning("rank %d: %s", self.plan.rank, message)
        with self._lock:
            self.errors.append(message)

    def to_json(self) -> dict[str, Any]:
        """The probe's answer. RTTs are medians in ms keyed by the peer's rank (unreachable peers are
        missing and named in `error`); `bus_gbps`, `algbw_gbps` and `bytes` are those of the largest size
        measured; each of `sizes` gives seconds per iteration. Gbit/s are 1e9 bits per second."""
        with self._lock:
            rtt = dict(self.rtt_ms)
            sizes = list(self.sizes)
            errors = list(self.errors)
        worst = max(rtt, key=lambda r: rtt[r]) if rtt else None
        last = sizes[-1] if sizes else None
        return {
            "rank": self.plan.rank,
            "rtt_ms": {str(r): _sig(ms) for r, ms in sorted(rtt.items())},
            "worst_rtt_ms": _sig(rtt[worst]) if worst is not None else None,
            "worst_peer": worst,
            "bus_gbps": _sig(last.busbw_gbps) if last else None,
            "algbw_gbps": _sig(last.algbw_gbps) if last else None,
            "bytes": last.bytes if last else 0,
            "sizes": [{"bytes": s.bytes, "seconds": _sig(s.seconds), "algbw_gbps": _sig(s.algbw_gbps),
                       "busbw_gbps": _sig(s.busbw_gbps), "iters": s.iters} for s in sizes],
            "backend": self.backend,
            "path": self.path,
            "error": "; ".join(errors),
        }

    def print_once(self, stream: Any) -> bool:
        """Writes the JSON line unless it was written already (by the watchdog or the main thread)."""
        line = json.dumps(self.to_json())
        with self._lock:
            if self._printed:
                return False
            self._printed = True
        stream.write("\n" + line + "\n")
        stream.flush()
        return True


# --- RTT ---------------------------------------------------------------------------------------------

def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return buf


class EchoServer:
    """Echoes every byte back on each accepted connection (a thread per connection).

    A pinger first sends its rank (HELLO); the server remembers which ranks' connections have closed,
    so a member without a rendezvous barrier can wait until every peer is done pinging it.
    """

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self._stop = threading.Event()
        self._finished: set[int] = set()
        self._cond = threading.Condition()

    def start(self) -> "EchoServer":
        self._listener.settimeout(0.2)   # so the accept loop notices close()
        threading.Thread(target=self._accept_loop, name="probe-echo", daemon=True).start()
        return self

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="probe-echo-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rank = None
        with conn:
            try:
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = _recv_exactly(conn, HELLO.size)
                conn.sendall(hello)
                rank = HELLO.unpack(hello)[0]
                if rank & MORE:
                    rank = None  # more connections of this pinger follow
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass
        if rank is not None:
            with self._cond:
                self._finished.add(rank)
                self._cond.notify_all()

    def wait_finished(self, ranks: set[int], timeout: float) -> set[int]:
        """Waits until every rank in `ranks` has closed its echo connection; returns those that have not."""
        with self._cond:
            self._cond.wait_for(lambda: ranks <= self._finished, timeout=max(0.0, timeout))
            return ranks - self._finished

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


def open_listener(plan: Plan) -> socket.socket:
    """The inherited listening socket, or one bound to this member's address and probe_port."""
    if plan.listen_fd is not None:
        return socket.socket(fileno=plan.listen_fd)
    me = plan.me
    family, kind, proto, _, addr = socket.getaddrinfo(me.address, me.probe_port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(max(16, plan.size + 8))
    return sock


def _connect(peer: Peer, deadline: float, clock: Callable[[], float]) -> socket.socket:
    """Connects, retrying while the peer is not listening yet, until `deadline`."""
    delay, last = 0.02, "no attempt"
    while (left := deadline - clock()) > 0:
        try:
            sock = socket.create_connection((peer.address, peer.probe_port), timeout=min(2.0, left))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            last = str(e) or type(e).__name__
        time.sleep(max(0.0, min(delay, deadline - clock())))
        delay = min(delay * 2, 0.5)
    raise TimeoutError(f"not reachable at {peer.address}:{peer.probe_port} ({last})")


def ping(connect: Callable[[], socket.socket], rank: int, pings: int, until: float, deadline: float,
         clock: Callable[[], float] = time.monotonic) -> float:
    """Median round trip (ms) of up to `pings` 1-byte exchanges; stops early at `until` (keeping at least
    one sample) and fails at `deadline`.

    The pings come in PING_BURSTS bursts a little apart, each on a connection of its own after a few
    warm-ups, and the figure is the median of the bursts' medians: one moment of load on either host
    (a process starting, the peer's own pings) weighs no more than its burst, and no burst runs on a
    connection long enough for the kernel to change how it acknowledges (a long ping-pong connection
    reads ~25 % faster than a fresh one)."""
    burst = max(1, pings // PING_BURSTS)
    medians: list[float] = []
    for b in range(PING_BURSTS):
        last = b == PING_BURSTS - 1 or (bool(medians) and clock() > until)
        with connect() as sock:
            sock.settimeout(max(0.05, deadline - clock()))
            hello = HELLO.pack(rank | (0 if last else MORE))
            sock.sendall(hello)
            if _recv_exactly(sock, HELLO.size) != hello:
                raise ConnectionError("the port does not answer as a probe echo")
            samples: list[float] = []
            for i in range(WARMUP_PINGS + burst):
                if samples and clock() > until:
                    break
                t = time.perf_counter()
                sock.sendall(b".")
                _recv_exactly(sock, 1)
                if i >= WARMUP_PINGS or clock() > until:
                    samples.append(time.perf_counter() - t)
            medians.append(statistics.median(samples))
        if last:
            break
        time.sleep(min(PING_BURST_GAP, max(0.0, until - clock())))
    return statistics.median(medians) * 1e3


def measure_rtt(plan: Plan, report: Report, deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Connects to every peer at once (peers start at different times) but pings one at a time, so the
    pings do not compete for this host's CPU; each peer gets an equal share of the time that is left."""
    turn = threading.Lock()
    pending = [len(plan.others)]

    def one(peer: Peer) -> None:
        try:
            first = [_connect(peer, deadline, clock)]  # waits for the peer to listen; then its turn

            def connect() -> socket.socket:
                return first.pop() if first else _connect(peer, deadline, clock)
            with turn:
                until = clock() + (deadline - clock()) / max(1, pending[0])
                report.set_rtt(peer.rank, ping(connect, plan.rank, plan.pings, until, deadline, clock))
        except OSError as e:
            report.fail(f"rtt to rank {peer.rank}: {e}")
        finally:
            with turn:
                pending[0] -= 1

    threads = [threading.Thread(target=one, args=(p,), name=f"probe-ping-{p.rank}", daemon=True)
               for p in plan.others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - clock()) + 1.0)


# --- all-reduce --------------------------------------------------------------------------------------

def _interface_of(address: str) -> str | None:
    """The local interface that holds `address`, so gloo and NCCL bind where the peers can reach them."""
    try:
        import psutil
        ips = {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(address, None)}
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] in ips for a in addrs):
                return str(name)
    except (ImportError, OSError, UnicodeError):
        pass
    return None


def _timed_loop(dist: Any, sync: Callable[[], None], tensor: Any, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    return time.perf_counter() - t


def measure_allreduce(plan: Plan, report: Report, budget: Budget) -> None:
    """Rendezvous through rank 0's TCPStore, then time all-reduces of doubling sizes while time lasts."""
    report.phase = "all-reduce setup"
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        report.fail(f"all-reduce skipped: torch is not importable ({e})")
        return
    if not dist.is_available():
        report.fail("all-reduce skipped: this torch has no torch.distributed")
        return
    iface = _interface_of(plan.me.address)
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    report.phase = "all-reduce rendezvous"
    store = dist.TCPStore(plan.store_address, plan.store_port, plan.size, plan.rank == 0,  # type: ignore[attr-defined]
                          timeout=timedelta(seconds=max(1.0, budget.left(INIT_END))), wait_for_workers=True)
    # Later store reads (the process group's own rendezvous, the done count) may take the whole budget.
    store.set_timeout(timedelta(seconds=budget.left(1.0) + 10))
    local_nccl = bool(torch.cuda.is_available() and dist.is_nccl_available())
    store.set(f"nodus-probe/nccl/{plan.rank}", "1" if local_nccl else "0")
    lacking = [r for r in range(plan.size) if store.get(f"nodus-probe/nccl/{r}") != b"1"]
    if plan.backend == "nccl" and lacking:
        raise RuntimeError(f"nccl requested but rank(s) {lacking} have no CUDA device or NCCL")
    backend = "nccl" if plan.backend == "nccl" or (plan.backend == "auto" and not lacking) else "gloo"
    report.backend = backend
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
    # Past the budget the watchdog reports and exits; the collective timeout only backs it up.
    dist.init_process_group(backend, store=store, rank=plan.rank, world_size=plan.size,
                            timeout=timedelta(seconds=budget.left(1.0) + 10),
                            device_id=device if backend == "nccl" else None)
    report.phase = "all-reduce sizes"
    try:
        _sweep(plan, report, budget, torch, dist, sync, device)
    except Exception as e:  # noqa: BLE001 - reported before a teardown that a lost peer could stall
        report.fail(_describe(e, report.phase))
        dist.destroy_process_group()
        return
    report.phase = "all-reduce teardown"
    # Rank 0 hosts the store: it stays until every rank is done with it.
    store.add("nodus-probe/done", 1)
    if plan.rank == 0:
        end = time.monotonic() + min(2.0, budget.left(1.0))
        while store.add("nodus-probe/done", 0) < plan.size and time.monotonic() < end:
            time.sleep(0.01)
    dist.destroy_process_group()


def _describe(e: BaseException, phase: str) -> str:
    return f"all-reduce ({phase}): {type(e).__name__}: {str(e).strip()[:300]}"


def _sweep(plan: Plan, report: Report, budget: Budget, torch: Any, dist: Any, sync: Callable[[], None],
           device: Any) -> None:
    def agree(*values: float) -> list[float]:
        """The maximum over ranks of each value: identical on every rank, so decisions stay in step."""
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    sizes = message_sizes(plan.max_bytes)
    stop_at = budget.total * SIZES_END
    (elapsed,) = agree(budget.elapsed())
    target = max(0.01, min(TARGET_S, 0.5 * (stop_at - elapsed) / len(sizes)))
    per_iter = 0.0   # of the previous size
    for nbytes in sizes:
        predicted = (WARMUP_ITERS + CALIBRATION_ITERS + MIN_ITERS) * 2 * per_iter + target + 0.05
        if elapsed + predicted > stop_at:
            if not report.sizes:
                report.fail(f"all-reduce: no time left in the {plan.budget_s:g}s budget")
            log.info("rank %d: stopping before %d B (%.2fs elapsed)", plan.rank, nbytes, elapsed)
            return
        tensor = torch.zeros(nbytes // DTYPE_BYTES, dtype=torch.float32, device=device)
        _timed_loop(dist, sync, tensor, WARMUP_ITERS)
        agree(0.0)   # barrier: every rank starts the calibration together
        calibration, _ = agree(_timed_loop(dist, sync, tensor, CALIBRATION_ITERS), 0.0)
        iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(target * CALIBRATION_ITERS / max(calibration, 1e-9))))
        agree(0.0)
        seconds, elapsed = agree(_timed_loop(dist, sync, tensor, iters), budget.elapsed())
        per_iter = seconds / iters
        algbw = nbytes * 8 / per_iter / 1e9
        report.add_size(SizeResult(nbytes, per_iter, algbw, algbw * bus_factor(plan.size), iters))


def plain_allreduce_busbw(rank: int, size: int, store_address: str, store_port: int, nbytes: int, iters: int,
                          backend: str = "gloo", timeout_s: float = 60.0) -> float:
    """busbw (Gbit/s) of a plain loop: two warm-ups, a barrier, `iters` all-reduces of `nbytes` timed on
    this rank. The yardstick the probe is compared against; it shares none of the probe's machinery."""
    import torch
    import torch.distributed as dist
    store = dist.TCPStore(store_address, store_port, size, rank == 0,  # type: ignore[attr-defined]
                          timeout=timedelta(seconds=timeout_s))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s), device_id=device if backend == "nccl" else None)
    try:
        x = torch.zeros(nbytes // DTYPE_BYTES, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - t) / iters
        dist.barrier()   # nobody leaves (rank 0 takes the store with it) while a peer still times
    finally:
        dist.destroy_process_group()
    return nbytes * 8 / seconds / 1e9 * bus_factor(size)


# --- the process -------------------------------------------------------------------------------------

def run_probe(plan: Plan, report: Report, budget: Budget) -> None:
    """RTT to every peer, then the all-reduce sweep, then keep echoing until every peer is done pinging."""
    report.phase = "listen"
    try:
        server: EchoServer | None = EchoServer(open_listener(plan)).start()
    except OSError as e:
        report.fail(f"echo server: cannot listen on {plan.me.address}:{plan.me.probe_port} ({e})")
        server = None
    try:
        report.phase = "rtt"
        measure_rtt(plan, report, budget.deadline(RTT_END), budget.clock)
        if server is not None and plan.allreduce and plan.size > 1:
            # A peer's pings are answered by this process's echo thread, which shares the GIL (and
            # the core) with what comes next here: torch's import, the rendezvous. A peer still
            # pinging then times this process, not the network (40 µs read as 60-80 µs, once as
            # 1.2 ms, in the multi-host tests). So no member moves on before its peers are done.
            report.phase = "rtt (waiting for peers to finish pinging)"
            server.wait_finished({p.rank for p in plan.others}, budget.left(RTT_END))
        if plan.allreduce and plan.size > 1:
            try:
                measure_allreduce(plan, report, budget)
            except Exception as e:  # noqa: BLE001 - any failure of torch.distributed is a report, not a crash
                report.fail(_describe(e, report.phase))
        if server is not None:
            # A completed rendezvous means every peer has pinged already; otherwise this waits for them.
            report.phase = "echo"
            missing = server.wait_finished({p.rank for p in plan.others}, budget.left(ECHO_END))
            if missing:
                report.fail(f"echo: rank(s) {sorted(missing)} did not finish pinging this member")
    finally:
        if server is not None:
            server.close()


def _watchdog(report: Report, budget: Budget) -> None:
    def fire() -> None:
        report.fail(f"the {report.plan.budget_s:g}s budget ran out during {report.phase}")
        if report.print_once(sys.stdout):
            sys.stderr.flush()
            os._exit(0)

    timer = threading.Timer(budget.left(WATCHDOG), fire)
    timer.daemon = True
    timer.start()


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="probe %(levelname)s %(message)s")
    start = time.monotonic()
    try:
        plan = parse_plan(json.loads(sys.stdin.read()))
    except json.JSONDecodeError as e:
        print(f"probe: bad plan: plan: not JSON ({e})", file=sys.stderr)
        return 2
    except PlanError as e:
        print(f"probe: bad plan: {e}", file=sys.stderr)
        return 2
    report = Report(plan)
    budget = Budget(start, plan.budget_s)
    _watchdog(report, budget)
    try:
        run_probe(plan, report, budget)
    except Exception as e:  # noqa: BLE001 - the agent gets a report whatever broke
        log.exception("probe failed")
        report.fail(f"probe ({report.phase}): {type(e).__name__}: {e}")
    report.print_once(sys.stdout)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # no interpreter teardown: daemon threads may sit in sockets or in torch
