"""Pod egress on real runc pods: Deny, Open and AllowList against servers the test runs in other network
namespaces (tests/netns.py), the denied count, the refresh of pinned answers, and a pod that cannot
flush its own rules. Names resolve through an in-test table handed to the agent as its resolver
(NodeNetwork.resolve), not through DNS. Every namespace, veth, mount and nftables table is removed even
when a test fails (the fixtures check)."""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

import netns
from netns import Lab
from nodus.agent.cgroups import DEFAULT_FS
from nodus.agent.oci.bundle import ContainerRequest, ImageConfig, Mount
from nodus.agent.oci.dns_gate import DnsGate
from nodus.agent.oci.egress import (PRESETS, Egress, EgressError, NodeNetwork, Policy, PodLink, matches,
                                    preset_table)
from nodus.agent.oci.pod import Pod, remove_cgroup_dirs
from nodus.agent.oci.slots import IdSlots
from nodus.agent.oci.runc import Runc, become_subreaper

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
NFT = shutil.which("nft") or "/usr/sbin/nft"
APPLETS = ("sh", "echo", "cat", "wget", "ls", "ip", "true", "nslookup")
IMAGE = ImageConfig(cmd=("sh",), env=("PATH=/bin:/usr/sbin",))
PORT = 8000

needs_root = pytest.mark.skipif(
    shutil.which("runc") is None or not os.path.exists(BUSYBOX) or not os.path.exists(NFT) or os.geteuid() != 0
    or netns.available() is not None, reason="needs runc, busybox-static, nft, root and network namespaces")


# --- the spec and the tables (pure) ---

def test_egress_from_the_job_spec_names_the_field_and_the_fix() -> None:
    assert Egress.from_spec(None).policy == Policy.DENY
    ok = Egress.from_spec({"policy": "AllowList", "allow": ["PyPI.org", "*.example.com"], "presets": ["huggingface"]})
    assert ok.allow == ("pypi.org", "*.example.com") and ok.presets == ("huggingface",)
    cases = [({"policy": "Closed"}, "spec.network.egress.policy"),
             ({"policy": "Open", "allow": ["a.com"]}, "spec.network.egress.allow"),
             ({"policy": "AllowList", "allow": ["bad name"]}, "spec.network.egress.allow[0]"),
             ({"policy": "AllowList", "allow": ["*.*.com"]}, "spec.network.egress.allow[0]"),
             ({"policy": "AllowList", "allow": [f"h{i}.com" for i in range(129)]}, "spec.network.egress.allow"),
             ({"policy": "AllowList", "presets": ["conda"]}, "spec.network.egress.presets[0]")]
    for spec, where in cases:
        with pytest.raises(EgressError) as e:
            Egress.from_spec(spec)
        assert e.value.field_path == where, spec


def test_presets_expand_from_the_operators_table_over_the_built_in_one() -> None:
    table = preset_table({"huggingface": ["mirror.internal"], "conda": ["conda.anaconda.org"]})
    assert table["python-packages"] == PRESETS["python-packages"]
    egress = Egress.from_spec({"policy": "AllowList", "allow": ["a.com"], "presets": ["huggingface", "conda"]}, table)
    assert egress.entries(table) == ("a.com", "mirror.internal", "conda.anaconda.org")
    with pytest.raises(EgressError, match="egress-presets.x"):
        preset_table({"x": "one.string"})
    assert "*.pythonhosted.org" not in Egress(Policy.ALLOW_LIST, (), ("python-packages",)).names()


def test_a_suffix_pattern_matches_names_below_it_only() -> None:
    entries = ("pypi.org", "*.hf.co")
    assert matches("cdn.hf.co", entries) and matches("PyPI.org.", entries)
    assert not matches("hf.co", entries) and not matches("evilhf.co", entries) and not matches("x.pypi.org", entries)


def test_each_slot_gets_its_own_link_from_the_agents_range() -> None:
    a, b = PodLink.for_slot(0, "198.19.4.0/24", "nodus"), PodLink.for_slot(1, "198.19.4.0/24", "nodus")
    assert (a.host_if, a.host_address, a.pod_address) == ("nodus0", "198.19.4.1", "198.19.4.2")
    assert (b.host_address, b.pod_address) == ("198.19.4.5", "198.19.4.6")
    with pytest.raises(EgressError, match="egress-range"):
        PodLink.for_slot(64, "198.19.4.0/24")


# --- real pods ---

