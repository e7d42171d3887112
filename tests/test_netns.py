"""The multi-host harness in tests/netns.py: reachability, rate limits, partitions, cleanup."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

import netns
from netns import Host, Lab

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))

PY = sys.executable
PORT = 7000  # each namespace is fresh, so a fixed port cannot clash

ECHO_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    with c:
        c.sendall(c.recv(64))
"""

# Exit 0 when an echo round trip to argv[1]:argv[2] works within argv[3] seconds, else 1.
ECHO_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        c.sendall(b"ping")
        assert c.recv(64) == b"ping"
except OSError as e:
    print(type(e).__name__, e)
    sys.exit(1)
"""

SINK = """
import json, socket, sys, time
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
c, _ = s.accept()
buf = bytearray(1 << 20)
n = c.recv_into(buf)
total, first = n, time.monotonic()
while n:
    n = c.recv_into(buf)
    total += n
print(json.dumps({"bytes": total, "seconds": time.monotonic() - first}), flush=True)
"""

SOURCE = """
import socket, sys, time
chunk = memoryview(bytes(1 << 18))
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as c:
    end = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < end:
        c.sendall(chunk)
"""


@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab(2) as lab:
        yield lab


def serve(host: Host, script: str, *args: str) -> subprocess.Popen[str]:
    proc = host.popen([PY, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def echo(host: Host, addr: str, port: int, timeout: float = 2.0) -> bool:
    return host.run([PY, "-c", ECHO_CLIENT, addr, str(port), str(timeout)], timeout=30).returncode == 0


def test_lab_layout(lab: Lab) -> None:
    assert lab.gateway.startswith("198.1") and lab.gateway.endswith(".1")
    assert [h.name for h in lab.hosts] == ["host0", "host1"]
    assert lab.hosts[1].address.rsplit(".", 1)[1] == "11"
    assert all(len(n) <= 15 for n in [lab.bridge] + [h.host_veth for h in lab.hosts])
    out = lab.hosts[0].run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True, text=True)
    assert f"{lab.hosts[0].address}/24" in out.stdout


def test_hosts_resolve_each_other_by_name_and_other_lookups_fail_at_once(lab: Lab) -> None:
    script = ("import socket\n"
              "print(socket.gethostbyname('host1'))\n"
              "try:\n    socket.gethostbyname('nodus-test.invalid')\nexcept OSError:\n    print('unresolved')\n")
    done = lab.hosts[0].run([PY, "-c", script], capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout.split() == [lab.hosts[1].address, "unresolved"]
    files = [Path("/etc/netns") / h.netns for h in lab.hosts]
    assert all((d / "hosts").is_file() for d in files)
    lab.close()
    assert not any(d.exists() for d in files), "a host's /etc files go with the lab"


def test_popen_keeps_env_and_cwd(lab: Lab, tmp_path) -> None:
    done = lab.hosts[0].run([PY, "-c", "import os; print(os.getcwd(), os.environ['NX_PROBE'])"],
                            cwd=tmp_path, env={"NX_PROBE": "yes"}, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(tmp_path), "yes"]


def test_hosts_reach_each_other_and_gateway(lab: Lab) -> None:
    h0, h1 = lab.hosts
    serve(h0, ECHO_SERVER, h0.address, str(PORT))
    assert echo(h1, h0.address, PORT)

    # A server in the root namespace, on the gateway, the way a coordinator listens.
    with socket.create_server((lab.gateway, 0)) as srv:
        def answer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(conn.recv(64))
        t = threading.Thread(target=answer, daemon=True)
        t.start()
        assert echo(h1, lab.gateway, srv.getsockname()[1])
        t.join(5)


def measure(src: Host, dst: Host, seconds: float) -> float:
    """Mbit/s of one TCP bulk transfer from `src` to `dst`, as the receiver saw it."""
    sink = serve(dst, SINK, dst.address, str(PORT))
    src.run([PY, "-c", SOURCE, dst.address, str(PORT), str(seconds)], check=True, timeout=30)
    out, _ = sink.communicate(timeout=30)
    result = json.loads(out)
    return result["bytes"] * 8 / result["seconds"] / 1e6


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tc") is None, reason="`tc` is not installed")
def test_limit_caps_throughput_both_ways(lab: Lab) -> None:
    h0, h1 = lab.hosts
    free = measure(h1, h0, 1.5)
    lab.limit(0, 200)
    into = measure(h1, h0, 2.5)  # egress of the bridge-side veth
    out_of = measure(h0, h1, 2.5)  # egress of host0's eth0
    for mbit in (into, out_of):
        assert 100 <= mbit <= 220, (free, into, out_of)
        assert mbit < 0.7 * free, (free, into, out_of)
    lab.unlimit(0)
    lab.unlimit(0)  # idempotent
    assert measure(h1, h0, 1.0) > 300


def test_cut_partitions_and_restore_heals(lab: Lab) -> None:
    h0, h1 = lab.hosts
    serve(h0, ECHO_SERVER, h0.address, str(PORT))
    serve(h1, ECHO_SERVER, h1.address, str(PORT))
    assert echo(h1, h0.address, PORT)
    lab.cut(0)
    assert not echo(h1, h0.address, PORT, timeout=0.5)
    assert not echo(h0, lab.gateway, PORT, timeout=0.5)  # no route: fails at once
    lab.restore(0)
    assert echo(h1, h0.address, PORT, timeout=5)
    assert echo(h0, h1.address, PORT, timeout=5)


def test_cleanup_after_normal_exit_kills_processes() -> None:
    with Lab(2) as lab:
        tag = lab.tag
        sleeper = lab.hosts[0].popen(["sleep", "60"])
        assert netns.residue(tag)
    assert sleeper.returncode is not None
    assert netns.residue(tag) == []


def test_cleanup_after_exception() -> None:
    with pytest.raises(KeyError):
        with Lab(1) as lab:
            tag = lab.tag
            raise KeyError("boom")
    assert netns.residue(tag) == []


def test_sweep_removes_leftovers_of_dead_runs() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    tag = f"{netns.PREFIX}{gone.pid}-0"
    subprocess.run(["ip", "netns", "add", f"{tag}-host0"], check=True)
    subprocess.run(["ip", "link", "add", f"{tag}b", "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "add", f"{tag}h0", "type", "veth", "peer", "name", "eth0",
                    "netns", f"{tag}-host0"], check=True)
    try:
        assert sorted(netns.residue(tag)) == sorted([f"{tag}-host0", f"{tag}b", f"{tag}h0"])
        removed = netns.sweep_stale()
        assert f"{tag}-host0" in removed and f"{tag}b" in removed
        assert netns.residue(tag) == []
    finally:
        subprocess.run(["ip", "netns", "del", f"{tag}-host0"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{tag}b"], capture_output=True)


def test_concurrent_labs_get_distinct_subnets_and_names() -> None:
    with Lab(1) as a, Lab(1) as b:
        assert a.subnet != b.subnet and a.tag != b.tag
        assert {h.netns for h in a.hosts}.isdisjoint(h.netns for h in b.hosts)


FAKE_IPTABLES = """#!{python}
# Keeps rules in a JSON file; prints them as `iptables -S` does (comments in double quotes).
import json, os, sys
path = os.environ["FAKE_IPTABLES_STATE"]
rules = json.load(open(path)) if os.path.exists(path) else []
args = [a for a in sys.argv[1:] if a != "-w"]
if args[0] == "-S":
    for r in rules:
        print("-A " + " ".join(f'"{{a}}"' if " " in a else a for a in r))
