"""A supervisor that stays for its Job's next attempt (ADR 0124): through a real `nodus-agent` and its
protocol double of the coordinator, and, for the stop signal's race, the supervisor's loop in a process of
its own."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from agent_double import AgentProcess, FakeCoordinator, fake, reachable_dir, wait_for
from nodus.agent.layout import AttemptLayout
from nodus.agent.runtime.process import ProcessRuntime
from nodus.agent.zygote import _recv, _send
from nodus.v1 import agent_pb2

PY = sys.executable
UIDS = ("--attempt-uids", "231000:64") if os.geteuid() == 0 else ()
"""Each attempt its own uid where the tests run as root (conftest turns them off for the others)."""
# sh, not the venv's python: the venv may live where an attempt's uid cannot reach (/root).
WHO = 'echo "$PPID $(id -u)"'
"""A quick index: its parent (the supervisor) and its uid, into its log."""
WHO_THEN_WAIT = WHO + '; while [ ! -e "$1" ]; do sleep 0.05; done; echo finished'



@pytest.fixture
def base() -> Iterator[Path]:
    yield from reachable_dir("nodus-stays-")


@pytest.fixture
def agent(base: Path, fake: FakeCoordinator) -> Iterator[AgentProcess]:
    a = AgentProcess(base / "work", fake.address, fake.token, extra_args=UIDS)
    try:
        a.start()
        wait_for(fake.current, 15, what="the agent's stream")
        yield a
        # invariants at teardown: nothing of an attempt that ended is left running
        wait_for(lambda: not a.leftovers(), 10, what="ended attempts to leave nothing (AgentProcess.leftovers)")
    finally:
        a.reap()


def index(attempt_id: str, job_uid: str, code: str = WHO, *args: str) -> agent_pb2.Assignment:
    a = agent_pb2.Assignment(attempt_id=attempt_id, index=0, attempt_number=1, command=["sh", "-c", code, "sh", *args])
    a.job.project, a.job.name, a.job.uid = "default", "job-" + job_uid, job_uid
    return a


def who(fake: FakeCoordinator, attempt_id: str) -> tuple[int, int]:
    """(the supervisor's pid, the attempt's uid) from its log."""
    ppid, uid = fake.log(attempt_id).split()[:2]
    return int(ppid), int(uid)


def released(agent: AgentProcess, attempt_id: str) -> bool:
    """The attempt's supervisor gave back its lock (a supervisor that stays then says it is idle)."""
    return not ProcessRuntime.supervisor_alive(AttemptLayout.of(agent.work_dir, attempt_id))


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_to_end(fake: FakeCoordinator, agent: AgentProcess, a: agent_pb2.Assignment) -> agent_pb2.AttemptUpdate:
    fake.assign(a)
    end = fake.wait_final(a.attempt_id, 30)
    wait_for(lambda: a.attempt_id in fake.log_eof, 10, what="the log's eof")
    wait_for(lambda: released(agent, a.attempt_id), 10, what=f"{a.attempt_id}'s supervisor to give back its lock")
    return end


def test_a_jobs_next_index_runs_in_the_supervisor_that_stayed(fake: FakeCoordinator, agent: AgentProcess) -> None:
    first = run_to_end(fake, agent, index("u-0", "u"))
    stayer, uid0 = who(fake, "u-0")
    fds_idle = len(os.listdir(f"/proc/{stayer}/fd"))
    second = run_to_end(fake, agent, index("u-1", "u"))
    third = run_to_end(fake, agent, index("v-0", "v"))
    assert [first.phase, second.phase, third.phase] == [9, 9, 9], fake.log("u-1")
    assert who(fake, "u-1")[0] == stayer, "the Job's second index ran in the supervisor of its first"
    assert who(fake, "v-0")[0] != stayer, "another Job's index gets a supervisor of its own"
    uid1 = who(fake, "u-1")[1]
    if UIDS:
        assert 231000 <= uid0 < 231064 and 231000 <= uid1 < 231064, "each index ran as an attempt uid, not as root"
        assert psutil.Process(stayer).uids().effective == 0, "the supervisor between attempts is itself again"
    assert running(stayer) and len(os.listdir(f"/proc/{stayer}/fd")) == fds_idle, \
        "a supervisor between attempts holds no more descriptors than after its first"


