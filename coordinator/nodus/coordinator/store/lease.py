"""Leases in the store, and the fence a leader's writes carry (docs/adr/0043-leader-lease-and-fencing.md).

A lease is a named row (`lease(name, holder, epoch, expires)`): one holder at a time, for a duration
the holder renews. Every takeover (a new holder after the old one's lease ran out) raises the epoch,
so an epoch names one holder's term. A write made under a `Fence` (set in the writing task's context,
`FENCE`) commits only while the named lease still has that epoch: the engine checks it in the write's
own transaction (PostgreSQL) or under the one process that owns the data dir (SQLite), so a deposed
holder's write is refused by the store, whatever the deposed process still believes.

Why a context variable, not a parameter: a controller writes through several services (the Objects
CAS writes, the resource service's Job status, the ledger, the event recorder), and every one of them
is a fenced write when, and only when, a controller task makes it. The leader starts each controller
task in a context holding its fence (plane.py); tasks they spawn inherit it; REST and gRPC handlers and
agent streams run in contexts without one, so clients' and agents' writes are never fenced.
"""
from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass

from ..errors import NodusError

CONTROLLERS = "controllers"
"""The lease whose holder runs the controllers."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as the store last saw it."""

    name: str
    holder: str
    epoch: int
    remaining: float
    """Seconds until it runs out, by the store's clock (<= 0: it ran out and may be taken over)."""


@dataclass(frozen=True, slots=True)
class Fence:
    """A write under this fence commits only while lease `lease` is at `epoch`."""

    lease: str
    epoch: int


FENCE: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("nodus_store_fence", default=None)


def deposed(fence: Fence, current: int | None) -> NodusError:
    now = "no longer exists" if current is None else f"is at epoch {current}"
    return NodusError("LeaderDeposed", f"this replica's {fence.lease} lease (epoch {fence.epoch}) {now}: "
                                       "another replica leads now, so this controller write was refused")


class LocalLeases:
    """The lease table of a store one process owns (SQLite): on this process's monotonic clock."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, int, float]] = {}  # name -> (holder, epoch, expires)

    def claim(self, name: str, holder: str, duration: float) -> Lease:
        now = time.monotonic()
        row = self._rows.get(name)
        if row is None:
            row = (holder, 1, now + duration)
        elif row[0] == holder:
            row = (holder, row[1], now + duration)
        elif row[2] <= now:
            row = (holder, row[1] + 1, now + duration)
        self._rows[name] = row
        return Lease(name, row[0], row[1], row[2] - now)

    def read(self, name: str) -> Lease | None:
        row = self._rows.get(name)
        return None if row is None else Lease(name, row[0], row[1], row[2] - time.monotonic())

    def release(self, name: str, holder: str) -> None:
        row = self._rows.get(name)
        if row is not None and row[0] == holder:
            self._rows[name] = (holder, row[1], time.monotonic())

    def check(self, fence: Fence) -> None:
        row = self._rows.get(fence.lease)
        current = None if row is None else row[1]
        if current != fence.epoch:
            raise deposed(fence, current)
