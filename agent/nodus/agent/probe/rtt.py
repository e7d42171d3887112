"""The probe's RTT half: an echo server for the peers' pings, and this member's pings to each peer."""
from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from typing import Callable

from .plan import Peer, Plan, Report

WARMUP_PINGS = 5
PING_BURSTS = 4
PING_BURST_GAP = 0.02
"""Seconds between bursts of pings to one peer."""
HELLO = struct.Struct("!I")   # the pinger's rank, echoed back: proves the port is a probe
MORE = 1 << 31
"""Set in HELLO on every connection of a pinger but its last: its close does not mean it is done."""


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
