"""`runc.wait_exit`: a runc call's exit code, woken by its pidfd (not Popen.wait's doubling sleeps, ADR 0076),
and a call past its time killed."""
from __future__ import annotations

import subprocess

import pytest

from nodus.agent.oci.runc import wait_exit


def test_the_exit_code_is_returned_and_the_process_reaped() -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 3"])
    assert wait_exit(proc, 30) == 3
    assert proc.returncode == 3


def test_a_process_that_was_reaped_already_still_gives_its_code() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert wait_exit(proc, 30) == 0


def test_a_call_past_its_time_is_killed() -> None:
    proc = subprocess.Popen(["sleep", "60"])
    with pytest.raises(subprocess.TimeoutExpired):
        wait_exit(proc, 0.05)
    assert proc.returncode is not None  # killed and reaped, not left running
