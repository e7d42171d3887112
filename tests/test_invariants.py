"""The teardown check of tests/invariants.py can fail: with the agent frozen (SIGSTOP), a deleted Job's
attempt keeps running where no stop can reach it, and the check names it; once the agent thaws and
stops it, the same check passes. Every fleet of tests/e2e.py runs this check after a passing test."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from agent_double import wait_for
from conftest import Coordinator
from e2e import JOBS, attempts_of, create, start_agent
from invariants import check_fleet, problems


def test_the_teardown_check_names_an_attempt_left_running_after_its_job_was_deleted(tmp_path: Path) -> None:
    # A long lease: the frozen agent's node stays Ready, so the check holds it to every rule.
    with (Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "120s")) as c,
          start_agent(c, tmp_path / "agent") as agent):
        create(c, "left", command=[sys.executable, "-c", "import time; time.sleep(600)"])
        wait_for(lambda: [a for a in attempts_of(c, "left") if (a.get("status") or {}).get("phase") == "Running"],
                 60, what="the attempt to run")
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            r = c.session().delete(c.url(f"{JOBS}/left"))
            assert r.status_code == 200, r.text
            found = wait_for(lambda: [p for p in problems(c, [agent]) if "its Job left is deleted" in p], 30,
                             what="the check to name the orphaned attempt")
            assert "is Running on node-a" in found[0], found
            with pytest.raises(AssertionError, match="its Job left is deleted"):
                check_fleet(c, [agent], timeout=1)
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        check_fleet(c, [agent])
        assert not attempts_of(c, "left")
