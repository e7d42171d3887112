"""Issue 11's egress end to end: Jobs with `network.egress` run through a real coordinator and a real
`nodus-agent --runtime oci` against lab servers in other network namespaces (tests/netns.py): Deny cannot
reach a server, Open reaches it, AllowList reaches only the listed name (the agent resolves it, here through
the node's /etc/hosts, and the pod asks its DNS gate), and the Attempt's status counts what was refused.

The agent gets its own link range, a veth prefix the lab's sweep owns (netns.PREFIX and this pid) and the
lab's bridge as its uplink, so it turns on forwarding there only.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import netns
from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, attempts_of, create, joined, settled
from netns import Lab
from nodus.v1 import node_pb2, node_pb2_grpc
from registry import Registry, build_busybox_layout, push
from test_oci_e2e import clean_pods, traversable_dir

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
PORT = 8000
HOSTS = Path("/etc/hosts")
LISTED = f"allowed-{uuid.uuid4().hex[:8]}.egress.test"
"""The one name the AllowList Jobs may reach (host0), by `allow` or through the operator's preset `lab`."""

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry", "nft"))
                       or not os.path.exists(BUSYBOX) or os.geteuid() != 0 or netns.available() is not None,
                       reason="needs runc, skopeo, umoci, docker-registry, nft, busybox-static, root and netns"),
]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """Two servers on a bridge: host0 serves "zero", host1 serves "one"."""
    with Lab(2) as lab:
        for i, host in enumerate(lab.hosts):
            www = Path(tempfile.mkdtemp(prefix="nodus-egress-e2e-www-"))
            www.chmod(0o755)
            (www / "index.html").write_text(["zero\n", "one\n"][i])
            host.popen([BUSYBOX, "httpd", "-f", "-p", f"{host.address}:{PORT}", "-h", str(www)])
        for host in lab.hosts:
            for _ in range(100):
                if subprocess.run([BUSYBOX, "wget", "-q", "-O", "-", f"http://{host.address}:{PORT}/"],
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.05)
        yield lab


@contextlib.contextmanager
def hosts_entry(name: str, address: str) -> Iterator[None]:
    """`name` resolves to `address` on the node (its /etc/hosts) while the block runs; only our line is removed."""
    line = f"{address} {name}\n"
    with HOSTS.open("a") as f:
        f.write(line)
    try:
        yield
    finally:
        kept = [entry for entry in HOSTS.read_text().splitlines(keepends=True) if entry != line]
        HOSTS.write_text("".join(kept))


