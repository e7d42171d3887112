"""The agent's forget step sweeps an ended attempt's cgroup: a supervisor killed (SIGKILL) after its
final status but before its own sweep leaves the cgroup, maybe with processes in it."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from agent_double import AgentProcess
from cgroup_root import cgroups_unavailable, own_root
from nodus.agent.cgroups import Cgroup
from nodus.agent.runtime.process import ProcessRuntime
from nodus.agent.statefile import write_json


pytestmark = pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")


@pytest.fixture
def root() -> Iterator[str]:
    """A cgroup root of this test's own, removed afterwards (with anything a failing test left in it)."""
    yield from own_root("nodus-forget")


def test_forgetting_an_ended_attempt_kills_and_removes_the_cgroup_its_dead_supervisor_left(
        tmp_path: Path, root: str) -> None:
    """The attempt's status is final (SUCCEEDED) and a process it started still runs in its cgroup, as a
    supervisor SIGKILLed between its status and its sweep leaves them: forgetting the attempt kills the
    process and removes the cgroup and the directory."""
    agent = AgentProcess(tmp_path / "work", "127.0.0.1:1", "token", extra_args=("--cgroup-root", root))
    runtime = ProcessRuntime(agent.work_dir, cgroup_root=root, zygote=False)
    layout = runtime.layout("att-swept")
    layout.make()
    name = runtime.cgroup_name(layout)
    write_json(layout.spec, {"attempt_id": "att-swept", "cgroups": True, "cgroup_root": root, "cgroup_name": name})
    write_json(layout.status, {"attempt_id": "att-swept", "phase": "SUCCEEDED"})
    cgroup = Cgroup.create(root, name)
    stray = subprocess.Popen(["sleep", "300"], cwd="/", preexec_fn=cgroup.attach, start_new_session=True)
    try:
        [found] = agent.leftovers()
        assert f"pids [{stray.pid}] still run in the cgroup of ended attempt att-swept" in found

        runtime.remove(layout)

        stray.wait(timeout=30)  # SIGKILLed by the sweep (a hang here is the failure)
        assert not layout.root.exists()
        assert not Cgroup.locate(root, name).usable, "the forgotten attempt's cgroup was left behind"
        assert agent.leftovers() == []
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_forgetting_an_attempt_without_cgroups_leaves_other_cgroups_alone(tmp_path: Path, root: str) -> None:
    """An attempt run with --cgroups false names no cgroup of its own: forgetting it removes its directory
    and touches no cgroup, even one that happens to carry its name."""
    runtime = ProcessRuntime(tmp_path / "work", cgroup_root=root, zygote=False)
    layout = runtime.layout("att-plain")
    layout.make()
    name = runtime.cgroup_name(layout)
    write_json(layout.spec, {"attempt_id": "att-plain", "cgroups": False, "cgroup_root": root, "cgroup_name": name})
    write_json(layout.status, {"attempt_id": "att-plain", "phase": "FAILED"})
    other = Cgroup.create(root, name)
    try:
        runtime.remove(layout)
        assert not layout.root.exists()
        assert Cgroup.locate(root, name).usable
    finally:
        assert other.remove() == []
