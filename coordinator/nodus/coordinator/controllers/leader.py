"""Which replica runs the controllers: the holder of the store's `controllers` lease
(docs/adr/0043-leader-lease-and-fencing.md).

Every replica claims the lease every `renew_interval`, each claim its own short transaction (so it
works through a connection pooler; no advisory locks). The holder renews it; the others see who holds
it and take it over once it runs out, which raises its epoch. A replica that wins starts the
controllers under a fence of the epoch it won (`lead`); one that loses it (a renewal refused, failed,
or slower than the renew interval, or a higher epoch) stops them at once (`abdicate`) and claims
again on the next tick. Stopping is a courtesy: the fence is what makes a deposed leader harmless,
since the store refuses every controller write whose epoch moved.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
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


class Leadership:
    def __init__(self, store: Store, settings: LeaderSettings, lead: Callable[[Fence], Awaitable[None]],
                 abdicate: Callable[[], Awaitable[None]], holder: str | None = None) -> None:
        if not 0 < settings.renew_interval <= settings.duration / 2:
            raise ValueError(f"the renew interval ({settings.renew_interval}s) must be positive and at most half "
                             f"the leader lease ({settings.duration}s)")
        self.store = store
        self.settings = settings
        self.holder = holder or holder_id()
        self._lead, self._abdicate = lead, abdicate
        self.fence: Fence | None = None
        """The fence of the term this replica leads; None while it follows."""
        self.seen: Lease | None = None
        """The lease as the last claim returned it (who leads, at which epoch)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def role(self) -> str:
        return "leader" if self.fence is not None else "follower"

    @property
    def epoch(self) -> int:
        return self.seen.epoch if self.seen is not None else 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leadership")

    async def stop(self) -> None:
        """Stops claiming; a leader stops its controllers and lets its lease run out now."""
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self.fence is not None:
            await self._lose("stopping")
            try:
                async with asyncio.timeout(self.settings.renew_interval):
                    await self.store.release_lease(CONTROLLERS, self.holder)
            except Exception as e:  # noqa: BLE001 - the lease then runs out by itself
                log.warning("could not release the controllers' lease: %s", e)

    async def tick(self) -> None:
        """One claim, and the start or stop of the controllers it calls for."""
        try:
            async with asyncio.timeout(self.settings.renew_interval):
                lease = await self.store.claim_lease(CONTROLLERS, self.holder, self.settings.duration)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the store is unreachable or slow: follow until it answers
            if self.fence is not None:
                await self._lose(f"the renewal failed: {e or type(e).__name__}")
            else:
                log.warning("cannot claim the controllers' lease: %s", e or type(e).__name__)
            return
        self.seen = lease
        LEASE_EPOCH.set(lease.epoch)
        if lease.holder != self.holder:
            if self.fence is not None:
                await self._lose(f"{lease.holder} holds it at epoch {lease.epoch}")
            return
        if self.fence is not None and self.fence.epoch != lease.epoch:
            await self._lose(f"the epoch moved to {lease.epoch}")
        if self.fence is None:
            self.fence = Fence(CONTROLLERS, lease.epoch)
            LEADER.set(1)
            LEASE_CHANGES.labels("acquired").inc()
            log.info("leading the controllers at epoch %d (holder %s)", lease.epoch, self.holder)
            await self._lead(self.fence)

    async def _lose(self, why: str) -> None:
        assert self.fence is not None
        log.warning("no longer leading the controllers (epoch %d): %s", self.fence.epoch, why)
        self.fence = None
        LEADER.set(0)
        LEASE_CHANGES.labels("lost").inc()
        await self._abdicate()

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
