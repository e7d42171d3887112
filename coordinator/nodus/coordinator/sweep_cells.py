"""status.cells of a large Sweep, served from its cell Jobs (ADR 0028).

A Sweep of more cells than `SweepSettings.summary_cells` is stored with its summary only (phase,
reason, message, cellCounts, cost, best, conditions, times): rewriting a row per cell on every cell
transition is what held the shared loop. Every read of such a Sweep through the resource service —
GET, LIST, the initial events of a WATCH and each later event of the Sweep — gets `status.cells` built
here, one row per cell in index order, each a projection of its Job (`controllers.sweep.cell_row`, the
function that builds a small Sweep's stored rows, so both have one shape; Pending before the Job
exists). The Jobs are read from the `SweepIndex` the cache's Job events keep, not from the store, so
a row is as fresh as the controllers' view of its Job, which may be newer than the stored summary
(written at most once per `SweepSettings.summary_interval`) and never older than the last Job write
the coordinator acknowledged before the read began.
"""
from __future__ import annotations

from typing import Any

from .api.kinds import KindInfo
from .controllers.cache import JOBS, SWEEPS, Cache
from .controllers.sweep import SweepSettings, cell_row, cells_of
from .controllers.sweep_index import SweepIndex


class SweepCellService:
    """The resource service's view of Sweep cells: the index (shared with the Sweep controller) and the
    projection of a large Sweep's rows on read."""

    def __init__(self, cache: Cache | None, settings: SweepSettings) -> None:
        self.settings, self.index = settings, SweepIndex()
        self.serving = cache is not None
        """Without the controllers' cache (a service built without a fleet) nothing is projected."""
        if cache is not None:
            cache.listen(JOBS, self.index.on_job)  # before the cache loads: its first list runs through it

    def served(self, info: KindInfo, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` as a reader sees it: a large Sweep gets status.cells from its Jobs (in place); any other
        object is returned as stored."""
        if info.kind != "Sweep" or not self.serving:
            return obj
        cells = cells_of(obj.get("spec") or {})
        if not self.settings.large(len(cells)):
            return obj
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        have = self.index.cells(f"{SWEEPS}{meta.get('namespace', '')}/{name}", str(meta.get("uid", "")))
        status = obj.get("status")
        if not isinstance(status, dict):
            status = obj["status"] = {}
        status["cells"] = [cell_row(name, cell, have.by_index.get(cell.index)) for cell in cells]
        return obj
