"""The supervisor's deadlines are on the Clock it is given (supervisor/__main__.py passes the host's).

Each test runs a Supervisor in this process on a clock that moves a long way every time it is read,
so a 30-minute init timeout or an hour's sidecar startupTimeout passes within a few reads: the test
shows the deadline fired, and that status.json's times are the clock's, without waiting either out.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from nodus.agent.layout import AttemptLayout
from nodus.agent.reasons import Reason
from nodus.agent.statefile import read_json, write_json
from nodus.agent.supervisor.lifecycle import Supervisor
from nodus.agent.supervisor.phase import SupervisorPhase as P

PY = sys.executable
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
FAKE_WALL = 4_000_000_000.0
"""The fake clock's Unix time (the year 2096), far from the host's, so its readings are recognisable."""
WATCHDOG_S = 60
"""On the host's clock these waits last 30 and 60 minutes; the alarm ends such a run as a failure."""


class SteppingClock:
    """Moves `step` seconds every time it is read, so each wait's deadline passes after a few reads."""

    def __init__(self, step: float) -> None:
        self.step, self.elapsed = step, 0.0

    def now(self) -> float:
        return FAKE_WALL + self.elapsed

    def monotonic(self) -> float:
        self.elapsed += self.step
        return self.elapsed


class Watchdog(Exception):
    """The supervisor waited on the host's clock instead of the one it was given."""


@pytest.fixture
def in_process() -> Iterator[None]:
    """The Supervisor takes SIGTERM, SIGINT, SIGHUP, SIGPIPE and the wake-up fd of the process it runs
    in: give them back to pytest afterwards."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)

    def expired(signum: int, frame: Any) -> None:
        raise Watchdog(f"the supervisor was still waiting after {WATCHDOG_S}s on the host's clock")
    previous_alarm = signal.signal(signal.SIGALRM, expired)
    signal.alarm(WATCHDOG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.set_wakeup_fd(wakeup)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def supervise(root: Path, clock: SteppingClock, **spec: Any) -> dict[str, Any]:
    """Runs one attempt to its end under `clock` and returns its status.json."""
    layout = AttemptLayout(root)
    layout.make()
    full = {"attempt_id": root.name, "command": [PY, "-c", "open('main-ran', 'w')"], "env": BASE_ENV,
            "working_dir": str(root), "outputs": [], "resources": {}, "cgroups": False, "stop_grace": 2, **spec}
    write_json(layout.spec, full)
    supervisor = Supervisor(layout, full, {}, None, clock)
    try:
        supervisor.run()
    finally:
        os.close(supervisor.log_fd)
        os.close(supervisor.procs.wake_r)
    status = read_json(layout.status)
    assert status is not None
    return status


def test_the_init_timeout_fires_on_the_supervisors_clock(tmp_path: Path, in_process: None) -> None:
    clock = SteppingClock(step=1000.0)  # each select in between waits at most a second for real
    status = supervise(tmp_path / "init", clock, init={"command": ["sleep", "600"], "timeout": 1800})
    assert (status["phase"], status["reason"]) == (P.FAILED, Reason.INIT_FAILED), status["message"]
    assert status["message"].endswith("init command timed out after 1800s")
    assert not (tmp_path / "init" / "main-ran").exists(), "the main command ran after its init timed out"
    assert clock.elapsed >= 1800, "the init command was not waited for its whole timeout on the clock"
    assert status["finish_time"] >= FAKE_WALL and status["time"] >= FAKE_WALL, "status.json's times are the host's"


def test_a_sidecars_startup_timeout_fires_on_the_supervisors_clock(tmp_path: Path, in_process: None) -> None:
    clock = SteppingClock(step=120.0)
    status = supervise(tmp_path / "sidecar", clock,
                       sidecars=[{"name": "web", "command": ["sleep", "600"], "startup_timeout": 3600}])
    assert (status["phase"], status["reason"]) == (P.FAILED, Reason.SIDECAR_FAILED), status["message"]
    assert status["message"].startswith("sidecar web was not ready within 3600s")
    assert not (tmp_path / "sidecar" / "main-ran").exists(), "the main command ran without its sidecar"
    assert clock.elapsed >= 3600


def test_a_ready_sidecar_lets_the_main_command_run_on_the_same_clock(tmp_path: Path, in_process: None) -> None:
    """The other side of the deadline: a sidecar that says it is ready within it is not timed out."""
    ready = [PY, "-c", "import os, time; open(os.environ['NODUS_READY_FILE'], 'w'); time.sleep(600)"]
    status = supervise(tmp_path / "ready", SteppingClock(step=0.001),
                       sidecars=[{"name": "web", "command": ready, "startup_timeout": 3600}])
    assert (status["phase"], status["reason"]) == (P.SUCCEEDED, Reason.COMPLETED), status["message"]
    assert (tmp_path / "ready" / "main-ran").exists()
