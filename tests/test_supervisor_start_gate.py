"""The start gate (supervisor/start_gate.py, ADR 0082): a supervisor forked while the agent's state.json
is still being fsynced starts no step until the agent writes the gate's byte; a gate closed without it
(the agent gone, or its write failed) ends the attempt LOST with nothing run; a stop asked for while the
gate is shut wins; and the agent's side (spawning.spawn_gated) opens the gate only once the flush is done.

Each supervisor runs in this process, as tests/test_supervisor_clock.py's do.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from nodus.agent.clock import SystemClock
from nodus.agent.layout import AttemptLayout
from nodus.agent.reasons import Reason
from nodus.agent.statefile import read_json, write_json
from nodus.agent.supervisor.lifecycle import Supervisor
from nodus.agent.supervisor.phase import SupervisorPhase as P
from nodus.agent.supervisor.start_gate import OPEN, await_gate, open_gate, shut_gate

PY = sys.executable
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


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


def supervise(root: Path, gate_fd: int, before_run: Any = None) -> dict[str, Any]:
    """Runs one attempt (its main command leaves a file) behind the gate `gate_fd`; returns its status."""
    layout = AttemptLayout(root)
    layout.make()
    spec = {"attempt_id": root.name, "command": [PY, "-c", "open('main-ran', 'w')"], "env": BASE_ENV,
            "working_dir": str(root), "outputs": [], "resources": {}, "cgroups": False, "stop_grace": 2}
    write_json(layout.spec, spec)
    supervisor = Supervisor(layout, spec, {}, None, SystemClock(), gate_fd)
    if before_run is not None:
        before_run(layout)
    try:
        supervisor.run()
    finally:
        os.close(supervisor.log_fd)
        os.close(supervisor.procs.wake_r)
    status = read_json(layout.status)
    assert status is not None
    return status


def test_an_opened_gate_lets_the_attempt_run(tmp_path: Path, in_process: None) -> None:
    r, w = os.pipe()
    open_gate(w)  # opened before the supervisor looks: the byte waits in the pipe
    status = supervise(tmp_path / "open", r)
    assert (status["phase"], status["reason"]) == (P.SUCCEEDED, Reason.COMPLETED), status["message"]
    assert (tmp_path / "open" / "main-ran").exists()


def test_a_gate_closed_unopened_ends_the_attempt_lost_with_nothing_run(tmp_path: Path, in_process: None) -> None:
    r, w = os.pipe()
    shut_gate(w)
    status = supervise(tmp_path / "shut", r)
    assert (status["phase"], status["reason"]) == (P.LOST, Reason.AGENT_FAULT), status["message"]
    assert "nothing of it ran" in status["message"]
    assert not (tmp_path / "shut" / "main-ran").exists(), "the main command ran behind a shut gate"


def test_the_gate_is_waited_for(tmp_path: Path, in_process: None) -> None:
    """Opened from another thread only once the supervisor sits at the gate (its SPAWNED status written)."""
    r, w = os.pipe()
    root = tmp_path / "waits"
    seen: list[Any] = []

    def opener() -> None:
        while (status := read_json(AttemptLayout(root).status)) is None:
            threading.Event().wait(0.01)
        seen.append(status["phase"])
        seen.append((root / "main-ran").exists())
        open_gate(w)

    t = threading.Thread(target=opener)
    t.start()
    status = supervise(root, r)
    t.join()
    assert seen == [P.SPAWNED, False], "the main command ran before the gate opened"
    assert status["phase"] == P.SUCCEEDED, status["message"]


def test_a_stop_asked_for_behind_the_gate_wins(tmp_path: Path, in_process: None) -> None:
    r, w = os.pipe()

    def cancel(layout: AttemptLayout) -> None:
        write_json(layout.cancel, {"reason": "Cancelled", "grace_seconds": 0, "phase": "CANCELLED"})

    try:
        status = supervise(tmp_path / "stopped", r, before_run=cancel)
    finally:
        os.close(w)
    assert status["phase"] == P.CANCELLED, status["message"]
    assert not (tmp_path / "stopped" / "main-ran").exists()


def test_await_gate_reads_one_byte_and_closes_its_end() -> None:
    r, w = os.pipe()
    wake_r, wake_w = os.pipe()
    os.write(w, OPEN)
    assert await_gate(r, wake_r, lambda: None) is True
    with pytest.raises(OSError):
        os.fstat(r)
    r2, w2 = os.pipe()
    os.write(w2, b"x")  # anything but the agent's byte is no opening
    assert await_gate(r2, wake_r, lambda: None) is False
    for fd in (w, w2, wake_r, wake_w):
        os.close(fd)


class FakeTable:
    """flush() completes when the test says so (or fails)."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None

    async def flush(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        await self.done


class FakeRuntime:
    def __init__(self) -> None:
        self.gate = -1
        self.order: list[str] = []

    def write_spec(self, a: Any, layout: Any) -> None:
        self.order.append("spec")

    def spawn(self, a: Any, layout: Any, gate: int) -> Any:
        self.order.append("spawn")
        self.gate = os.dup(gate)  # the supervisor's copy
        return "spawned"


def test_spawn_gated_opens_the_gate_only_after_the_flush() -> None:
    from nodus.agent.spawning import spawn_gated

    async def scenario() -> None:
        table, runtime = FakeTable(), FakeRuntime()
        task = asyncio.ensure_future(spawn_gated(runtime, table, None, None))  # type: ignore[arg-type]
        while runtime.gate < 0:
            await asyncio.sleep(0.01)
        assert runtime.order == ["spec", "spawn"]
        os.set_blocking(runtime.gate, False)
        with pytest.raises(BlockingIOError):
            os.read(runtime.gate, 1)  # forked, but the gate is shut while state.json is not on disk
        assert table.done is not None
        table.done.set_result(None)
        assert await task == "spawned"
        assert os.read(runtime.gate, 1) == OPEN
        os.close(runtime.gate)

    asyncio.run(scenario())


def test_spawn_gated_keeps_the_gate_shut_when_the_flush_fails() -> None:
    from nodus.agent.spawning import spawn_gated

    async def scenario() -> None:
        table, runtime = FakeTable(), FakeRuntime()
        task = asyncio.ensure_future(spawn_gated(runtime, table, None, None))  # type: ignore[arg-type]
        while runtime.gate < 0 or table.done is None:
            await asyncio.sleep(0.01)
        table.done.set_exception(OSError("disk full"))
        with pytest.raises(OSError, match="disk full"):
            await task
        assert os.read(runtime.gate, 1) == b"", "the gate was opened although state.json was not written"
        os.close(runtime.gate)

    asyncio.run(scenario())
