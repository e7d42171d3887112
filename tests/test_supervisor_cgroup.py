"""An attempt's cgroup ends with it: the supervisor sweeps and removes it on every way out, and the
teardown invariant (agent_double.AgentProcess.leftovers, which tests/invariants.py asks of every
e2e fleet) reports an ended or forgotten attempt's cgroup that is still there, with processes or empty.

Needs a writable cgroup hierarchy (root on v1 or v2), as the agent's own OOM and freeze tests do.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from agent_double import AgentProcess
from cgroup_root import cgroups_unavailable, own_root
from nodus.agent.cgroups import Cgroup
from nodus.agent.layout import AttemptLayout
from nodus.agent.reasons import Reason
from nodus.agent.runtime.process import ProcessRuntime
from nodus.agent.statefile import read_json, write_json
from nodus.agent.supervisor.phase import SupervisorPhase as P

PY = sys.executable


pytestmark = pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")


@pytest.fixture
def root() -> Iterator[str]:
    """A cgroup root of this test's own, removed afterwards (with anything a failing test left in it)."""
    yield from own_root("nodus-test")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


ESCAPES_THEN_FAILS = ("import os, subprocess, sys\n"
                      "p = subprocess.Popen(['sleep', '300'], start_new_session=True, cwd='/')\n"
                      "open(sys.argv[1], 'w').write(str(p.pid))\n"
                      "sys.exit(3)\n")


def test_a_failed_init_leaves_no_process_and_no_cgroup(tmp_path: Path, root: str) -> None:
    """The init command starts a process in a session of its own (out of reach of its process group's
    SIGKILL), then fails: the attempt ends FAILED InitFailed, and the process and the cgroup end with it."""
    layout = AttemptLayout(tmp_path / "att-init")
    layout.make()
    pid_file = tmp_path / "escaped.pid"
    write_json(layout.spec, {
        "attempt_id": "att-init", "command": [PY, "-c", "open('main-ran', 'w')"],
        "init": {"command": [PY, "-c", ESCAPES_THEN_FAILS, str(pid_file)]},
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "working_dir": str(layout.root), "outputs": [],
        "resources": {}, "cgroups": True, "cgroup_root": root, "cgroup_name": "att-init", "stop_grace": 1})
    subprocess.run([PY, "-m", "nodus.agent.supervisor", str(layout.root)], stdin=subprocess.DEVNULL, timeout=120,
                   check=True)
    status = read_json(layout.status)
    assert status is not None and (status["phase"], status["reason"]) == (P.FAILED, Reason.INIT_FAILED), status
    escaped = int(pid_file.read_text())
    assert not _running(escaped), f"pid {escaped}, started by the failed init command, outlived its attempt"
    assert not Cgroup.locate(root, "att-init").usable, "the ended attempt's cgroup was left behind"
    assert not (layout.root / "main-ran").exists()


def test_the_teardown_invariant_reports_an_ended_attempts_cgroup(tmp_path: Path, root: str) -> None:
    """The check itself, on cgroups made by hand: an ended attempt's cgroup with a process in it, then
    empty, then gone; and a forgotten attempt's (directory removed) by the runtime's name for it."""
    agent = AgentProcess(tmp_path / "work", "127.0.0.1:1", "token", extra_args=("--cgroup-root", root))
    layout = AttemptLayout(agent.work_dir / "attempts" / "att-done")
    layout.make()
    write_json(layout.spec, {"attempt_id": "att-done", "cgroup_root": root, "cgroup_name": "att-done"})
    write_json(layout.status, {"attempt_id": "att-done", "phase": "SUCCEEDED"})
    cgroup = Cgroup.create(root, "att-done")
    stray = subprocess.Popen(["sleep", "300"], cwd="/", preexec_fn=cgroup.attach)
    try:
        [found] = agent.leftovers()
        assert f"pids [{stray.pid}] still run in the cgroup of ended attempt att-done (SUCCEEDED)" in found
    finally:
        stray.kill()
        stray.wait()
    [found] = agent.leftovers()
    assert "the cgroup of ended attempt att-done (SUCCEEDED) was left behind, empty" in found
    assert cgroup.remove() == []
    assert agent.leftovers() == []

    write_json(layout.status, {"attempt_id": "att-done", "phase": "RUNNING"})
    running = Cgroup.create(root, "att-done")
    assert agent.leftovers() == [], "a running attempt's cgroup is its own business"
    assert running.remove() == []

    gone = AttemptLayout.of(agent.work_dir, "att-gone")  # never made: as the agent leaves a forgotten one
    forgotten = Cgroup.create(root, ProcessRuntime(agent.work_dir, zygote=False).cgroup_name(gone))
    [found] = agent.leftovers()
    assert "the cgroup of forgotten attempt att-gone was left behind, empty" in found
    assert forgotten.remove() == []
    assert agent.leftovers() == []
