"""Which replica runs the controllers: the holder of the store's `controllers` lease
(docs/adr/0043-leader-lease-and-fencing.md, docs/adr/0110-a-renewal-off-the-loop-and-off-the-fences-lock.md).

Every replica claims the lease every `renew_interval`, each claim its own short transaction (so it
works through a connection pooler; no advisory locks). The holder renews it; the others see who holds
it and take it over once it runs out, which raises its epoch. A replica that wins starts the
controllers under a fence of the epoch it won (`lead`); it stops them (`abdicate`) when a claim shows
another holder or a higher epoch, or when the lease it last renewed runs out before a renewal answers.
A renewal that is slow or fails does not stop a leader whose lease is still valid: on a busy host that
is what made leadership change hands while the fleet was busy (ADR 0110). Stopping is a courtesy: the
fence is what makes a deposed leader harmless, since the store refuses every controller write whose
epoch moved.

`decide` is the pure part: the term this replica leads (if any), a claim's answer (or none yet), and
the clock in; what to stop and start out. `Leadership` sends the claims and carries the decisions out.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..metrics import LEADER, LEASE_CHANGES, LEASE_EPOCH
from ..store.base import Store
from ..store.lease import CONTROLLERS, Fence, Lease
from ..stopping import cancel_and_wait

log = logging.getLogger("nodus.leader")


def holder_id() -> str:
    """This process's name in the lease: host, pid and a nonce (a restarted replica is a new holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    duration: float = 10.0
    """How long a won or renewed lease lasts (`--leader-lease`)."""
    renew_interval: float = 2.0
    """How often every replica claims it (`--leader-renew-interval`); under half the duration."""


@dataclass(frozen=True, slots=True)
class Term:
    """The term this replica leads: its fence, and until when its lease surely holds by this clock."""

    fence: Fence
    valid_until: float


@dataclass(frozen=True, slots=True)
class Answer:
    """A claim's answer, and when (by this clock) the claim was sent: the store's clock gave the lease
    `lease.remaining` seconds at some moment after `sent`, so it holds at least until `sent + remaining`."""

    lease: Lease | None
    sent: float
    error: str = ""
    """Why the claim failed (lease is None)."""


@dataclass(frozen=True, slots=True)
class Decision:
    term: Term | None
    """The term held after this step (None: follow)."""
    stop: str = ""
    """Why the controllers of the term held until now stop ("": they do not)."""
    start: bool = False
    """Whether controllers start under `term.fence` (a term won, or won again after a stop)."""


def decide(holder: str, term: Term | None, answer: Answer | None, now: float) -> Decision:
    """The next step of the leadership: `answer` None while the claim has not answered yet."""
    if answer is None or answer.lease is None:
        if term is not None and now >= term.valid_until:
            why = "no renewal answered" if answer is None else f"the renewal failed ({answer.error})"
            return Decision(None, f"{why} before the lease ran out")
        return Decision(term)
    lease = answer.lease
    valid_until = answer.sent + lease.remaining
    if lease.holder != holder:
        return Decision(None, f"{lease.holder} holds it at epoch {lease.epoch}" if term else "")
    if valid_until <= now:  # the answer came after the lease it renewed ran out: another may hold it now
        return Decision(None, "the renewal answered after the lease ran out" if term else "")
    won = Term(Fence(CONTROLLERS, lease.epoch), valid_until)
    if term is None:
        return Decision(won, start=True)
    if term.fence.epoch != lease.epoch:
        return Decision(won, f"the epoch moved to {lease.epoch}", start=True)
    return Decision(won)


class Leadership:
    def __init__(self, store: Store, settings: LeaderSettings, lead: Callable[[Fence], Awaitable[None]],
                 abdicate: Callable[[], Awaitable[None]], holder: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < settings.renew_interval <= settings.duration / 2:
            raise ValueError(f"the renew interval ({settings.renew_interval}s) must be positive and at most half "
                             f"the leader lease ({settings.duration}s)")
        self.store = store
        self.settings = settings
        self.holder = holder or holder_id()
        self._lead, self._abdicate = lead, abdicate
        self._clock = clock
        self.term: Term | None = None
        """The term this replica leads; None while it follows."""
        self.seen: Lease | None = None
        """The lease as the last claim returned it (who leads, at which epoch)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def fence(self) -> Fence | None:
        """The fence of the term this replica leads; None while it follows."""
        return self.term.fence if self.term is not None else None

    @property
    def role(self) -> str:
        return "leader" if self.term is not None else "follower"

    @property
    def epoch(self) -> int:
        return self.seen.epoch if self.seen is not None else 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leadership")

    async def stop(self) -> None:
        """Stops claiming; a leader stops its controllers and lets its lease run out now."""
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self.term is not None:
            await self._apply(Decision(None, "stopping"))
            try:
                async with asyncio.timeout(self.settings.renew_interval):
                    await self.store.release_lease(CONTROLLERS, self.holder)
            except Exception as e:  # noqa: BLE001 - the lease then runs out by itself
                log.warning("could not release the controllers' lease: %s", e)

    async def tick(self) -> None:
        """One claim, and the start or stop of the controllers it calls for. While the claim has not
        answered, a leader re-decides every renew interval and stops only once its lease ran out."""
        sent = self._clock()
        claim = asyncio.ensure_future(self.store.claim_lease(CONTROLLERS, self.holder, self.settings.duration))
        try:
            while True:
                wait = self.settings.renew_interval
                if self.term is not None:
                    wait = min(wait, max(0.0, self.term.valid_until - self._clock()))
                done, _ = await asyncio.wait({claim}, timeout=wait)
                answer = self._answer(claim, sent) if done else None
                await self._apply(decide(self.holder, self.term, answer, self._clock()))
                if done:
                    return
        finally:
            if not claim.done():
                claim.cancel()

    def _answer(self, claim: asyncio.Future[Lease], sent: float) -> Answer:
        error = claim.exception()
        if isinstance(error, Exception):
            if self.term is None:
                log.warning("cannot claim the controllers' lease: %s", error or type(error).__name__)
            else:
                log.warning("the controllers' lease renewal failed (the lease still holds): %s", error)
            return Answer(None, sent, str(error) or type(error).__name__)
        if error is not None:
            raise error
        lease = claim.result()
        self.seen = lease
        LEASE_EPOCH.set(lease.epoch)
        return Answer(lease, sent)

    async def _apply(self, decision: Decision) -> None:
        if decision.stop:
            assert self.term is not None
            log.warning("no longer leading the controllers (epoch %d): %s", self.term.fence.epoch, decision.stop)
            self.term = None
            LEADER.set(0)
            LEASE_CHANGES.labels("lost").inc()
            await self._abdicate()
        self.term = decision.term
        if decision.start:
            assert decision.term is not None
            LEADER.set(1)
            LEASE_CHANGES.labels("acquired").inc()
            log.info("leading the controllers at epoch %d (holder %s)", decision.term.fence.epoch, self.holder)
            await self._lead(decision.term.fence)

    async def _run(self) -> None:
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - starting or stopping the controllers failed: the next tick retries
                log.exception("the leadership tick failed")
            elapsed = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(0.0, self.settings.renew_interval - elapsed))
