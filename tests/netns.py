"""Several "hosts" on one machine for gang tests: Linux network namespaces on a bridge.

A `Lab` makes a bridge in the root namespace with address 198.18.X.1/24 (the gateway, where a
coordinator started by the test listens) and namespaces `host0..hostN-1`, each joined to the
bridge by a veth pair whose namespace end is `eth0` with 198.18.X.(10+i)/24. Links can be
rate-limited (`limit`) or cut (`cut`). Everything is removed on exit, and leftovers of crashed runs
(names carry the owner's pid) are swept when the next lab starts.

    with Lab(2) as lab:
        server = lab.hosts[0].popen([sys.executable, "-m", "http.server", "8000"])
        lab.hosts[1].run(["curl", f"http://{lab.hosts[0].address}:8000/"], check=True)

Addresses come from 198.18.0.0/15 (RFC 2544, reserved for network tests). Nothing routes out of
the bridge: the root namespace does not forward, so the hosts reach only each other and the gateway.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Sequence

#: Every name this module creates starts with `nx<pid>-`, which is how a stale sweep finds the
#: owner of a leftover.
PREFIX = "nx"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")
_SUPERNET = ipaddress.ip_network("198.18.0.0/15")
_LOCK = Path("/run/nodus-netns.lock")
_IFNAMSIZ = 15
_FW_COMMENT = "nodus-netns"
_ETC = Path("/etc/netns")
"""`ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc: each host's own hosts and resolv.conf."""


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed; the message carries the command and its stderr."""


def _cmd(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _cmd(["ip", *(["-n", netns] if netns else []), *args], check)


def _tc(*args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    return _cmd(["ip", "netns", "exec", netns, "tc", *args] if netns else ["tc", *args])


@functools.cache
def available() -> str | None:
    """None when labs can be made here, else why not (a reason for `pytest.skip`). Tries once."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("link", "set", "lo", "up", netns=probe)
            _ip("link", "add", probe[:_IFNAMSIZ], "type", "bridge")
            _ip("link", "del", probe[:_IFNAMSIZ])
        finally:
            _ip("netns", "del", probe, check=False)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create network namespaces or bridges here: {e}"
    return None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialises subnet choice and the sweep across processes, so two runs never pick one subnet."""
    with open(_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    # `ip netns list` prints "NAME (id: N)" once an id is assigned.
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    return [link["ifname"] for link in json.loads(_ip("-j", "link", "show").stdout or "[]")]


def _kill_netns_procs(netns: str, grace: float = 2.0) -> None:
    """SIGTERM everything in `netns`, then SIGKILL what is still there after `grace` seconds."""
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while True:
        done = _ip("netns", "pids", netns, check=False)
        pids = [int(p) for p in done.stdout.split()] if done.returncode == 0 else []
        if not pids:
            return
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL and time.monotonic() > deadline + grace:
            return  # unkillable (D state); deleting the namespace name still works
        time.sleep(0.05)


def residue(tag: str) -> list[str]:
    """Namespaces and links whose names start with `tag` (a `Lab.tag`) that still exist."""
    return [n for n in _netns_names() + _link_names() if n.startswith(tag)]


def _firewall_rules(bridge: str) -> list[list[str]]:
    """iptables rules that let the lab's traffic through a restrictive firewall, scoped to `bridge`."""
    comment = ["-m", "comment", "--comment", f"{_FW_COMMENT} {bridge}", "-j", "ACCEPT"]
    rules = [["INPUT", "-i", bridge, *comment], ["OUTPUT", "-o", bridge, *comment]]
    # With br_netfilter loaded and this sysctl on, traffic between two ports of the bridge passes
    # through iptables' FORWARD chain, where a default-DROP policy (Docker sets one) would eat it.
    nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if nf.exists() and nf.read_text().strip() == "1":
        rules.append(["FORWARD", "-i", bridge, "-o", bridge, *comment])
    return rules


def _sweep_firewall(dead: Callable[[str], bool]) -> list[str]:
    if not shutil.which("iptables"):
        return []
    removed = []
    for line in _cmd(["iptables", "-w", "-S"], check=False).stdout.splitlines():
        rule = shlex.split(line)
        if rule[:1] != ["-A"] or "--comment" not in rule:
            continue
        words = rule[rule.index("--comment") + 1].split()
        if len(words) == 2 and words[0] == _FW_COMMENT and dead(words[1]):
            if _cmd(["iptables", "-w", "-D", *rule[1:]], check=False).returncode == 0:
                removed.append(line)
    return removed


def sweep_stale() -> list[str]:
    """Remove leftovers of earlier runs whose owning process is gone; returns what was removed."""
    with _locked():
        return _sweep_stale_locked()


def _sweep_stale_locked() -> list[str]:
    def dead(name: str) -> bool:
        m = _OWNED.match(name)
        return bool(m) and not _alive(int(m.group(1)))

    removed = []
    for ns in filter(dead, _netns_names()):
        _kill_netns_procs(ns, grace=0.5)
        _ip("netns", "del", ns, check=False)
        removed.append(ns)
    if _ETC.is_dir():
        for leftover in filter(dead, os.listdir(_ETC)):
            shutil.rmtree(_ETC / leftover, ignore_errors=True)
    links = set(filter(dead, _link_names()))
    # Veths first: deleting one end also removes its peer, and a bridge goes last.
    for link in sorted(links, key=lambda n: n.endswith("b")):
        if _ip("link", "del", link, check=False).returncode == 0:
            removed.append(link)
    return removed + _sweep_firewall(dead)


@dataclass(eq=False, slots=True)
class Host:
    """One simulated machine: a network namespace with `eth0` on the lab's bridge."""

    name: str
    """`host0`, `host1`, ... as tests speak of it."""
    address: str
    """Its IPv4 address on `eth0`, e.g. `198.18.7.10`."""
    netns: str
    """The real (globally unique) namespace name, for `ip netns exec`."""
    host_veth: str
    """The root-namespace end of its veth pair, enslaved to the bridge."""
    ifname: str = "eth0"
    procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)
    """Processes started through `popen`, reaped when the lab closes."""

    def argv(self, cmd: Sequence[str | os.PathLike[str]]) -> list[str]:
        """`cmd` prefixed so that it runs inside this host's namespace."""
        if isinstance(cmd, (str, bytes)):
            raise TypeError("pass the command as a list of arguments, not a string")
        return ["ip", "netns", "exec", self.netns, *map(os.fspath, cmd)]

    def popen(self, cmd: Sequence[str | os.PathLike[str]], **kw: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen` inside the host; env and cwd are passed through as given."""
        proc = subprocess.Popen(self.argv(cmd), **kw)
        self.procs.append(proc)
        return proc

    def run(self, cmd: Sequence[str | os.PathLike[str]], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` inside the host; env and cwd are passed through as given."""
        return subprocess.run(self.argv(cmd), **kw)