def free_range() -> str:
    """A /24 for the agent's pod links that no interface of the node uses (tests run beside each other)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for third in range(pid_slot := os.getpid() % 200, pid_slot + 200):
        net = ipaddress.ip_network(f"10.214.{third % 256}.0/24")
        if not any(ipaddress.ip_address(a) in net for a in re.findall(r"inet (\S+)/", used)):
            return str(net)
    raise AssertionError("no free 10.214.X.0/24 for the pod links")


@pytest.fixture(scope="module")
def busybox(oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    push(build_busybox_layout(tmp_path_factory.mktemp("images") / "busybox"), oci_registry, "egress/busybox", "v1")
    return f"{oci_registry.host}/egress/busybox:v1"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("egress-e2e") / "data").start(
            extra_args=("--insecure-registry", oci_registry.host)) as coordinator:
        yield coordinator


@pytest.fixture
def agent(c: Coordinator, oci_registry: Registry, lab: Lab) -> Iterator[AgentProcess]:
    top = traversable_dir("nodus-egress-e2e-")
    prefix = f"{netns.PREFIX}{os.getpid()}-e"  # the lab's sweep removes a crashed run's links by this prefix
    # Each test's agent is a fresh host under the one node name: re-admitted first, as an operator does (ADR 0039).
    c.run("nodus", "node", "readmit", "egress-n0", check=False)
    try:
        started = AgentProcess(top / "agent", c.grpc, c.join_token, node="egress-n0", env=dict(AGENT_ENV),
                               extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci",
                                           "--insecure-registry", oci_registry.host, "--egress-range", free_range(),
                                           "--egress-interface-prefix", prefix, "--egress-uplink", lab.bridge,
                                           "--egress-presets", json.dumps({"lab": [LISTED]}))).start()
        nat = f"nodus_{prefix.replace('-', '_')}"

        def nat_left() -> bool:
            return nat in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout

        with joined([started], c):
            yield started
            # A Job is Succeeded once its main container exits; its supervisor then closes the pod (link,
            # NAT table). Reaping the agent kills supervisors, so wait for them to finish first.
            wait_for(lambda: not nat_left() and not netns.residue(prefix), 30,
                     what="the pods' supervisors to remove their links and NAT tables")
        assert not netns.residue(prefix), "a pod link was left"
        assert not nat_left(), "a pod's NAT table was left"
    finally:
        clean_pods(top / "agent")
        with open("/proc/self/mountinfo") as f:
            mounted = any(str(top) in line for line in f)
        if not mounted:
            shutil.rmtree(top, ignore_errors=True)


def fetch(target: str) -> str:
    # No -T: busybox 1.35's wget crashes with it; a refused connect fails at once anyway.
    return f"wget -q -O - http://{target}:{PORT}/"


def egress_job(c: Coordinator, name: str, image: str, script: str, egress: dict[str, object]) -> dict[str, object]:
    create(c, name, backoffLimit=0, image=image, command=["sh", "-c", script], network={"egress": egress})
    return settled(c, name, 180)


def logs(c: Coordinator, name: str) -> str:
    return c.run("nodus", "logs", name).stdout


def test_deny_cannot_reach_the_server_and_open_reaches_it(c: Coordinator, agent: AgentProcess, busybox: str,
                                                          lab: Lab) -> None:
    server = lab.hosts[0].address
    script = f'{fetch(server)} || {{ echo "cannot reach {server}"; exit 3; }}'
    st = egress_job(c, "egress-deny", busybox, script, {"policy": "Deny"})
    assert st["phase"] == "Failed", st
    [attempt] = attempts_of(c, "egress-deny")
    assert attempt["status"]["exitCode"] == 3, attempt["status"]
    assert f"cannot reach {server}" in logs(c, "egress-deny")

    create(c, "egress-open", backoffLimit=0, image=busybox, command=["sh", "-c", f"{script} && sleep 3"],
           network={"egress": {"policy": "Open"}})
    # the pod's link is the agent's configured one (its prefix), and the agent fixture sees it removed after
    wait_for(lambda: netns.residue(f"{netns.PREFIX}{os.getpid()}-e"), 120, what="the Open pod's link on the node")
    st = settled(c, "egress-open", 180)
    assert st["phase"] == "Succeeded", st
    assert "zero" in logs(c, "egress-open")


@pytest.mark.parametrize("egress", [{"policy": "AllowList", "allow": [LISTED]},
                                    {"policy": "AllowList", "presets": ["lab"]}], ids=["allow", "operator-preset"])
def test_allow_list_reaches_only_the_listed_name_and_counts_the_rest(c: Coordinator, agent: AgentProcess,
                                                                      busybox: str, lab: Lab,
                                                                      egress: dict[str, object]) -> None:
    name, job = LISTED, f"egress-allow-{'preset' if 'presets' in egress else 'name'}"
    other = lab.hosts[1].address
    # the listed name answers; the unlisted server is refused (and counted); sleep so the count is seen running
    script = (f'{fetch(name)} || exit 4; if {fetch(other)}; then echo "reached {other}"; exit 5; fi; '
              f'echo "refused {other}"; sleep 2')
    with hosts_entry(name, lab.hosts[0].address):
        st = egress_job(c, job, busybox, script, egress)
    out = logs(c, job)
    assert st["phase"] == "Succeeded", (st, out)
    assert "zero" in out and f"refused {other}" in out, out
    [attempt] = attempts_of(c, job)
    assert attempt["status"]["network"]["deniedConnections"] >= 1, attempt["status"]
    shown = c.run("kubectl", "get", "attempts", attempt["metadata"]["name"], "-o",
                  "jsonpath={.status.network.deniedConnections}").stdout
    assert int(shown) == attempt["status"]["network"]["deniedConnections"]


def test_the_operators_presets_come_from_the_config_file_and_a_bad_one_names_the_key(tmp_path: Path) -> None:
    from nodus import config as daemon_config
    from nodus.agent.main import build_config, parser
    from nodus.agent.settings import AgentConfig

    def config(text: str) -> AgentConfig:
        (tmp_path / "agent.yaml").write_text(text)
        args = daemon_config.resolve(parser(), ["--config", str(tmp_path / "agent.yaml"), "--node", "n",
                                                "--work-dir", str(tmp_path / "w"), "--runtime", "process"])
        (tmp_path / "token").write_text("t")
        args.join_token_file = str(tmp_path / "token")
        return build_config(args)

    cfg = config("egress-presets:\n  pypi-mirror: [PyPI.internal, '*.pypi.internal']\n")
    assert cfg.egress_presets == {"pypi-mirror": ("pypi.internal", "*.pypi.internal")}
    with pytest.raises(SystemExit, match="egress-presets.pypi-mirror: must be a list"):
        config("egress-presets:\n  pypi-mirror: pypi.internal\n")
    with pytest.raises(SystemExit, match="--egress-range: 10.0.0.0/31 must be an IPv4 network of /30 or wider"):
        config("egress-range: 10.0.0.0/31\n")



def test_a_killed_supervisor_leaves_no_link_or_nat_table_and_the_job_is_replaced(
        c: Coordinator, agent: AgentProcess, busybox: str, lab: Lab) -> None:
    prefix = f"{netns.PREFIX}{os.getpid()}-e"
    nat = f"nodus_{prefix.replace('-', '_')}"

    def tables() -> str:
        return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout

    script = f'if [ "$NODUS_ATTEMPT_NUMBER" = 1 ]; then sleep 600; fi; {fetch(lab.hosts[0].address)}'
    create(c, "egress-killed", backoffLimit=0, image=busybox, command=["sh", "-c", script],
           network={"egress": {"policy": "Open"}})
    wait_for(lambda: netns.residue(prefix) and nat in tables(), 120, what="the Open pod's link and NAT table")
    # No replacement may take the slot (and remake its table) before the test has looked: the node is cordoned.
    with c.channel() as channel:
        nodes = node_pb2_grpc.NodeServiceStub(channel)
        auth = (("authorization", f"Bearer {c.token}"),)
        nodes.Cordon(node_pb2.CordonRequest(name="egress-n0", message="hold the replacement"), metadata=auth, timeout=10)
        [status] = [json.loads(p.read_text()) for p in agent.work_dir.glob("attempts/*/run/status.json")]
        os.kill(int(status["supervisor_pid"]), signal.SIGKILL)
        wait_for(lambda: [a["status"].get("phase") for a in attempts_of(c, "egress-killed")][:1] == ["Lost"], 60,
                 what="the attempt of the killed supervisor to be lost")
        wait_for(lambda: nat not in tables() and not netns.residue(prefix), 30,
                 what="the agent to remove the dead pod's NAT table and link")
        nodes.Uncordon(node_pb2.UncordonRequest(name="egress-n0"), metadata=auth, timeout=10)
    st = settled(c, "egress-killed", 180)
    assert st["phase"] == "Succeeded", st
    first, second = attempts_of(c, "egress-killed")
    assert first["status"]["reason"] == "AgentFault", first["status"]
    assert second["status"]["phase"] == "Succeeded"
    assert "zero" in logs(c, "egress-killed")
