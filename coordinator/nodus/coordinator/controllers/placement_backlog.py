"""Placement before admission: a Job create waits while the Jobs admitted before it are still on their way
to a placement decision (docs/adr/0075).

One event loop runs the REST creates and the pipeline behind them (the Job controller makes each Job's
attempt, placement binds it, the node's stream sends the assignment). In a burst of creates the loop is
shared evenly, so when creates arrive faster than the pipeline turns them into assignments, every Job
admitted waits behind all those admitted before it: bench/fleet.py's 2,000 creates at 211/s against 105
placements/s put 5-8 s between a 201 and the assignment. Here the creates wait instead, before any of
their work: while `limit` Jobs are in flight (admitted, no attempt of theirs decided yet), a new Job
create waits for one of them to be decided. So the pipeline runs ahead of admission, and the time from a
201 to its assignment stays what `limit` Jobs take to place; a burst's creates take as long as the
placements do, which is what they cost anyway.

Honest: a 201 still means the Job is durably stored (nothing is accepted into a queue in memory); a
waiting create has not been admitted, and its client sees a slower create, not a lost one.

In flight, from the watch-fed cache (so every replica sees the same backlog, whichever one admits): a
Job that appeared after the cache synced, not finished, until an attempt of its is decided (bound to a
node, or given a placement explain: it waits for capacity, which is no longer the pipeline's delay), it
ends or goes away, or `patience` passes (a Job that gets no attempt now: suspended, waiting for its inputs'
producers). A create never waits longer than `patience`.
"""
from __future__ import annotations

import asyncio
import collections
import time
from contextlib import AbstractAsyncContextManager
from typing import Any, Callable

from .attempt_machine import phase_of
from .cache import ATTEMPTS, JOBS, Cache, job_key, owner_of
from .views import JobPhase

LIMIT = 16
"""Jobs in flight before a create waits (0: never; a coordinator with --controllers off sets it so)."""
PATIENCE_SECONDS = 5.0
"""How long a Job counts as in flight at most, and so the longest a create waits."""
LOOK_SECONDS = 0.5
"""How often the waiting creates are looked at again without a leave (stale Jobs, patience)."""


def _decided(attempt: dict[str, Any] | None) -> bool:
    """Placement decided the attempt: bound to a node, waiting for capacity with its explain, or ended."""
    if attempt is None:
        return False
    spec, status = attempt.get("spec") or {}, attempt.get("status") or {}
    return bool(spec.get("node")) or bool((status.get("placement") or {}).get("explain")) or phase_of(attempt).terminal


class PlacementBacklog:
    def __init__(self, cache: Cache, limit: int = LIMIT, patience: float = PATIENCE_SECONDS,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.cache, self.limit, self.patience, self._now = cache, limit, patience, now
        self._flight: dict[str, float] = {}
        """Job key → when it was admitted (`now()`)."""
        self._admitting = 0
        """Creates let through and not answered yet (their Jobs may not be in the cache yet)."""
        self._waiting: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()
        """The creates waiting for room, (their patience's end, their future), first come first woken: a Job that
        leaves wakes one of them (one Event woke every waiter on every leave, and each armed a timer again: 5.7 %
        of the loop in a burst)."""
        self._look: asyncio.TimerHandle | None = None
        """The one timer that looks again every LOOK_SECONDS while creates wait: a stale Job's slot
        frees without a leave, and a waiter past its patience goes in. Each waiter had a timeout of its own."""
        self.waited = 0
        """How many creates waited (what the gate costs shows here)."""
        cache.listen(JOBS, self._on_job)
        cache.listen(ATTEMPTS, self._on_attempt)

    def __len__(self) -> int:
        return len(self._flight)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        phase = JobPhase.parse(((new or {}).get("status") or {}).get("phase"))
        finished = new is None or phase.terminal or phase is JobPhase.SUSPENDED
        if old is None and not finished and self.limit and self.cache.synced.is_set():
            meta = (new or {}).get("metadata") or {}
            # A Job created with its first attempts in one commit (ADR 0108): the cache's watch of attempts may
            # apply them before its watch of Jobs applies the Job (another replica's create, ADR 0118). Then
            # it was decided before it appeared, and counting it would hold a slot for `patience`.
            if not any(_decided(a) for a in self.cache.attempts_of(meta.get("namespace", ""), meta.get("name", ""))):
                self._flight[key] = self._now()
        elif finished:
            self._leave(key)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if self._flight and (new is None or _decided(new)):
            self._leave(job_key(*owner_of(new or old)))  # type: ignore[arg-type]

    def _leave(self, key: str) -> None:
        if self._flight.pop(key, None) is not None:
            self._pass_on()

    def _full(self) -> bool:
        if len(self._flight) + self._admitting < self.limit:
            return False
        stale = self._now() - self.patience
        for key in [k for k, t in self._flight.items() if t < stale]:
            del self._flight[key]
        return len(self._flight) + self._admitting >= self.limit

    def _pass_on(self) -> None:
        while self._waiting:
            _, waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _looked(self) -> None:
        """Every LOOK_SECONDS while creates wait: those past their patience go in, and room a stale Job held
        (`_full` forgets it) goes to the first in line."""
        self._look = None
        now = self._now()
        for deadline, waiter in self._waiting:
            if deadline <= now and not waiter.done():
                waiter.set_result(None)
        if self._waiting and not self._full():
            self._pass_on()
        self._waiting = collections.deque(w for w in self._waiting if not w[1].done())
        if self._waiting:
            self._look = asyncio.get_running_loop().call_later(LOOK_SECONDS, self._looked)

    def admitting(self) -> "Admission":
        """Around a Job create (`async with`): waits (at most `patience`) while `limit` Jobs are in flight or
        being admitted, then counts the create as being admitted until it is answered."""
        return Admission(self)

    async def _wait(self) -> None:
        self.waited += 1
        deadline = self._now() + self.patience
        again = False
        loop = asyncio.get_running_loop()
        while self._full() and deadline > self._now():
            waiter = loop.create_future()
            if again:
                self._waiting.appendleft((deadline, waiter))  # looked and found no room yet: still first in line
            else:
                self._waiting.append((deadline, waiter))
            again = True
            if self._look is None:
                self._look = loop.call_later(LOOK_SECONDS, self._looked)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._pass_on()  # woken and then cancelled: the room it was given goes to the next
                raise


class Admission(AbstractAsyncContextManager[None]):
    """`PlacementBacklog.admitting()`'s context (a class, not an async generator: one per create)."""

    __slots__ = ("_backlog",)

    def __init__(self, backlog: PlacementBacklog) -> None:
        self._backlog = backlog

    async def __aenter__(self) -> None:
        backlog = self._backlog
        if backlog.limit and backlog._full():
            await backlog._wait()
        backlog._admitting += 1

    async def __aexit__(self, *exc: object) -> bool | None:
        backlog = self._backlog
        backlog._admitting -= 1
        if backlog._waiting and not backlog._full():
            backlog._pass_on()  # its Job was decided before its answer (or never came): room for the next
        return None
