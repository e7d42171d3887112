"""A trivial index's passing states are not each a report (ADR 0094).

The agent reports accepted, materializing, inputs ready and stopping only once they have lasted
`session.PASSING_REPORT_DELAY`; a change meanwhile makes the deferred report moot, so the last state always
goes out and an end still goes out only when the agent reports it (after state.json holds it). The
supervisor writes STOPPING on its own only where something after the main command takes time.

The supervisors run in this process, as tests/test_supervisor_start_gate.py's do.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from nodus.agent import layout as L
from nodus.agent.attempts import Attempt
from nodus.agent.clock import SystemClock
from nodus.agent.layout import AttemptLayout
from nodus.agent.session import PASSING_REPORT_DELAY, Session
from nodus.agent.statefile import read_json, write_json
from nodus.agent.supervisor import lifecycle
from nodus.agent.supervisor.lifecycle import Supervisor
from nodus.agent.supervisor.phase import SupervisorPhase as P

PY = sys.executable
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


class Stream:
    """What Session.report sends on (link.Link): records each update's phase."""

    stream_id = 1
    lease_duration = 30.0

    def __init__(self) -> None:
        self.sent: list[tuple[int, int | None]] = []
        """(the update's phase, its inputs_ready_time's seconds) of each update sent."""

    def send(self, **message: Any) -> int | None:
        u = message["attempt_update"]
        self.sent.append((u.phase, u.inputs_ready_time.seconds if u.HasField("inputs_ready_time") else None))
        return len(self.sent)


def session(stream: Stream) -> Session:
    return Session(None, stream, None, None, None, None, SystemClock(), 10.0)  # type: ignore[arg-type]


async def settle() -> None:
    await asyncio.sleep(PASSING_REPORT_DELAY * 3)


def test_a_state_that_lasts_is_reported_once_after_the_delay() -> None:
    async def go() -> list[Any]:
        stream = Stream()
        s, att = session(stream), Attempt("a1", phase="MATERIALIZING")
        s.report_soon(att)
        s.report_soon(att)  # the same state again: still one report
        assert stream.sent == [], "a passing state went out at once"
        await settle()
        return stream.sent
    assert len(asyncio.run(go())) == 1


def test_states_passed_before_the_delay_ride_with_the_next_report() -> None:
    async def go() -> tuple[list[Any], Attempt]:
        stream = Stream()
        s, att = session(stream), Attempt("a2")
        s.report_soon(att)  # accepted
        att.phase = "MATERIALIZING"
        s.report_soon(att)
        att.inputs_ready_time = 1000.0
        s.report_soon(att)  # inputs ready
        att.phase, att.start_time = L.RUNNING, 1001.0
        s.report(att)  # what a user waits for: at once
        await settle()
        return stream.sent, att
    sent, att = asyncio.run(go())
    assert len(sent) == 1, sent
    assert sent[0][1] == 1000, "the inputs-ready time rides with RUNNING"


def test_a_deferred_report_never_sends_an_end_the_agent_has_not_reported() -> None:
    """finish() changes the attempt at once but reports it only after the flush: the deferred report of
    the state before must not send the end early."""
    async def go() -> list[Any]:
        stream = Stream()
        s, att = session(stream), Attempt("a3", phase=L.RUNNING)
        att.phase = L.STOPPING
        s.report_soon(att)
        att.phase = L.SUCCEEDED  # as finish() sets it, its report waiting for state.json's flush
        await settle()
        return stream.sent
    assert asyncio.run(go()) == []


@pytest.fixture
def in_process() -> Iterator[None]:
    """The Supervisor takes signals and the wake-up fd of the process it runs in: give them back after."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def phases_written(root: Path, code: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, Any]]:
    """Runs one attempt whose main command is `code`; the phases of its status writes, and its last status."""
    layout = AttemptLayout(root)
    layout.make()
    spec = {"attempt_id": root.name, "command": [PY, "-c", code], "env": BASE_ENV, "working_dir": str(root),
            # Every Assignment declares the outputs directory (coordinator/controllers/assignment.py).
            "outputs": [{"name": "outputs", "path": "/nodus/outputs"}], "resources": {}, "cgroups": False,
            "stop_grace": 2}
    write_json(layout.spec, spec)
    written: list[str] = []

    def recording(path: Path, data: dict[str, Any], **kw: Any) -> None:
        if path == layout.status:
            written.append(str(data["phase"]))
        write_json(path, data, **kw)
    monkeypatch.setattr(lifecycle, "write_json", recording)
    supervisor = Supervisor(layout, spec, {}, None, SystemClock())
    try:
        supervisor.run()
    finally:
        os.close(supervisor.log_fd)
        os.close(supervisor.procs.wake_r)
    status = read_json(layout.status)
    assert status is not None
    return written, status


def test_nothing_to_wind_down_writes_no_stopping(tmp_path: Path, in_process: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    written, status = phases_written(tmp_path / "quick", "pass", monkeypatch)
    assert written == [P.SPAWNED, P.RUNNING, P.SUCCEEDED]
    assert (status["phase"], status["exit_code"]) == (P.SUCCEEDED, 0)


def test_outputs_to_collect_write_stopping_first(tmp_path: Path, in_process: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "outputs"
    code = f"open({str(root / 'outputs' / 'result.txt')!r}, 'w').write('42')"
    written, status = phases_written(root, code, monkeypatch)
    assert written == [P.SPAWNED, P.RUNNING, P.STOPPING, P.SUCCEEDED]
    assert status["phase"] == P.SUCCEEDED and [o["name"] for o in status["outputs"]] == ["outputs"]