_live: set[Lab] = set()
_live_lock = threading.Lock()
_serial = iter(range(1 << 30))


def _to36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


class Lab:
    """A bridge plus `n` namespaces; use as a context manager (see the module docstring)."""

    def __init__(self, n: int = 2) -> None:
        if not 1 <= n <= 240:
            raise ValueError("a lab has 1 to 240 hosts")
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}-{_to36(next(_serial))}"
        """Prefix of every name this lab creates; unique among live labs on the machine."""
        self.bridge = f"{self.tag}b"
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        """The bridge's address: where hosts reach services in the root namespace."""
        self.hosts: list[Host] = []
        self._fw: list[list[str]] = []
        if len(f"{self.tag}h{n - 1}") > _IFNAMSIZ:
            raise ValueError(f"interface names for {self.tag} would exceed {_IFNAMSIZ} characters")

    def __enter__(self) -> Lab:
        reason = available()
        if reason:
            raise NetnsError(reason)
        with _live_lock:
            _live.add(self)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        errors = self.close()
        if errors and exc is None:
            raise NetnsError("lab cleanup failed: " + "; ".join(errors))

    def _start(self) -> None:
        with _locked():
            _sweep_stale_locked()
            self.subnet = self._free_subnet()
            hosts = list(self.subnet.hosts())
            self.gateway = str(hosts[0])
            _ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
            # Claimed under the lock: the next run sees this route and picks another subnet.
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            host = Host(name=f"host{i}", address=str(hosts[9 + i]), netns=f"{self.tag}-host{i}",
                        host_veth=f"{self.tag}h{i}")
            self.hosts.append(host)
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.host_veth, "type", "veth", "peer", "name", host.ifname,
                "netns", host.netns)
            _ip("link", "set", host.host_veth, "master", self.bridge, "up")
            _ip("link", "set", "lo", "up", netns=host.netns)
            self.restore(i)
        self._write_names()
        self._open_firewall()

    def _write_names(self) -> None:
        """Every host's /etc/hosts names the lab's hosts, and its resolv.conf points at nothing, so any
        other lookup fails at once. Without it every reverse lookup (gloo and TCPStore do them) waits
        for the root namespace's resolver, which no namespace can reach, and stalls for seconds."""
        names = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for h in self.hosts:
            d = _ETC / h.netns
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text(names)
            (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _free_subnet(self) -> ipaddress.IPv4Network:
        taken = []
        for entry in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
            for a in entry.get("addr_info", []):
                taken.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
        for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(route.get("dst", ""), strict=False))
        candidates = list(_SUPERNET.subnets(new_prefix=24))
        start = os.getpid() % len(candidates)
        for k in range(len(candidates)):
            net = candidates[(start + k) % len(candidates)]
            if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
                return net
        raise NetnsError(f"no free /24 left in {_SUPERNET}")

    def _open_firewall(self) -> None:
        if not shutil.which("iptables"):
            return
        for rule in _firewall_rules(self.bridge):
            if _cmd(["iptables", "-w", "-I", *rule], check=False).returncode == 0:
                self._fw.append(rule)

    def limit(self, i: int, mbit: float) -> None:
        """Rate-limit host i's link to `mbit` Mbit/s in both directions (tbf on each veth end)."""
        host = self.hosts[i]
        rate = mbit * 1e6 / 8
        # 10 ms of traffic, and at least one 64 KiB GSO super-packet: a smaller bucket makes tbf
        # split segments and stalls TCP well below the rate.
        burst = max(int(rate / 100), 65536)
        spec = ["root", "tbf", "rate", f"{int(mbit * 1000)}kbit", "burst", str(burst), "latency", "25ms"]
        _tc("qdisc", "replace", "dev", host.host_veth, *spec)
        _tc("qdisc", "replace", "dev", host.ifname, *spec, netns=host.netns)

    def link_bytes(self, i: int) -> int:
        """Bytes host i's link has carried both ways (its host-side veth's counters, root namespace)."""
        stats = Path("/sys/class/net") / self.hosts[i].host_veth / "statistics"
        return int((stats / "tx_bytes").read_text()) + int((stats / "rx_bytes").read_text())

    def unlimit(self, i: int) -> None:
        """Remove `limit`'s shaping from host i's link (a no-op when there is none)."""
        host = self.hosts[i]
        for argv in (["tc", "qdisc", "del", "dev", host.host_veth, "root"],
                     ["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", host.ifname, "root"]):
            _cmd(argv, check=False)

    def cut(self, i: int) -> None:
        """Partition host i: both ends of its link go down (its default route goes with them)."""
        host = self.hosts[i]
        _ip("link", "set", host.host_veth, "down")
        _ip("link", "set", host.ifname, "down", netns=host.netns)

    def restore(self, i: int) -> None:
        """Undo `cut`: links up, address and default route back. Idempotent."""
        host = self.hosts[i]
        _ip("link", "set", host.host_veth, "up")
        _ip("addr", "replace", f"{host.address}/24", "dev", host.ifname, netns=host.netns)
        _ip("link", "set", host.ifname, "up", netns=host.netns)
        _ip("route", "replace", "default", "via", self.gateway, "dev", host.ifname, netns=host.netns)

    def close(self) -> list[str]:
        """Kill what runs in the hosts, delete namespaces, veths, bridge and firewall rules.

        Best effort: every step is tried; returns the failures. Safe to call twice.
        """
        errors: list[str] = []
        for host in self.hosts:
            _kill_netns_procs(host.netns)
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for host in self.hosts:
            done = _ip("netns", "del", host.netns, check=False)
            if done.returncode != 0 and host.netns in _netns_names():
                errors.append(f"netns {host.netns}: {done.stderr.strip()}")
        for name in [h.host_veth for h in self.hosts] + [self.bridge]:
            done = _ip("link", "del", name, check=False)
            # A veth may vanish on its own meanwhile: the kernel tears down a deleted namespace's
            # devices, and with them their peers, asynchronously.
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                errors.append(f"link {name}: {done.stderr.strip()}")
        for rule in self._fw:
            _cmd(["iptables", "-w", "-D", *rule], check=False)
        self._fw.clear()
        for host in self.hosts:
            shutil.rmtree(_ETC / host.netns, ignore_errors=True)
        with contextlib.suppress(OSError):
            _ETC.rmdir()  # only when no other lab (or anyone else) keeps a namespace's files there
        with _live_lock:
            _live.discard(self)
        return errors


@atexit.register
def _close_live_labs() -> None:
    # For runs that end without unwinding (KeyboardInterrupt in a fixture, sys.exit in a thread).
    with _live_lock:
        labs = list(_live)
    for lab in labs:
        lab.close()
