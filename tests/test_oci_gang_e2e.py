"""Issue 11's gangs in containers: a distributed Job with an image runs as one runc pod per member, on two real
`nodus-agent --runtime oci` on loopback, through a real coordinator and a real registry (tests/registry.py
builds the Python image offline). The members' pods share the node's network namespace (ADR 0033), so
rank 1's container reaches rank 0's rendezvous at MASTER_ADDR:MASTER_PORT, and the mesh probe measures
the gang before its command starts. A gang with an image whose egress is not Open is refused at admission
naming spec.network.egress.policy: its pods could not enforce it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent_double import AgentProcess
from conftest import Coordinator, job
from e2e import AGENT_ENV, JOBS, attempts_of, create, ended, joined
from nodus.agent.clock import SystemClock
from nodus.agent.runtime import OciRuntime, Refused
from nodus.coordinator.api.job import spec_rules
from nodus.coordinator.api.limits import AdmissionLimits
from nodus.v1 import agent_pb2
from registry import Registry, build_python_layout, push
from test_oci_e2e import agent_hosts

NEEDS = pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry"))
                           or os.geteuid() != 0, reason="needs runc, skopeo, umoci, docker-registry and root")

MEMBER = r"""
import os, socket, sys, time
rank, world = int(os.environ["NODUS_RANK"]), int(os.environ["NODUS_WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world}: rendezvous {addr}:{port} uid {os.getuid()}", flush=True)
if world != 2 or rank not in (0, 1):
    sys.exit(4)
if rank == 0:
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(90)
    conn, _ = server.accept()
    heard = conn.recv(64).decode()
    conn.sendall(b"welcome from rank 0")
    line = f"rank 0 of 2 heard {heard!r}"
else:
    deadline = time.monotonic() + 90
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"rank 1 could not reach {addr}:{port}: {e}", flush=True)
                sys.exit(5)
            time.sleep(0.2)
    conn.sendall(b"hello from rank 1")
    line = f"rank 1 of 2 heard {conn.recv(64).decode()!r}"
print(line, flush=True)
with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "rendezvous.txt"), "w") as f:
    f.write(line + "\n")
"""


def test_a_gang_with_an_image_and_egress_other_than_open_is_refused_naming_the_policy() -> None:
    limits = AdmissionLimits()
    for egress in ({}, {"policy": "Deny"}, {"policy": "AllowList", "allow": ["pypi.org"]}):
        spec: dict[str, Any] = {"image": "registry.test/team/trainer:v1", "distributed": {"nodes": 2},
                                "network": {"egress": egress}}
        causes = [c for c in spec_rules(spec, limits) if c.field == "spec.network.egress.policy"]
        assert causes and "must be Open" in causes[0].message, (egress, causes)
    open_gang = {"image": "registry.test/team/trainer:v1", "distributed": {"nodes": 2},
                 "network": {"egress": {"policy": "Open"}}}
    assert not [c for c in spec_rules(open_gang, limits) if c.field.startswith("spec.network")]
    single = {"image": "registry.test/team/trainer:v1", "network": {"egress": {"policy": "Deny"}}}
    assert not spec_rules(single, limits)  # one pod of its own: Deny is enforced there
    processes = {"command": ["true"], "distributed": {"nodes": 2}}
    assert not spec_rules(processes, limits)  # no image: the process runtime, no pod


@NEEDS
def test_the_agent_refuses_an_image_gang_member_whose_egress_it_cannot_enforce(work: Path) -> None:
    runtime = OciRuntime(work / "agent", image_cache=work / "images", disk_budget=1 << 20, clock=SystemClock(),
                         zygote=False)
    image = "registry.test/team/trainer@sha256:" + "0" * 64
    gang = agent_pb2.GangPlan(attempt_id="g-0", epoch=1, rank=0, size=2)
    for policy in (agent_pb2.EGRESS_POLICY_DENY, agent_pb2.EGRESS_POLICY_ALLOW_LIST):
        a = agent_pb2.Assignment(attempt_id="g-0", image=image, command=["true"], gang=gang,
                                 egress=agent_pb2.Egress(policy=policy))
        with pytest.raises(Refused) as refused:
            runtime.check(a)  # an older coordinator's Assignment: never run with its egress silently unenforced
        assert refused.value.phase == "FAILED" and "spec.network.egress.policy" in str(refused.value)
    runtime.check(agent_pb2.Assignment(attempt_id="g-0", image=image, command=["true"], gang=gang,
                                       egress=agent_pb2.Egress(policy=agent_pb2.EGRESS_POLICY_OPEN)))
    runtime.check(agent_pb2.Assignment(attempt_id="s-0", image=image, command=["true"],
                                       egress=agent_pb2.Egress(policy=agent_pb2.EGRESS_POLICY_DENY)))


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("oci-gang") / "data").start(extra_args=(
            "--insecure-registry", oci_registry.host, "--lease-duration", "4s", "--heartbeat-interval", "1s",
            "--gang-probe-bytes", "1Mi", "--gang-probe-budget", "10s")) as coordinator:
        yield coordinator


@pytest.fixture
def work() -> Iterator[Path]:
    with agent_hosts("nodus-oci-gang-") as top:
        yield top


@NEEDS
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_two_member_image_gang_meets_at_its_rendezvous_inside_the_containers(
        c: Coordinator, oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    push(build_python_layout(tmp_path / "python"), oci_registry, "gang/python", "v1")
    image = f"{oci_registry.host}/gang/python:v1"
    refused = c.session().post(c.url(JOBS), params={"dryRun": "All"},
                               json=job("deny-gang", image=image, command=["python3", "-c", "pass"],
                                        distributed={"nodes": 2}))
    assert refused.status_code == 422 and "spec.network.egress.policy" in refused.text, refused.text
    agents = [AgentProcess(work / f"n{i}", c.grpc, c.join_token, node=f"oci-gang-n{i}", env=AGENT_ENV,
                           extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci",
                                       "--insecure-registry", oci_registry.host)).start() for i in range(2)]
    with joined(agents, c):
        create(c, "image-gang", image=image, command=["python3", "-c", MEMBER], distributed={"nodes": 2},
               network={"egress": {"policy": "Open"}},
               outputs=[{"name": "met", "path": "/nodus/outputs/rendezvous.txt"}])
        status = ended(c, "image-gang", 300)["status"]
        log0 = c.run("nodus", "logs", "image-gang").stdout
        log1 = c.run("nodus", "logs", "image-gang", "--rank", "1").stdout
        assert status["phase"] == "Succeeded", (status, log0, log1)
        gang = status["gang"]
        assert gang["size"] == 2 and gang["phase"] == "Done" and gang["rendezvous"].startswith("127.0.0.1:"), gang
        assert gang["probe"].get("rttMs"), gang  # the mesh probe measured the members before the command ran
        port = gang["rendezvous"].split(":")[1]
        assert f"rank 0 of 2: rendezvous 127.0.0.1:{port} uid 0" in log0, log0  # root inside the image
        assert "rank 0 of 2 heard 'hello from rank 1'" in log0, log0
        assert "rank 1 of 2 heard 'welcome from rank 0'" in log1, log1
        assert status["image"]["digest"], status
        nodes = {a["spec"]["node"] for a in attempts_of(c, "image-gang")}
        assert nodes == {"oci-gang-n0", "oci-gang-n1"}, nodes
        got = tmp_path / "met.txt"
        c.run("nodus", "outputs", "get", "image-gang", "met", "-o", str(got))
        assert got.read_text() == "rank 0 of 2 heard 'hello from rank 1'\n"  # rank 0's output, made in its container
