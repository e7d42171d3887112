"""A controller-level harness for the Job controller: a real SQLite store, the watch-fed cache, `Objects`, the
`JobController` and a `ManualClock`, with the controller's queue drained by hand (no workers, no resync loop),
so a test sees exactly which keys a trigger or a resync queues and how many decisions they cost.

The agents' side is played with the same mutations the coordinator applies (placement's `bind`, the
streams' `fold_report`), written through `Objects` as the real paths write them. `decisions` counts the
calls of `job.decide` the controller makes (`count_decisions` patches the name the controller calls).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers import job_controller
from nodus.coordinator.controllers.attempts import AttemptPhase, Report, fold_report
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.job_controller import JobController
from nodus.coordinator.controllers.objects import Objects, new_uid
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.errors import NodusError
from nodus.coordinator.scheduler import Placement
from nodus.coordinator.status_write import write_status
from nodus.coordinator.store import SqliteStore

PROJECT = "default"
_JOBS = resolve("jobs")


class StoreJobWriter:
    """The resource service's JobWriter over the store alone: the same compare-and-swap status write."""

    def __init__(self, store: SqliteStore, objects: Objects) -> None:
        self.store, self.objects = store, objects

    async def write_job_status(self, project: str, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return await write_status(self.store, _JOBS, project, job, status,
                                  lambda info, name: NodusError("Conflict", f"Job {name} changed"),
                                  lambda info, name: NodusError("NotFound", f"Job {name} not found"))

    async def delete_job(self, project: str, name: str) -> None:
        if not await self.objects.delete(job_key(project, name)):
            raise NodusError("NotFound", f"Job {name} not found")


class JobHarness:
    def __init__(self, store: SqliteStore, cache: Cache, objects: Objects, clock: ManualClock) -> None:
        self.store, self.cache, self.objects, self.clock = store, cache, objects, clock
        self.controller = JobController(cache, objects, StoreJobWriter(store, objects), clock, workers=1)
        self.decisions = 0

    @classmethod
    async def open(cls, path: Path) -> "JobHarness":
        store = await SqliteStore.open(path / "store.db")
        cache = Cache(store)
        await cache.start()
        return cls(store, cache, Objects(store, cache), ManualClock())

    async def close(self) -> None:
        self.controller.queue.close()
        await self.cache.stop()
        await self.store.close()

    def count_decisions(self, monkeypatch: Any) -> None:
        """Counts every `decide` the controller makes from here on."""
        real = job_controller.decide

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.decisions += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(job_controller, "decide", counted)

    # -- the world --------------------------------------------------------------------------------
    async def create_job(self, name: str, **spec: Any) -> None:
        body = {"completions": 1, "parallelism": 1, "command": ["true"], **spec}
        job = {"apiVersion": "nodus.dev/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": PROJECT, "uid": new_uid(), "generation": 1}, "spec": body}
        await self.objects.create(job_key(PROJECT, name), job)

    def job(self, name: str) -> dict[str, Any] | None:
        return self.cache.job(PROJECT, name)

    def attempts(self, name: str) -> list[str]:
        return [a["metadata"]["name"] for a in self.cache.attempts_of(PROJECT, name)]

    async def mutate_attempt(self, name: str, mutation: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        await self.objects.mutate(attempt_key(PROJECT, name), mutation)

    async def run_to(self, attempt: str, phase: AttemptPhase, **fields: Any) -> None:
        """Places the attempt (if it is not) and folds an agent's report of `phase` into it."""
        now = self.clock.now()
        await self.mutate_attempt(attempt, bind(Placement("n1", explain="n1: the only fitting node"), now))

        def report(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = fold_report(obj, Report(phase=phase, time=now, **fields), now)
            return None if status is None else {**obj, "status": status}
        await self.mutate_attempt(attempt, report)

    # -- the controller ---------------------------------------------------------------------------
    async def caught_up(self) -> None:
        """Waits until the cache's watch has delivered every write the store committed."""
        for _ in range(1000):
            await asyncio.sleep(0)
            if all(self.cache.holds(k, r) for k, r in await self._latest()):
                return
        raise AssertionError("the cache did not catch up with the store")

    async def _latest(self) -> list[tuple[str, int]]:
        out = []
        for prefix in ("jobs/", "attempts/"):
            out += [(rec.key, rec.revision) for rec in (await self.store.list(prefix)).records]
        return out

    async def drain(self) -> list[str]:
        """Reconciles every queued key (and what that queues) until the queue is empty: the keys reconciled."""
        done: list[str] = []
        for _ in range(100):
            await self.caught_up()
            if not len(self.controller.queue):
                return done
            key = await self.controller.queue.get()
            try:
                await self.controller.reconcile(key)
            finally:
                self.controller.queue.done(key)
            done.append(key)
        raise AssertionError(f"the queue did not drain: {done[-10:]}")

    def queued(self) -> int:
        return len(self.controller.queue)
