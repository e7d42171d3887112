"""Time, injected: the agent reads it through a `Clock` wherever a decision depends on it.

Leases, backoff, checkpoint deadlines, progress rate limits and timeouts read `monotonic()` (a
duration never jumps with the wall clock); what is reported or persisted (an attempt's times, a
lease's expiry across a restart) reads `now()`. Tests pass a clock they move by hand (the pure
core in decisions.py takes `now` as a value and needs no clock at all). The agent never imports
the coordinator's clock (the layers forbid it); this is the agent's own.
"""
from __future__ import annotations

import time
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