def test_a_sigterm_to_an_idle_supervisor_ends_it_and_the_next_index_starts_afresh(
        fake: FakeCoordinator, agent: AgentProcess) -> None:
    run_to_end(fake, agent, index("w-0", "w"))
    stayer = who(fake, "w-0")[0]
    os.kill(stayer, signal.SIGTERM)  # a stop meant for w-0, late
    wait_for(lambda: not running(stayer), 10, what="the idle supervisor to exit")
    end = run_to_end(fake, agent, index("w-1", "w"))
    assert end.phase == 9 and end.exit_code == 0, end
    assert who(fake, "w-1")[0] != stayer


def test_kill9_of_the_agent_while_a_supervisor_that_stayed_runs(fake: FakeCoordinator, agent: AgentProcess,
                                                                base: Path) -> None:
    go = base / "go"
    run_to_end(fake, agent, index("k-0", "k"))
    fake.assign(index("k-1", "k", WHO_THEN_WAIT, str(go)))
    wait_for(lambda: len(fake.log("k-1").split()) >= 2, 15, what="k-1 to start")
    stayer = who(fake, "k-0")[0]
    assert who(fake, "k-1")[0] == stayer
    assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
    agent.start()
    wait_for(lambda: "re-adopted attempt k-1" in agent.log(), 15, what="the re-adoption")
    go.touch()
    end = fake.wait_final("k-1", 30)
    assert end.phase == 9 and end.exit_code == 0, end
    wait_for(lambda: "k-1" in fake.log_eof, 10, what="the log's eof")
    assert fake.log("k-1").splitlines()[1:] == ["finished"], "k-1 ran exactly once"
    # its channel ended with the agent that made it: it leaves once its attempt is done
    wait_for(lambda: not running(stayer), 15, what="the supervisor to exit after its attempt")


def test_a_cancel_of_a_handed_attempt_stops_it_and_the_supervisor_stays(fake: FakeCoordinator, agent: AgentProcess,
                                                                         base: Path) -> None:
    run_to_end(fake, agent, index("c-0", "c"))
    stayer = who(fake, "c-0")[0]
    fake.assign(index("c-1", "c", WHO_THEN_WAIT, str(base / "never")))
    wait_for(lambda: len(fake.log("c-1").split()) >= 2, 15, what="c-1 to start")
    assert who(fake, "c-1")[0] == stayer
    fake.cancel("c-1", reason="Cancelled", grace=1)
    end = fake.wait_final("c-1", 30)
    assert end.phase == 12 and end.reason == "Cancelled", end
    wait_for(lambda: "c-1" in fake.log_eof, 10, what="the log's eof")
    wait_for(lambda: released(agent, "c-1"), 10, what="c-1's supervisor to give back its lock")
    after = run_to_end(fake, agent, index("c-2", "c"))
    assert after.phase == 9 and after.exit_code == 0, "the stop was c-1's alone"
    assert who(fake, "c-2")[0] == stayer


STAYER = r"""
import sys
from nodus.agent.supervisor.stay import stay
def run(request, lock, gate):
    open(sys.argv[1], "a").write(f"{request['n']}\n")
stay(run, {"n": 0}, int(sys.argv[2]), -1, int(sys.argv[3]), idle_seconds=60)
"""


def test_a_stop_signal_pending_at_a_hand_off_refuses_it(tmp_path: Path) -> None:
    """The agent sends a stop's SIGTERM before a hand-off, never between (stayers.py's guard); the
    supervisor must not take that signal as the new attempt's stop: it refuses the attempt and exits."""
    ran, lock = tmp_path / "ran", tmp_path / "lock"
    ours, theirs = socket.socketpair()
    lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    proc = subprocess.Popen([PY, "-c", STAYER, str(ran), str(lock_fd), str(theirs.fileno())],
                            pass_fds=(lock_fd, theirs.fileno()))
    theirs.close()
    try:
        ours.settimeout(30)
        assert _recv(ours)[0] == {"idle": True}
        _send(ours, {"n": 1}, [lock_fd])
        assert _recv(ours)[0] == {"pid": proc.pid}
        assert _recv(ours)[0] == {"idle": True}
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGTERM)  # pending until it runs again, as one sent before the hand-off
        _send(ours, {"n": 2}, [lock_fd])
        os.kill(proc.pid, signal.SIGCONT)
        assert "stopped" in _recv(ours)[0]
        assert proc.wait(30) == 0
        assert ran.read_text() == "0\n1\n", "the refused attempt did not run"
    finally:
        os.close(lock_fd)
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
