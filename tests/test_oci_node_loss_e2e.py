"""Issue 11: a replacement after a node loss runs the digest pinned at admission, even after the tag moved.

A real coordinator with short leases, two real `nodus-agent --runtime oci` on loopback and a real registry
(tests/registry.py builds the images offline). The Job names its image by tag; while its first attempt runs,
the tag is pushed again with a different build, and the node running the attempt dies with its work (the agent
and its containers at once). The replacement on the other node must run the first build: its log says so, and
the Job's status.image.digest is still the one the registry served at admission.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from agent_double import AgentProcess
from conftest import Coordinator
from e2e import AGENT_ENV, attempts_of, create, joined, settled, wait_status
from registry import Registry, build_busybox_layout, push
from test_oci_e2e import agent_hosts, clean_pods

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry"))
                       or os.geteuid() != 0, reason="needs runc, skopeo, umoci, docker-registry and root"),
]

# Attempt 1 runs until its node dies; any later attempt says which build it runs and ends.
SCRIPT = 'echo "attempt $NODUS_ATTEMPT_NUMBER runs build $BUILD"; [ "$NODUS_ATTEMPT_NUMBER" = 1 ] && sleep 600; true'


@pytest.fixture
def work() -> Iterator[Path]:
    with agent_hosts("nodus-oci-loss-") as top:
        yield top


def test_the_replacement_after_a_node_loss_runs_the_pinned_digest_after_the_tag_moved(
        oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    first = push(build_busybox_layout(tmp_path / "b1", {"Env": ["PATH=/bin", "BUILD=1"]}), oci_registry,
                 "loss/moving", "stable")
    with Coordinator(tmp_path / "data").start(extra_args=(
            "--insecure-registry", oci_registry.host, "--lease-duration", "3s",
            "--heartbeat-interval", "0.5s")) as c:
        agents = {f"oci-loss-n{i}": AgentProcess(
            work / f"n{i}", c.grpc, c.join_token, node=f"oci-loss-n{i}", env=AGENT_ENV,
            extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci",
                        "--insecure-registry", oci_registry.host)).start() for i in range(2)}
        with joined(list(agents.values()), c):
            create(c, "moving", backoffLimit=0, image=f"{oci_registry.host}/loss/moving:stable",
                   command=["sh", "-c", SCRIPT])
            wait_status(c, "moving", lambda s: s.get("phase") == "Running", 120, "attempt 1 to run")
            [one] = attempts_of(c, "moving")
            moved = push(build_busybox_layout(tmp_path / "b2", {"Env": ["PATH=/bin", "BUILD=2"]}), oci_registry,
                         "loss/moving", "stable")
            assert moved != first
            # The node dies with its work: the agent and its containers, at once.
            victim = agents[one["spec"]["node"]]
            assert victim.proc is not None
            victim.proc.kill()
            victim.proc.wait()
            clean_pods(victim.work_dir)
            st = settled(c, "moving", 180)
            assert st["phase"] == "Succeeded", st
            assert st["image"]["digest"] == first
            one, two = attempts_of(c, "moving")
            assert (one["status"]["phase"], one["status"]["reason"]) == ("Lost", "NodeLost"), one["status"]
            assert two["spec"]["node"] != one["spec"]["node"]
            log = c.run("nodus", "logs", "moving").stdout
            assert "attempt 2 runs build 1" in log and "build 2" not in log, log
            victim.proc = None  # killed above: nothing for the fixture's stop to do