elif args[0] == "-I":
    rules.insert(0, args[1:])
elif args[0] == "-D":
    if args[1:] not in rules:
        sys.exit(1)
    rules.remove(args[1:])
json.dump(rules, open(path, "w"))
"""


@pytest.fixture
def fake_iptables(tmp_path, monkeypatch) -> Path:
    """A stand-in `iptables` on PATH; returns the file holding its rules."""
    script = tmp_path / "bin" / "iptables"
    script.parent.mkdir()
    script.write_text(FAKE_IPTABLES.format(python=PY))
    script.chmod(0o755)
    state = tmp_path / "rules.json"
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_IPTABLES_STATE", str(state))
    return state


def test_firewall_opened_for_the_bridge_only_and_closed_after(fake_iptables: Path) -> None:
    with Lab(1) as lab:
        rules = json.loads(fake_iptables.read_text())
        assert {r[0] for r in rules} >= {"INPUT", "OUTPUT"}
        assert all(lab.bridge in r and r[-1] == "ACCEPT" for r in rules)
    assert json.loads(fake_iptables.read_text()) == []


def test_sweep_removes_firewall_rules_of_dead_runs_only(fake_iptables: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    def rule(bridge: str) -> list[str]:
        return ["INPUT", "-i", bridge, "-m", "comment", "--comment", f"nodus-netns {bridge}", "-j", "ACCEPT"]
    mine = rule(f"{netns.PREFIX}{os.getpid()}-zzb")
    fake_iptables.write_text(json.dumps([rule(f"{netns.PREFIX}{gone.pid}-0b"), mine]))
    netns.sweep_stale()
    assert json.loads(fake_iptables.read_text()) == [mine]
