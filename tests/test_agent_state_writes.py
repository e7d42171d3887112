"""The agent's state.json writes leave its event loop (ADR 0036), and stay crash-safe.

In process: the attempt table over a disk whose fsync the test holds shut (no timing in it: a write on
the event loop would block the test's own coroutine until the gate gives up). Then real agents whose
state.json fsyncs are slowed (a sitecustomize in their PYTHONPATH), killed -9 right after an attempt
starts, and watched reporting an end: the flushes the daemon awaits keep what they promise.
"""
from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent_double import AgentProcess, FakeCoordinator, fake, wait_for
from nodus.agent.attempts import Attempt, Stage
from nodus.agent.clock import SystemClock
from nodus.agent.statefile import read_json
from nodus.agent.table import AttemptTable, Volatile
from nodus.v1 import agent_pb2, common_pb2

PY = sys.executable


class Gate:
    """os.fsync held shut until the test opens it: a disk as slow as the test needs."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.threads: set[str] = set()
        self.calls = 0
        self.real = os.fsync

    def fsync(self, fd: int) -> None:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if not self.open.wait(10):
            raise TimeoutError("the test never opened the fsync gate (did a write block the event loop?)")
        self.real(fd)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    g = Gate()
    monkeypatch.setattr(os, "fsync", g.fsync)
    return g


def on_disk(path: Path) -> set[str]:
    """The attempts state.json holds."""
    return set((read_json(path) or {}).get("attempts") or {})


def running(attempt_id: str) -> Attempt:
    return Attempt(attempt_id, stage=Stage.SUPERVISED, phase="RUNNING")


async def turns(n: int = 20) -> None:
    """Lets the event loop go round: whatever can run on it does."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_slow_disk_leaves_the_loop_free_and_a_burst_of_persists_is_one_more_write(tmp_path: Path,
                                                                                     gate: Gate) -> None:
    path = tmp_path / "state.json"
    table = AttemptTable(path, "n1", SystemClock())

    async def main() -> None:
        table.add(running("a0"), Volatile())
        table.persist()  # returns at once: the write waits on the disk elsewhere
        assert await asyncio.to_thread(gate.entered.wait, 10), "the first write reached its fsync"
        for i in range(1, 101):  # a burst while that write is in flight
            table.add(running(f"a{i}"), Volatile())
            table.persist()
        flushed = asyncio.create_task(table.flush())
        await turns()  # the loop goes round while the disk holds the write
        assert not flushed.done(), "a flush returns only once a write holding its changes is fsynced"
        gate.open.set()
        await flushed
        assert on_disk(path) == {f"a{i}" for i in range(101)}, "the last state is on disk"
        await table.close()

    asyncio.run(main())
    assert "MainThread" not in gate.threads and gate.threads, "every fsync ran off the event loop's thread"
    assert table.writer.writes == 2, "the write in flight, then one write for the 100 persists made meanwhile"
    # ADR 0112: the file's previous inode stays as the next write's temp file; nothing else is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [".state.json.swap", "state.json"]


def test_a_flush_makes_undurable_persists_durable_and_after_flush_waits_for_it(tmp_path: Path, gate: Gate) -> None:
    path = tmp_path / "state.json"
    table = AttemptTable(path, "n1", SystemClock())
    seen: list[set[str]] = []

    async def main() -> None:
        table.add(running("a1"), Volatile())
        table.persist(durable=False)
        table.after_flush(lambda: seen.append(on_disk(path)))
        assert await asyncio.to_thread(gate.entered.wait, 10), "after_flush asks for an fsync"
        await turns()
        assert seen == [], "the callback waits for the fsync"
        gate.open.set()
        await table.flush()
        await turns()
        await table.close()

    asyncio.run(main())
    assert seen == [{"a1"}], "the callback ran once, the change on disk"
    assert gate.calls == 2, "one durable write: the file, then its directory"


def test_a_failed_write_reaches_the_flush_and_the_next_flush_writes_the_latest_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    table = AttemptTable(path, "n1", SystemClock())
    real = os.replace
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def replace(src: Any, dst: Any) -> None:
        if failures:
            raise failures.pop()
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)

    async def main() -> None:
        table.add(running("a1"), Volatile())
        table.persist()
        with pytest.raises(OSError, match="No space left on device"):
            await table.flush()
        table.add(running("a2"), Volatile())
        await table.flush()  # tries again, with the state as it is now
        await table.close()

    asyncio.run(main())
    assert on_disk(path) == {"a1", "a2"}


