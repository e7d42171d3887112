"""Writes the Events (controllers/events.py) a Job and its Attempts imply, and drops them after a TTL.

Each change of a Job or an Attempt queues its Job; a worker writes the Events not written yet, each a
create under its derived name, so a restart (which loads the names already stored) or a retry writes
none twice. A reconcile looks at the Job itself when its revision moved and at the Attempts that changed
since it last looked (the cache's listener notes them; the first look at a Job takes all of them), never at
the Job's other Attempts: a Job of n
indexes costs each change one Attempt's work, not n (bench/startup.py's indexes/s; ADR 0126). The resync
(at start and every minute) is what looks at every Attempt: an Attempt whose Events were not all written at
its current revision is noted as changed and its Job queued, so a lost trigger or a restart is only late; a
Job whose Events were all written at its and its attempts' current revisions is passed over (ADR 0086).
Events live `ttl` seconds after they happened, as kube-apiserver's --event-ttl (1 h).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import orjson

from ..clock import Clock, parse
from ..errors import NodusError
from ..store.base import Store
from . import events
from .cache import ATTEMPTS, JOBS, Cache, owner_of
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.events")

PREFIX = "events/"
"""Events' keys: events/<project>/<name>, where the resource service reads core v1 Events."""
EVENT_TTL = 3600.0
RESYNC_SECONDS = 60.0
SWEEP_SECONDS = 60.0
WORKERS = 8
"""Jobs whose Events are written at once: each waits for its creates' commit, so more in flight share one
group commit (with 2, a burst of 10,000 Jobs left the recorder minutes behind: bench/fleet.py, ADR 0086)."""


def event_key(project: str, name: str) -> str:
    return f"{PREFIX}{project}/{name}"


class EventRecorder:
    def __init__(self, cache: Cache, store: Store, clock: Clock, *, ttl: float = EVENT_TTL,
                 workers: int = WORKERS) -> None:
        self.cache, self.store, self.clock, self.ttl, self.workers = cache, store, clock, ttl, workers
        self.queue: WorkQueue[str] = WorkQueue()
        self._written: dict[str, float] = {}
        """The key of every stored Event and when it happened (its TTL counts from then)."""
        self._done: dict[str, int] = {}
        """Job or Attempt key → the revision (resourceVersion) at which every Event it implies was written (or
        had expired)."""
        self._changed: dict[str, set[str]] = {}
        """Job key → the keys of its Attempts that changed (or that the resync found not written out) since its
        last reconcile looked at them: what the next one looks at."""
        cache.listen(JOBS, self._on_job)
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            self._done.pop(key, None)
            self._changed.pop(key, None)
        self.queue.add(key)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new or old
        if obj is None:
            return
        project, job = owner_of(obj)
        jkey = f"{JOBS}{project}/{job}"
        if new is None:
            self._done.pop(key, None)
            changed = self._changed.get(jkey)
            if changed is not None:
                changed.discard(key)  # gone: no Event of it is written any more
        else:
            self._changed.setdefault(jkey, set()).add(key)
        self.queue.add(jkey)

    async def run(self) -> None:
        await self.cache.synced.wait()
        await self._load()
        sweeper = asyncio.create_task(self._sweep_loop(), name="events-ttl")
        try:
            await run_workers(self.queue, self.reconcile, workers=self.workers, resync=self.resync,
                              resync_seconds=RESYNC_SECONDS, log=log, name="events")
        finally:
            sweeper.cancel()

    async def _load(self) -> None:
        result = await self.store.list(PREFIX)
        for rec in result.records:
            obj = orjson.loads(rec.value)
            self._written[rec.key] = parse(obj.get("lastTimestamp")) or self.clock.now()

    def resync(self) -> None:
        """Queues every Job with an Event not written at its or an attempt's current revision, noting those
        attempts as changed: a Job written out costs a comparison of revisions."""
        done = self._done
        for key, _ in self.cache.under(JOBS):
            version = self.cache.revision(key)
            project, name = key[len(JOBS):].split("/", 1)
            behind = [a for a, v in self.cache.attempt_revisions(project, name).items() if done.get(a) != v]
            if behind:
                self._changed.setdefault(key, set()).update(behind)
            if behind or version is None or done.get(key) != version:
                self.queue.add(key)

    async def reconcile(self, key: str) -> None:
        job = self.cache.get(key)
        if job is None:
            self._changed.pop(key, None)
            return
        project, name = key[len(JOBS):].split("/", 1)
        version = self.cache.revision(key)
        changed = self._changed.pop(key, set())
        if key not in self._done:  # the first look at this Job (since the recorder started): every attempt of it
            changed.update(self.cache.attempt_revisions(project, name))
        if version is None or self._done.get(key) != version:
            await self._write(project, job, events.of_job(job))
            if version is not None:
                self._done[key] = version
        order = sorted(changed)  # by name, as the Events of a Job's attempts are written
        for i, akey in enumerate(order):
            try:
                attempt, version = self.cache.get(akey), self.cache.revision(akey)
                if attempt is None or (version is not None and self._done.get(akey) == version):
                    continue
                await self._write(project, job, events.of_attempt(attempt))
                if version is not None:
                    self._done[akey] = version
            except BaseException:
                self._changed.setdefault(key, set()).update(order[i:])  # looked at again when the Job is retried
                raise

    async def _write(self, project: str, job: dict[str, Any], happened: list[events.Happened]) -> None:
        """Creates the Events not written yet, all at once: one group commit takes them (a Job's burst of
        Events, written one after the other, kept the recorder minutes behind a burst of Jobs)."""
        now = self.clock.now()
        todo: dict[str, float] = {}
        bodies = []
        for h in happened:
            ekey = event_key(project, events.event_name(job, h))
            at = parse(h.time) or now
            if ekey in self._written or ekey in todo or at + self.ttl <= now:
                continue
            todo[ekey] = at
            bodies.append(self._create(ekey, orjson.dumps(events.event(job, h, str(uuid.uuid4())))))
        await asyncio.gather(*bodies)
        self._written.update(todo)

    async def _create(self, key: str, value: bytes) -> None:
        try:
            await self.store.create(key, value)
        except NodusError as e:
            if e.reason != "AlreadyExists":
                raise

    async def sweep(self) -> int:
        """Deletes the Events older than the TTL; returns how many."""
        cutoff = self.clock.now() - self.ttl
        expired = [key for key, at in self._written.items() if at <= cutoff]
        for key in expired:
            try:
                await self.store.delete(key)
            except NodusError as e:
                if e.reason != "NotFound":
                    raise
            self._written.pop(key, None)
        return len(expired)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next sweep retries
                log.exception("deleting expired events failed")
