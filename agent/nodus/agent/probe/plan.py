"""The probe's plan (validated from stdin), its time budget and the report it prints.

Phase deadlines are fractions of the budget; the report is written by the main thread and may be
printed by the watchdog when the budget runs out.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

log = logging.getLogger("nodus.agent.probe")

NetworkPath = Literal["Private", "Public"]

RTT_END = 0.35      # connects (with retries while peers start) and pings end here
INIT_END = 0.6      # the all-reduce rendezvous (store, process group) must be done by here
SIZES_END = 0.85    # no all-reduce size starts unless it is predicted to finish by here
ECHO_END = 0.95     # the echo server waits for late pingers until here
WATCHDOG = 0.98     # whatever still runs here is cut short: the report is printed, the process exits

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
        self.path: NetworkPath = gang_path(plan)
        self._lock = threading.Lock()
        self._printed = False
        self._phase = "start"
        self._phase_since = time.monotonic()
        self.phase_seconds: dict[str, float] = {}
        """Seconds spent in each phase so far, in the order they came: where a slow probe's time went."""

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.phase_seconds[self._phase] = self.phase_seconds.get(self._phase, 0.0) + now - self._phase_since
            self._phase, self._phase_since = name, now

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
            phases = {**self.phase_seconds,
                      self._phase: self.phase_seconds.get(self._phase, 0.0) + time.monotonic() - self._phase_since}
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
            "phase_seconds": {name: round(sec, 4) for name, sec in phases.items()},
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
