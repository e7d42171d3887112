"""Time, injected: the agent reads it through a `Clock` wherever a decision depends on it.

Leases, backoff, checkpoint deadlines, progress rate limits and timeouts read `monotonic()` (a
duration never jumps with the wall clock); what is reported or persisted (an attempt's times, a
lease's expiry across a restart) reads `now()`. Tests pass a clock they move by hand (the pure
core in decisions.py takes `now` as a value and needs no clock at all). The agent never imports
the coordinator's clock (the layers forbid it); this is the agent's own.

`--clock-offset-file FILE` (as nodus-coordinator's, for drills and tests) adds the seconds written in
FILE to every wall time the agent reports: an attempt's start, end and progress, heartbeats and
checkpoints, so they move with a coordinator whose clock a test moves forward. The attempts'
supervisors stamp the start and the end themselves, so the agent leaves the file's path in its work
directory (`POINTER`) and each supervisor reads the same file (`supervisor_clock`). Durations and
deadlines (`monotonic()`) never move.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Unix seconds (the wall clock)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go back: for durations and deadlines."""
        ...


class SystemClock:
    """The host's clocks (what a running agent uses)."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


def wall_of(clock: Clock, deadline: float) -> float:
    """A monotonic deadline as Unix seconds (for state.json, which must survive a restart)."""
    return clock.now() + (deadline - clock.monotonic())


def deadline_of(clock: Clock, wall: float) -> float:
    """Unix seconds as a monotonic deadline of this process."""
    return clock.monotonic() + (wall - clock.now())


class OffsetClock:
    """The wall clock plus the seconds written in a file (re-read at most every REREAD seconds; a
    missing file is 0, a half-written one keeps the last value): the coordinator's OffsetClock, the
    agent's own copy."""

    REREAD = 0.05

    def __init__(self, path: "os.PathLike[str] | str") -> None:
        self.path = Path(path)
        self._read_at = -math.inf
        self._offset = 0.0

    def offset(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.REREAD:
            self._read_at = now
            try:
                self._offset = float(self.path.read_text().strip() or 0)
            except FileNotFoundError:
                self._offset = 0.0
            except (OSError, ValueError):
                pass  # half-written or unreadable: keep the last offset
        return self._offset

    def now(self) -> float:
        return time.time() + self.offset()

    def monotonic(self) -> float:
        return time.monotonic()


POINTER = "clock-offset-file"
"""In the agent's work directory: the path of --clock-offset-file, for the supervisors (absent: none)."""


def agent_clock(work_dir: Path, offset_file: str | None) -> Clock:
    """The agent's clock: the host's, or with `offset_file` (--clock-offset-file) the host's plus its
    offset. Leaves (or removes) the pointer its supervisors read, so their stamps move with it."""
    pointer = work_dir / POINTER
    if not offset_file:
        pointer.unlink(missing_ok=True)
        return SystemClock()
    path = Path(offset_file).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(POINTER + ".tmp")
    tmp.write_text(str(path))
    tmp.replace(pointer)
    return OffsetClock(path)


def supervisor_clock(attempt_dir: Path) -> Clock:
    """The clock of the supervisor of the attempt in `attempt_dir` (<work>/attempts/<attempt>): its
    agent's offset file when it has one (agent_clock), else the host's."""
    try:
        path = (attempt_dir.parent.parent / POINTER).read_text().strip()
    except OSError:
        return SystemClock()
    return OffsetClock(path) if path else SystemClock()