@dataclass
class Node:
    root: Path
    runc: Runc
    slots: IdSlots
    rootfs: Path
    cgroup_parent: str
    network: NodeNetwork
    names: dict[str, list[str]]
    """The agent's resolver's answers, which a test may change."""
    clock: list[float] = field(default_factory=lambda: [0.0])
    pods: list[Pod] = field(default_factory=list)

    def pod(self, name: str, egress: Egress, network: NodeNetwork | None = None) -> Pod:
        pod = Pod(f"{name}-{uuid.uuid4().hex[:6]}", self.root / "pods" / name, self.runc, self.slots,
                  f"{self.cgroup_parent}/{name}", egress, network or self.network)
        self.pods.append(pod)
        return pod

    def sh(self, pod: Pod, name: str, script: str, mounts: tuple[Mount, ...] = ()) -> tuple[int | None, str]:
        """Runs `script` in a new container of the pod; its exit code and output."""
        log_path = self.root / f"{pod.pod_id}-{name}.log"
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            proc = pod.start(name, ContainerRequest(name, command=("sh", "-c", script)), IMAGE, self.rootfs, log,
                             mounts)
        finally:
            os.close(log)
        code = proc.wait(60)
        return code, log_path.read_text()


def _free_range() -> str:
    """A /24 of 198.18.0.0/15 that no address or route on the machine overlaps (labs take theirs likewise)."""
    taken = []
    for cmd in (["ip", "-j", "-4", "addr", "show"], ["ip", "-j", "-4", "route", "show", "table", "all"]):
        for entry in json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout or "[]"):
            nets = [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])] + [entry.get("dst", "")]
            for n in nets:
                try:
                    taken.append(ipaddress.ip_network(n, strict=False))
                except ValueError:
                    continue
    for net in ipaddress.ip_network("198.19.0.0/16").subnets(new_prefix=24):
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return str(net)
    raise RuntimeError("no free /24 in 198.19.0.0/16")


@pytest.fixture(scope="module")
def rootfs() -> Iterator[Path]:
    """busybox and its applets, and nft with the libraries it loads (for the pod's attempt to flush its rules)."""
    top = Path(tempfile.mkdtemp(prefix="nodus-egress-image-"))
    top.chmod(0o711)
    root = top / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    # nft and its libraries (the loader too) live apart in /nft: a libc in /lib would be loaded by static
    # busybox's NSS lookups, which then crash.
    (root / "nft").mkdir()
    shutil.copy(NFT, root / "nft/nft")
    ldd = subprocess.run(["ldd", NFT], capture_output=True, text=True, check=True).stdout
    for lib in (w for line in ldd.splitlines() for w in line.split() if w.startswith("/")):
        shutil.copy(lib, root / "nft" / os.path.basename(lib))
    loader = next(p.name for p in (root / "nft").iterdir() if p.name.startswith("ld-linux"))
    (root / "bin/nft").write_text(f'#!/bin/sh\nexec /nft/{loader} --library-path /nft /nft/nft "$@"\n')
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755)
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """Two servers on a bridge: host0 serves "zero", host1 serves "one"."""
    with Lab(2) as lab:
        for i, host in enumerate(lab.hosts):
            www = Path(tempfile.mkdtemp(prefix="nodus-egress-www-"))
            www.chmod(0o755)
            (www / "index.html").write_text(["zero\n", "one\n"][i])
            host.popen([BUSYBOX, "httpd", "-f", "-p", f"{host.address}:{PORT}", "-h", str(www)])
        for host in lab.hosts:  # up once the root namespace reaches it
            for _ in range(100):
                if subprocess.run([BUSYBOX, "wget", "-q", "-O", "-", f"http://{host.address}:{PORT}/"],
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.05)
        yield lab


def _nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def _sweep_stale_nat_tables() -> None:
    """NAT tables a killed run of this module left (named after its links, which carry its pid)."""
    for family, name, pid in re.findall(r"^table (\w+) (nodus_nx(\d+)_p\d+)$", _nft_tables(), re.M):
        if not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["nft", "delete", "table", family, name], capture_output=True)


@pytest.fixture
def node(rootfs: Path, lab: Lab) -> Iterator[Node]:
    _sweep_stale_nat_tables()  # the lab sweeps stale links and namespaces; these are ours to sweep
    become_subreaper()
    top = Path(tempfile.mkdtemp(prefix="nodus-egress-node-"))
    top.chmod(0o711)
    prefix = f"{netns.PREFIX}{os.getpid()}-p"  # the lab's sweep removes a crashed run's links by this prefix
    names = {"allowed.test": [lab.hosts[0].address], "other.test": [lab.hosts[1].address]}
    clock = [0.0]
    network = NodeNetwork(pod_range=_free_range(), if_prefix=prefix, uplinks=(lab.bridge,),
                          resolve=lambda name: names.get(name, []), clock=lambda: clock[0], refresh_period=30.0)
    n = Node(top, Runc(top / "runc"), IdSlots(top / "ids"), rootfs, f"nodus-test/{uuid.uuid4().hex[:8]}", network,
             names, clock)
    try:
        yield n
    finally:
        try:
            for state in n.runc.list():
                n.runc.delete(state.id, force=True)
            for pod in n.pods:
                pod.close()
            remove_cgroup_dirs(n.cgroup_parent)
            assert not [c for c in DEFAULT_FS.iterdir() if (c / n.cgroup_parent).exists()], "a test cgroup was left"
            assert not [name for name in netns.residue(prefix)], "a pod link was left"
            assert f"nodus_{prefix.replace('-', '_')}" not in _nft_tables(), "a pod's NAT table was left"
            with open("/proc/self/mountinfo") as f:
                assert not [line for line in f if str(top) in line], "a mount of the test was left behind"
        finally:
            with open("/proc/self/mountinfo") as f:
                mounted = any(str(top) in line for line in f)
            if not mounted:
                shutil.rmtree(top, ignore_errors=True)


