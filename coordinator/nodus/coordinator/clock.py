"""Time, injected: every timeout, TTL, lease and queue limit reads the coordinator's `Clock`.

Why a clock object instead of `time.time()`: the decisions that depend on time (a Job's deadline,
its TTL, a node's lease, how long an attempt has queued) are pure functions of `now`, and tests step
a `ManualClock` instead of sleeping. Times are float Unix seconds inside the coordinator and RFC 3339
strings in stored objects; the two helpers here convert between them, at millisecond precision, so
a deadline of two seconds survives a round trip through the store.
"""
from __future__ import annotations

import functools
import math
import os
import time
from datetime import datetime, timezone
from typing import Protocol

from .api import units


class Clock(Protocol):
    """Where the coordinator reads the time."""

    def now(self) -> float:
        """Unix seconds."""
        ...


class SystemClock:
    """The wall clock (what a running coordinator uses)."""

    def now(self) -> float:
        return time.time()


class OffsetClock:
    """The wall clock plus the seconds written in a file (re-read at most every REREAD seconds): drills
    and integration tests move a running coordinator's time forward without waiting."""

    REREAD = 0.05
    """Often enough for a test that writes and then waits; rarely enough to cost nothing. (A stat of
    the file would miss two writes of the same length within one tick of the filesystem's clock.)"""

    def __init__(self, path: "os.PathLike[str] | str") -> None:
        self.path = path
        self._read_at = -math.inf
        self._offset = 0.0

    def offset(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= self.REREAD:
            self._read_at = now
            try:
                with open(self.path) as f:
                    self._offset = float(f.read().strip() or 0)
            except FileNotFoundError:
                self._offset = 0.0
            except (OSError, ValueError):
                pass  # half-written or unreadable: keep the last offset
        return self._offset

    def now(self) -> float:
        return time.time() + self.offset()


class ManualClock:
    """A clock that moves only when told to: for tests of time-based decisions."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


def rfc3339(t: float, *, precise: bool = False) -> str:
    """Unix seconds as RFC 3339 UTC, with milliseconds (microseconds if `precise`) only when there are any.

    `precise` is for agent clock readings that order reports, where two lines a millisecond apart
    must still compare in order.
    """
    if precise:
        return units.format_time(datetime.fromtimestamp(t, timezone.utc))
    # What datetime.fromtimestamp(round(t, 3)) and units.format_time give, at a fifth of their cost: a
    # decision formats a few times per Job, and each cell of a Sweep is decided two or three times.
    r = round(t, 3)
    whole = math.floor(r)
    micro = round((r - whole) * 1e6)
    if micro >= 1_000_000:
        whole, micro = whole + 1, micro - 1_000_000
    milli = micro // 1000
    return f"{whole_seconds(whole)}.{milli:03d}".rstrip("0") + "Z" if milli else whole_seconds(whole) + "Z"


@functools.lru_cache(maxsize=1024)
def whole_seconds(t: int) -> str:
    """Unix seconds as RFC 3339 UTC without the zone: the seconds a controller writes repeat by the hundred."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def parse(text: object) -> float | None:
    """An RFC 3339 string as Unix seconds; None for anything else (absent or malformed)."""
    if not isinstance(text, str) or not text:
        return None
    return _parse(text)


@functools.lru_cache(maxsize=8192)
def _parse(text: str) -> float | None:
    """Memoized: the controllers' views parse the same few times (a creation, a condition's transition)
    on every decision, and a 10,000-cell Sweep makes 30,000 of them."""
    try:
        return units.parse_time(text).timestamp()
    except ValueError:
        return None


def seconds(duration: object) -> float | None:
    """A Go duration string as seconds; None when absent or malformed."""
    if not isinstance(duration, str) or not duration:
        return None
    return _seconds(duration)


@functools.lru_cache(maxsize=1024)
def _seconds(duration: str) -> float | None:
    """Memoized as `_parse` is: a view reads a Job's few durations on every decision."""
    try:
        return units.parse_duration_ns(duration) / units.NS_PER_SECOND
    except ValueError:
        return None


def duration(secs: float) -> str:
    """Seconds as a Go duration string, at millisecond precision (`1m30.5s`)."""
    return units.format_duration(int(round(secs * 1000)) * 1_000_000)
