"""Issue 11 part 4 end to end: GPUs injected through CDI by the real agent. A real coordinator, a real
`nodus-agent --runtime oci --simulate-gpus … --cdi-dir DIR` and a real registry on loopback; the CDI spec
points at test device nodes made here with mknod (copies of /dev/zero's numbers), so no GPU is needed.

A Job with an image and resources.gpu.count 1 sees only its assigned device in the container, with
NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES naming its UUID; an agent whose spec names a device node
that is gone reports its GPUs unhealthy (StaleCdiSpec) and the Job is placed on the other node.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_oci_e2e import agent_hosts, c, images  # noqa: F401 - c and images are fixtures

from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, attempts_of, create, joined, settled
from registry import Registry

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry"))
                       or os.geteuid() != 0, reason="needs runc, skopeo, umoci, docker-registry and root (mknod)"),
]

GPUS = 2
"""Simulated GPUs per agent: their UUIDs are GPU-simulated-<index>."""
ZERO = os.stat("/dev/zero").st_rdev

# Exits 0 only when exactly the assigned GPU's node is in /dev (openable: the device cgroup allows it),
# the spec's common node and library are there, and both visible-devices variables name the GPU's UUID.
# Only sh builtins, ls and cat: the test image's busybox has no grep.
PROGRAM = r"""
index=${NVIDIA_VISIBLE_DEVICES#GPU-simulated-}
set -- /dev/nvidia[0-9]*
echo "gpus=$* visible=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES caps=$NVIDIA_DRIVER_CAPABILITIES"
[ "$*" = "/dev/nvidia$index" ] || exit 3
[ "$CUDA_VISIBLE_DEVICES" = "$NVIDIA_VISIBLE_DEVICES" ] || exit 4
[ -c /dev/nvidiactl ] && [ -f /usr/lib/libcuda.so.test ] || exit 5
: < "/dev/nvidia$index" || exit 6
echo injected
"""

def make_node(path: Path) -> None:
    os.mknod(path, 0o666 | stat.S_IFCHR, ZERO)
    path.chmod(0o666)  # the umask would otherwise keep the pod's users out


def cdi_spec(host: Path, missing: bool = False) -> Path:
    """A spec as `nvidia-ctk cdi generate` writes one, over the test nodes of `host`; with `missing`, the
    second GPU's node is one that does not exist (what a driver update leaves behind)."""
    dev = host / "dev"
    dev.mkdir(parents=True)
    for name in (*(f"nvidia{i}" for i in range(GPUS)), "nvidiactl"):
        make_node(dev / name)
    lib = host / "libcuda.so.test"
    lib.write_text("not really libcuda\n")
    lib.chmod(0o644)

    def node(i: int) -> dict[str, Any]:
        source = host / "gone" / f"nvidia{i}" if missing and i == 1 else dev / f"nvidia{i}"
        return {"deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": str(source)}]}
    doc = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
           "devices": [{"name": f"GPU-simulated-{i}", "containerEdits": node(i)} for i in range(GPUS)],
           "containerEdits": {
               "env": ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
               "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": str(dev / "nvidiactl")}],
               "mounts": [{"hostPath": str(lib), "containerPath": "/usr/lib/libcuda.so.test",
                           "options": ["ro", "nosuid", "nodev", "bind"]}]}}
    cdi = host / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.json").write_text(json.dumps(doc))
    return cdi


@pytest.fixture
def top() -> Iterator[Path]:
    with agent_hosts("nodus-cdi-e2e-", works="*/agent") as root:
        yield root


def cdi_agent(c: Coordinator, registry: Registry, host: Path, cdi: Path, node: str, *extra: str) -> AgentProcess:
    return AgentProcess(host / "agent", c.grpc, c.join_token, node=node, env=dict(AGENT_ENV),
                        extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci",
                                    "--insecure-registry", registry.host, "--simulate-gpus", f"A100:{GPUS}:80Gi",
                                    "--cdi-dir", str(cdi), *extra))


def test_a_gpu_job_sees_only_its_assigned_device_through_the_cdi_spec(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, top: Path) -> None:
    host = top / "good"
    with joined([cdi_agent(c, oci_registry, host, cdi_spec(host), "cdi-n0").start()], c):
        create(c, "cdi-one", backoffLimit=0, image=images["busybox"], resources={"gpu": {"count": 1}},
               command=["sh", "-c", PROGRAM])
        st = settled(c, "cdi-one", 180)
        log = c.run("nodus", "logs", "cdi-one").stdout
        assert st["phase"] == "Succeeded", (st, log)
        assert "injected" in log
        [line] = [ln for ln in log.splitlines() if ln.startswith("gpus=")]
        index = line.split()[0].removeprefix("gpus=/dev/nvidia")
        assert line.split()[1:3] == [f"visible=GPU-simulated-{index}", f"cuda=GPU-simulated-{index}"]
        assert "caps=compute,utility" in line  # the spec's own env reaches the container


def test_a_node_whose_spec_names_a_missing_device_is_unhealthy_and_the_job_lands_elsewhere(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, top: Path) -> None:
    stale_host, good_host = top / "stale", top / "good"
    # both in region eu, the Job too: the first test's node (gone, still known) is never a choice
    stale = cdi_agent(c, oci_registry, stale_host, cdi_spec(stale_host, missing=True), "cdi-stale", "--region", "eu")
    good = cdi_agent(c, oci_registry, good_host, cdi_spec(good_host), "cdi-good", "--region", "eu")
    with joined([stale.start()], c):
        wait_for(lambda: "GPUs unhealthy (StaleCdiSpec)" in stale.log(), 30, what="the stale agent's GPU condition")
        assert "does not exist" in stale.log()
        # created while the stale node is the only one: placed there, it would be refused and replaced
        create(c, "cdi-elsewhere", backoffLimit=0, image=images["busybox"], resources={"gpu": {"count": 2}},
               placement={"regions": ["eu"]},
               command=["sh", "-c", "set -- /dev/nvidia[0-9]*; echo $*; [ $# -eq 2 ]"])
        with joined([good.start()], c):
            st = settled(c, "cdi-elsewhere", 180)
            assert st["phase"] == "Succeeded", st
            assert [a["spec"]["node"] for a in attempts_of(c, "cdi-elsewhere")] == ["cdi-good"]


def test_a_relative_cdi_dir_is_refused_naming_the_flag(c: Coordinator, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="bad-cdi-dir", extra_args=("--cdi-dir", "cdi"))
    agent.start()
    assert agent.proc is not None and agent.proc.wait(60) != 0
    assert "--cdi-dir 'cdi' must be an absolute path, such as /etc/cdi" in agent.log()
    agent.proc = None