def fetch(host: netns.Host) -> str:
    # No -T: busybox 1.35's wget crashes with it; a refused connect fails at once anyway.
    return f"wget -q -O - http://{host.address}:{PORT}/; echo rc=$?"


@needs_root
def test_deny_leaves_only_loopback_and_blocks_the_server(node: Node, lab: Lab) -> None:
    pod = node.pod("deny", Egress())
    code, out = node.sh(pod, "main", f"ls /sys/class/net; {fetch(lab.hosts[0])}")
    assert code == 0, out
    assert out.split()[0] == "lo" and "eth0" not in out
    assert "Network is unreachable" in out and "rc=0" not in out, out
    assert pod.egress.denied() == 0  # nothing leaves to be counted: the kernel has no route


@needs_root
def test_open_reaches_the_server_and_close_removes_the_link(node: Node, lab: Lab) -> None:
    pod = node.pod("open", Egress(Policy.OPEN))
    code, out = node.sh(pod, "main", f"{fetch(lab.hosts[0])}; {fetch(lab.hosts[1])}")
    assert code == 0 and out.split() == ["zero", "rc=0", "one", "rc=0"], out
    assert pod.egress.link is not None
    host_if, nat = pod.egress.link.host_if, pod.egress.link.nat_table
    assert host_if in netns.residue(host_if) and nat in _nft_tables()
    pod.close()
    assert host_if not in netns.residue(host_if) and nat not in _nft_tables()


@needs_root
def test_open_still_refuses_and_counts_the_nodes_blocked_networks(node: Node, lab: Lab) -> None:
    assert "169.254.0.0/16" in node.network.blocked  # cloud metadata, by default
    network = dataclasses.replace(node.network, blocked=(*node.network.blocked, f"{lab.hosts[1].address}/32"))
    pod = node.pod("blocked", Egress(Policy.OPEN), network)
    code, out = node.sh(pod, "main", f"{fetch(lab.hosts[0])}; {fetch(lab.hosts[1])}")
    assert out.split()[:2] == ["zero", "rc=0"] and "Connection refused" in out, out
    assert pod.egress.denied() == 1


@needs_root
def test_allow_list_reaches_only_the_listed_name_and_counts_the_rest(node: Node, lab: Lab) -> None:
    pod = node.pod("allow", Egress(Policy.ALLOW_LIST, ("allowed.test",)))
    assert pod.egress.pinned == {lab.hosts[0].address}
    code, out = node.sh(pod, "first", fetch(lab.hosts[0]))
    assert code == 0 and out.split() == ["zero", "rc=0"], out
    assert pod.egress.denied() == 0
    code, out = node.sh(pod, "second", fetch(lab.hosts[1]))
    assert "Connection refused" in out and "rc=0" not in out, out  # refused at once, not left to time out
    assert pod.egress.denied() == 1  # one refused connect, counted once


@needs_root
def test_pinned_answers_follow_the_resolver_after_the_period(node: Node, lab: Lab) -> None:
    pod = node.pod("refresh", Egress(Policy.ALLOW_LIST, ("allowed.test",)))
    node.names["allowed.test"] = [lab.hosts[1].address]  # the name moved to the other server
    node.clock[0] = 29.0
    assert not pod.egress.refresh() and pod.egress.pinned == {lab.hosts[0].address}
    node.clock[0] = 30.0
    assert pod.egress.refresh() and pod.egress.pinned == {lab.hosts[1].address}
    node.names["allowed.test"] = []  # the resolver fails: the last answer stands
    node.clock[0] = 60.0
    assert not pod.egress.refresh() and pod.egress.pinned == {lab.hosts[1].address}
    code, out = node.sh(pod, "main", f"{fetch(lab.hosts[1])}; {fetch(lab.hosts[0])}")
    assert out.split()[:2] == ["one", "rc=0"] and "can't connect" in out, out
    assert pod.egress.denied() >= 1


