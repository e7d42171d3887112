"""Node leases: an expired lease makes its node NotReady and its attempts Lost (reason NodeLost).

Level-triggered on the injected clock: every tick compares each lease with `now`, marks a lease
that ran out `expired` (so the grace a restarted coordinator gives leases no longer applies to it),
and sweeps every non-terminal attempt on a node whose lease is expired into Lost. The Job controller
then replaces them, counted against recovery.maxAttempts. A heartbeat of the node's session renews
the lease again (the node comes back Ready); the agent stream then cancels the attempts that were
replaced meanwhile, so nothing runs twice. A lease is read through the registry, which renews the
stored one with the heartbeats a stream on this replica heard (ADR 0049): a node connected here and
beating is never expired for a renewal write that has not landed yet.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..clock import rfc3339
from .attempt_machine import NodeLost, Refusal, phase_of, transition
from . import replicas
from .cache import LEASES, attempt_key
from .replicas import grace
from .objects import Objects

log = logging.getLogger("nodus.controllers.lease")


def lost(node: str, now: float) -> Any:
    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = transition(obj, NodeLost(node, now))
        if isinstance(status, Refusal):
            return None  # ended meanwhile, or placed elsewhere: nothing to mark
        obj["status"] = status
        return obj
    return mutate


class LeaseController:
    def __init__(self, registry: Any, objects: Objects) -> None:
        self.registry = registry
        self.objects = objects

    @property
    def tick_seconds(self) -> float:
        duration: float = self.registry.leases.duration
        return max(0.05, min(1.0, duration / 5))

    async def run(self) -> None:
        await self.registry.cache.synced.wait()
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep checking; the next tick retries
                log.exception("lease check failed")
            await asyncio.sleep(self.tick_seconds)

    async def check(self) -> list[str]:
        """One pass; returns the nodes whose lease expired in it."""
        leases = self.registry.leases
        now = leases.clock.now()
        expired_now = []
        held: bool | None = None  # what the replicas' records say, read once a pass and only when a lease is due
        for name in self.registry.names():
            if self.registry.alive(name, now):
                continue  # a stream here heard it within the lease: its lease holds, nothing of it is Lost
            lease = self.registry.lease(name)
            due = lease is not None and not lease.get("expired") and now >= leases.expiry(lease)
            if due and held is None:
                held = await self._replica_grace(now)
            if due and not held and lease is not None and now >= leases.expiry(lease):
                def expire(doc: dict[str, Any]) -> dict[str, Any] | None:
                    if doc.get("expired") or now < leases.expiry(doc) or self.registry.alive(name):
                        return None  # renewed meanwhile, in the store or by a heartbeat heard here
                    doc.update(expired=True, expiredTime=rfc3339(now))
                    return doc
                if await self.objects.mutate(LEASES + name, expire) is not None:
                    expired_now.append(name)
                    log.warning("node %s: lease expired; its attempts are Lost", name)
                lease = self.registry.lease(name)
            if lease is None or lease.get("expired"):
                for attempt in self.registry.cache.attempts_on(name):
                    if not phase_of(attempt).terminal:
                        key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])
                        await self.objects.mutate(key, lost(name, now))
        return expired_now

    async def _replica_grace(self, now: float) -> bool:
        """Reads the replicas' records from the store (ADR 0098): True while one is starting (no lease runs
        out); otherwise extends the leases' grace to the newest serving time that still gives one. Deletes
        the records whose grace is over."""
        leases = self.registry.leases
        found = grace(await replicas.read(self.objects.store), leases.duration, now)
        for key in found.stale:
            await replicas.withdraw(self.objects.store, key)
        if found.since is not None:
            leases.extend(found.since)
        return found.hold
