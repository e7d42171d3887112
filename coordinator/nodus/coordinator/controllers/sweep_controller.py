"""The Sweep controller's executor: runs `sweep.decide_sweep` for a Sweep and performs what it says.

Cells are created through the resource service as the system, so a cell is admitted exactly as a Job
a customer creates (validation, defaults, image digests, estimate); a cell that exists already (a
restart, a second pass) answers AlreadyExists and is left alone, since its name is deterministic.
Cell states are set with a merge patch of spec.state. A cell whose Sweep is gone (deleted, or
recreated under its name) is deleted: deleting a Sweep deletes its cells. Driven by the cache: a
Sweep changed, or a Job labelled with a Sweep changed; and by a periodic resync.

The cells are read from the resource service's `SweepIndex` (kept from the cache's Job events), never
by walking the project's Jobs, so a pass costs O(active cells + cells created), and a large Sweep's
status is its summary, written at most once per `SweepSettings.summary_interval` (ADR 0028).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Coroutine, Protocol, Sequence

import orjson

from ..api.kinds import KindInfo, resolve
from ..clock import Clock
from ..errors import NodusError
from ..identity import SYSTEM, Caller
from .cache import JOBS, SWEEPS, Cache
from .sweep import CreateCell, SetCellState, SweepSettings, cell_job, cells_of, decide_sweep, sweep_owner
from .sweep_index import SweepIndex
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.sweep")

RESYNC_SECONDS = 30.0
CONCURRENT = 64
"""How many cell state patches one pass has in flight at once (its creates go in one `create_many`)."""


class CellSource(Protocol):
    """The resource service's Sweep cells: the index it serves large Sweeps' rows from, and the settings."""

    @property
    def index(self) -> SweepIndex: ...

    @property
    def settings(self) -> SweepSettings: ...


class Resources(Protocol):
    """What the controller asks of the resource service (it implements these)."""

    @property
    def sweep_cells(self) -> CellSource: ...

    async def create_many(self, caller: Caller, info: KindInfo, project: str, objs: Sequence[dict[str, Any]],
                          created: Callable[[dict[str, Any]], None] | None = None,
                          ) -> Sequence[dict[str, Any] | NodusError]: ...

    async def patch(self, caller: Caller, info: KindInfo, project: str, name: str, patch_type: str,
                    patch_body: bytes, *, subresource: str = "", dry_run: bool = False,
                    field_validation: str = "Strict") -> tuple[dict[str, Any], tuple[str, ...]]: ...

    async def replace(self, caller: Caller, info: KindInfo, project: str, name: str, obj: Any, *,
                      subresource: str = "", dry_run: bool = False,
                      field_validation: str = "Strict") -> tuple[dict[str, Any], tuple[str, ...]]: ...

    async def delete(self, caller: Caller, info: KindInfo, project: str, name: str, *,
                     dry_run: bool = False, precondition: str = "") -> dict[str, Any]: ...


class SweepController:
    def __init__(self, cache: Cache, resources: Resources, clock: Clock, workers: int = 2) -> None:
        self.cache, self.resources, self.clock = cache, resources, clock
        self.queue: WorkQueue[str] = WorkQueue()
        self.workers = workers
        self.index, self.settings = resources.sweep_cells.index, resources.sweep_cells.settings
        self._written: dict[str, float] = {}
        """When each large Sweep's summary was last written (monotonic): a rate limit, lost harmlessly on restart."""
        self._jobs, self._sweeps = resolve("jobs"), resolve("sweeps")
        cache.listen(SWEEPS, lambda key, old, new: self.queue.add(key))
        cache.listen(JOBS, self._on_job)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new or old
        owner = sweep_owner(obj) if obj is not None else None
        if owner is not None:
            project = key[len(JOBS):].split("/", 1)[0]
            self.queue.add(f"{SWEEPS}{project}/{owner[0]}")

    async def run(self) -> None:
        await self.cache.synced.wait()
        await run_workers(self.queue, self.reconcile, workers=self.workers, resync=self.resync,
                          resync_seconds=RESYNC_SECONDS, log=log, name="sweep")

    def resync(self) -> None:
        for key in [k for k, _ in self.cache.under(SWEEPS)] + self.index.sweeps():
            self.queue.add(key)

    async def reconcile(self, key: str) -> None:
        project = key[len(SWEEPS):].partition("/")[0]
        sweep = self.cache.get(key)
        uid = ((sweep or {}).get("metadata") or {}).get("uid")
        groups = self.index.groups(key)
        for owner, cells in groups.items():  # its Sweep was deleted (or recreated): the cells go with it
            if sweep is None or owner != uid:
                await self._each([self._delete(project, job.name) for job in list(cells.by_index.values())])
        if sweep is None or (sweep.get("metadata") or {}).get("deletionTimestamp"):
            self._written.pop(key, None)
            return
        decision = decide_sweep(sweep, self.index.cells(key, str(uid)), self.clock.now(), self.settings)
        await self._create([cell_job(sweep, a.cell) for a in decision.actions if isinstance(a, CreateCell)], project)
        await self._each([self._set_state(project, a.name, a.state.value) for a in decision.actions
                          if isinstance(a, SetCellState)])
        if decision.status is not None:
            large = self.settings.large(len(cells_of(sweep.get("spec") or {})))
            wait = self._written.get(key, -1e9) + self.settings.summary_interval - time.monotonic()
            if large and wait > 0:  # a large Sweep's summary at most once an interval; the cells went on above
                self.queue.add_after(key, wait)
                return
            try:
                written, _ = await self.resources.replace(SYSTEM, self._sweeps, project, sweep["metadata"]["name"],
                                                          {**sweep, "status": decision.status}, subresource="status")
            except NodusError as e:
                if e.reason not in ("Conflict", "NotFound"):
                    raise
                self.queue.add_after(key, 0.05)
                return
            self.cache.apply(key, written, int(written["metadata"]["resourceVersion"]))
            if large:
                self._written[key] = time.monotonic()

    async def _each(self, calls: list[Coroutine[Any, Any, None]]) -> None:
        """Runs a pass's cell patches CONCURRENT at a time: the store commits writes that arrive together
        in one transaction, so a pass that stops 256 cells pays for a few commits, not 256."""
        gate = asyncio.Semaphore(CONCURRENT)

        async def one(call: Coroutine[Any, Any, None]) -> None:
            async with gate:
                await call
        await asyncio.gather(*(one(call) for call in calls))

    async def _create(self, jobs: list[dict[str, Any]], project: str) -> None:
        """Creates a pass's cells in one call, so their writes commit together; a cell that exists
        (AlreadyExists: a restart, a second pass) is left alone, since a cell's name is deterministic."""
        if not jobs:
            return
        def created(job: dict[str, Any]) -> None:  # into the cache at once: its watch then skips the event
            self.cache.apply(f"{JOBS}{project}/{job['metadata']['name']}", job, int(job["metadata"]["resourceVersion"]))
        failed = [e for e in await self.resources.create_many(SYSTEM, self._jobs, project, jobs, created)
                  if isinstance(e, NodusError) and e.reason != "AlreadyExists"]
        if failed:
            raise failed[0]  # after the cells that were created are in the cache

    async def _set_state(self, project: str, name: str, state: str) -> None:
        try:
            await self.resources.patch(SYSTEM, self._jobs, project, name, "merge",
                                       orjson.dumps({"spec": {"state": state}}))
        except NodusError as e:
            if e.reason != "NotFound":
                raise

    async def _delete(self, project: str, name: str) -> None:
        try:
            await self.resources.delete(SYSTEM, self._jobs, project, name)
        except NodusError as e:
            if e.reason != "NotFound":
                raise