@needs_root
def test_the_pod_cannot_flush_or_change_its_rules(node: Node, lab: Lab) -> None:
    pod = node.pod("flush", Egress(Policy.ALLOW_LIST, ("allowed.test",)))
    script = ("nft flush ruleset; echo flush=$?; nft add element inet nodus allowed '{ %s }'; echo add=$?; "
              "ip route del default; echo route=$?; %s" % (lab.hosts[1].address, fetch(lab.hosts[1])))
    code, out = node.sh(pod, "main", script)
    assert "flush=1" in out and "add=1" in out and "route=2" in out, out
    assert out.count("Operation not permitted") >= 3, out  # refused for want of CAP_NET_ADMIN, not by accident
    assert "can't connect" in out and pod.egress.denied() >= 1
    assert pod.egress.pinned == {lab.hosts[0].address}


@needs_root
def test_a_restarted_supervisor_reattaches_without_resetting_the_count(node: Node, lab: Lab) -> None:
    egress = Egress(Policy.ALLOW_LIST, ("allowed.test",))
    pod = node.pod("again", egress)
    code, out = node.sh(pod, "first", fetch(lab.hosts[1]))
    assert "Connection refused" in out and pod.egress.denied() == 1, out
    again = Pod(pod.pod_id, pod.directory, node.runc, node.slots, pod.cgroup_parent, egress, node.network)
    assert again.egress.link == pod.egress.link and again.egress.pinned == {lab.hosts[0].address}
    assert again.egress.denied() == 1
    code, out = node.sh(again, "second", f"{fetch(lab.hosts[0])}; {fetch(lab.hosts[1])}")
    assert out.split()[:2] == ["zero", "rc=0"] and again.egress.denied() == 2, out


def table_upstream(names: dict[str, list[str]]) -> Callable[[dns.message.Message], dns.message.Message]:
    """The node's resolver as the gate sees it, answering from the test's table (A records, TTL 30)."""
    def ask(query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        q = query.question[0]
        name = q.name.to_text(omit_final_dot=True)
        if name not in names:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif q.rdtype == dns.rdatatype.A:
            response.answer.append(dns.rrset.from_text(q.name, 30, "IN", "A", *names[name]))
        return response
    return ask


@needs_root
def test_a_suffix_pattern_opens_what_the_pods_dns_gate_answered(node: Node, lab: Lab) -> None:
    pod = node.pod("gate", Egress(Policy.ALLOW_LIST, ("*.lab.test",)))
    assert pod.egress.link is not None and pod.egress.pinned == frozenset()  # a pattern pins nothing ahead
    names = {"zero.lab.test": [lab.hosts[0].address], "one.elsewhere.test": [lab.hosts[1].address]}
    gate = DnsGate(pod.egress, table_upstream(names))
    resolv = node.root / "resolv.conf"
    resolv.write_text(pod.egress.link.resolv_conf())
    resolv.chmod(0o644)
    stop = threading.Event()
    serving = threading.Thread(target=lambda: [gate.serve(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    serving.start()
    try:
        script = (f"wget -q -O - http://zero.lab.test:{PORT}/; echo rc=$?; "
                  "nslookup one.elsewhere.test; echo ns=$?; "
                  f"{fetch(lab.hosts[1])}")
        code, out = node.sh(pod, "main", script, (Mount("/etc/resolv.conf", str(resolv), read_only=True),))
    finally:
        stop.set()
        serving.join(5)
        gate.close()
    assert out.split()[:2] == ["zero", "rc=0"], out
    assert "ns=0" not in out and gate.refused >= 1, out  # a name outside the pattern is refused, not resolved
    assert "Connection refused" in out and pod.egress.denied() == 1, out


def test_the_gate_refuses_names_outside_the_list_and_fails_closed_without_the_nodes_resolver() -> None:
    link = PodLink("unused", "127.0.0.1", "127.0.0.2")  # answer() alone: nothing is pinned on these paths
    egress = NodeNetwork(resolve=lambda name: []).for_pod(Egress(Policy.ALLOW_LIST, ("*.lab.test",)), "/none", 0)
    egress.link = link

    def down(query: dns.message.Message) -> dns.message.Message:
        raise OSError("no route to the node's nameserver")

    gate = DnsGate(egress, down, port=0)
    try:
        outside = dns.message.from_wire(gate.answer(dns.message.make_query("one.elsewhere.test", "A").to_wire()) or b"")
        assert outside.rcode() == dns.rcode.REFUSED and not outside.answer and gate.refused == 1
        inside = dns.message.from_wire(gate.answer(dns.message.make_query("zero.lab.test", "A").to_wire()) or b"")
        assert inside.rcode() == dns.rcode.SERVFAIL and not inside.answer
        assert gate.answer(b"not dns") is None
    finally:
        gate.close()