# -- real agents on a slow disk ------------------------------------------------------------------------
SLOW_FSYNC = """
import os, time

_fsync = os.fsync


def _slow_fsync(fd):
    # only the agent's state.json (its temp file, then not the directory): the rest of the disk is fast
    try:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        name = ""
    if name.startswith(".state.json."):
        time.sleep(float(os.environ["NODUS_TEST_STATE_FSYNC_SECONDS"]))
    _fsync(fd)


os.fsync = _slow_fsync
"""

WAIT_FOR_GO = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).open('a').write(os.environ['NODUS_ATTEMPT'] + ' ' + str(os.getpid()) + '\\n')
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print('finished', flush=True)
"""


def assignment(attempt_id: str, code: str, *args: str) -> agent_pb2.Assignment:
    a = agent_pb2.Assignment(attempt_id=attempt_id, index=0, attempt_number=1, command=[PY, "-c", code, *args])
    a.job.project, a.job.name, a.job.uid = "default", "job-" + attempt_id, "uid-" + attempt_id
    return a



@pytest.fixture
def slow_agent(tmp_path: Path, fake: FakeCoordinator) -> Iterator[AgentProcess]:
    """An agent whose every state.json fsync takes a second: far longer than an attempt takes to start."""
    site = tmp_path / "slow-fsync"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_FSYNC)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    a = AgentProcess(tmp_path / "work", fake.address, fake.token,
                     env={"PYTHONPATH": path, "NODUS_TEST_STATE_FSYNC_SECONDS": "1.0"})
    try:
        yield a
        wait_for(lambda: not a.leftovers(), 10, what="ended attempts to leave nothing (AgentProcess.leftovers)")
    finally:
        a.reap()


def _marker_written(marker: Path) -> bool:
    return marker.exists() and marker.read_text().endswith("\n")


def test_kill9_right_after_an_attempt_starts_on_a_slow_disk_readopts_it(fake: FakeCoordinator,
                                                                        slow_agent: AgentProcess,
                                                                        tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    fake.assign(assignment("a-quick-kill", WAIT_FOR_GO, str(marker), str(go)), push=False)
    slow_agent.start()
    wait_for(lambda: _marker_written(marker), 30, what="the attempt to start")
    # At once, before the agent saw it run: only the flush before the spawn put it in state.json.
    assert slow_agent.signal(signal.SIGKILL) == -signal.SIGKILL
    workload_pid = int(marker.read_text().split()[1])
    os.kill(workload_pid, 0)  # the workload outlived its agent
    assert slow_agent.state()["attempts"]["a-quick-kill"]["stage"] == Stage.SUPERVISED.value
    slow_agent.start()
    wait_for(lambda: "re-adopted attempt a-quick-kill" in slow_agent.log(), 30, what="the re-adoption")
    go.touch()
    end = fake.wait_final("a-quick-kill", timeout=60)
    assert end.phase == common_pb2.ATTEMPT_PHASE_SUCCEEDED and end.exit_code == 0
    assert len(marker.read_text().splitlines()) == 1, "the attempt ran exactly once"


def test_an_end_is_reported_only_once_state_json_holds_it(fake: FakeCoordinator, slow_agent: AgentProcess) -> None:
    fake.assign(assignment("a-end", "print('done')"), push=False)
    slow_agent.start()

    def end_and_state() -> tuple[agent_pb2.AttemptUpdate, dict[str, Any]] | None:
        end = fake.final("a-end")
        return None if end is None else (end, slow_agent.state())  # read the moment the end arrived

    end, state = wait_for(end_and_state, 60, what="the end of a-end")
    assert end.phase == common_pb2.ATTEMPT_PHASE_SUCCEEDED
    held = (state.get("attempts") or {}).get("a-end") or dict(state.get("finished") or []).get("a-end") or {}
    assert held.get("phase") == "SUCCEEDED", f"state.json when the end arrived: {state}"
