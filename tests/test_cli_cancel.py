"""`nodus cancel JOB [-n PROJECT]` against a real coordinator and agent: a running Job ends Cancelled and
its attempt's command stops; a Job that does not exist fails with the server's reason and fix."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from conftest import Coordinator
from e2e import attempts_of, create, get_job, settled, start_agent
from agent_double import AgentProcess, wait_for

PY = sys.executable

WAITS = ("import os, sys, time\n"
         "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
         "time.sleep(600)\n")
"""argv: PID_FILE. Writes its pid, then runs until stopped."""


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    return shared_coordinator


@pytest.fixture(scope="module")
def agent(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(c, tmp_path_factory.mktemp("agent") / "work", "cli-cancel") as a:
        yield a


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cancel_stops_a_running_job_for_good(c: Coordinator, agent: AgentProcess, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    create(c, "cli-cancel", command=[PY, "-c", WAITS, str(pid_file)])
    wait_for(pid_file.exists, 60, what="the Job's command to start")
    pid = int(pid_file.read_text())

    out = c.run("nodus", "cancel", "cli-cancel", "-n", "default").stdout
    assert out.startswith('job.nodus.dev "cli-cancel" cancelled'), out

    st = settled(c, "cli-cancel", 60)
    assert st["phase"] == "Cancelled" and st["reason"] == "Cancelled", st
    assert get_job(c, "cli-cancel")["spec"]["state"] == "Cancelled"
    assert [a["status"]["phase"] for a in attempts_of(c, "cli-cancel")] == ["Cancelled"]
    wait_for(lambda: _gone(pid), 10, what=f"the cancelled attempt's command (pid {pid}) to stop")
    again = c.run("nodus", "cancel", "cli-cancel").stdout
    assert 'job.nodus.dev "cli-cancel" already cancelled (phase Cancelled)' in again, again


def test_cancel_of_a_missing_job_fails_with_the_reason_and_fix(c: Coordinator) -> None:
    out = c.run("nodus", "cancel", "cli-no-such-job", check=False)
    assert out.returncode == 1 and out.stdout == "", out
    lines = out.stderr.splitlines()
    assert lines[0].startswith("error: ") and "cli-no-such-job" in lines[0] and "not found" in lines[0], out.stderr
    assert any(line.startswith("  fix: ") for line in lines[1:]), out.stderr
