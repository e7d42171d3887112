"""The cell Jobs of every Sweep, kept current from the cache's Job events, so that neither a Sweep
decision nor a read of a large Sweep walks the project's Jobs or decodes its cells again.

A cell is a Job labelled `nodus.dev/sweep` and `nodus.dev/cell` and owned (a controller
ownerReference) by a Sweep of the label's name. `SweepIndex` groups them by the Sweep's key and the
owner's uid (a Sweep deleted and recreated under its name owns none of the old cells: the controller
deletes those) and keeps, per group, a `SweepCells`: what a decision asks of the cells (the active
ones, the count per phase, the cost, the failed ones, the best) updated in O(1) per Job event.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Mapping

from ..clock import parse
from .views import JobPhase, JobState

SWEEP_LABEL, CELL_LABEL = "nodus.dev/sweep", "nodus.dev/cell"
TERMINAL = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})
SWEEPS = "sweeps/"


def sweep_owner(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """(sweep name, sweep uid) of a cell Job (its controller ownerReference); None for any other Job."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Sweep" and ref.get("controller"):
            return str(ref.get("name")), str(ref.get("uid"))
    return None


@dataclass(frozen=True, slots=True)
class CellJob:
    """What the decision reads of a cell's Job."""

    name: str
    index: int
    phase: JobPhase
    state: JobState
    """Its spec.state."""
    cost: Decimal
    started: float | None
    finished: float | None
    units: int | None
    """Units the program reported completed."""
    money_stop: str = ""
    """The reason of its False Funded condition (MaxCostReached: the shared cap), else ""."""

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> CellJob:
        meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
        units = ((status.get("progress") or {}).get("units") or {}).get("completed")
        return cls(meta.get("name", ""), _index(job), JobPhase.parse(status.get("phase")),
                   JobState.parse(spec.get("state")),
                   Decimal(str((status.get("cost") or {}).get("totalUSD") or "0.00")), parse(status.get("startTime")),
                   parse(status.get("completionTime")), int(units) if units is not None else None,
                   next((str(c.get("reason") or "") for c in status.get("conditions") or []
                         if c.get("type") == "Funded" and c.get("status") == "False"), ""))

    @property
    def wall_seconds(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return max(self.finished - self.started, 0.0)

    @property
    def units_per_second(self) -> Decimal | None:
        wall = self.wall_seconds
        if not self.units or not wall:
            return None
        return (Decimal(self.units) / Decimal(str(round(wall, 3)))).quantize(Decimal("0.001"))

    @property
    def per_unit(self) -> Decimal:
        """What it cost per reported unit, else in all."""
        return self.cost / self.units if self.units else self.cost


def _index(job: Mapping[str, Any]) -> int:
    try:
        return int(((job.get("metadata") or {}).get("labels") or {}).get(CELL_LABEL, -1))
    except (TypeError, ValueError):
        return -1


class SweepCells:
    """The cell Jobs of one Sweep by index, with the figures a decision reads kept as they change: the
    active (unfinished) cells, the count per phase, the cost, the failed and succeeded cells, the cells
    the shared cap stopped, and the best. `put` and `drop` are O(1); the best is found again (O(succeeded))
    only when the best cell itself changes or goes."""

    def __init__(self, jobs: Iterable[CellJob] = ()) -> None:
        self.by_index: dict[int, CellJob] = {}
        self.active: set[int] = set()
        self.failed: set[int] = set()
        self.succeeded: set[int] = set()
        self.capped: set[int] = set()
        """Active cells whose Funded condition is False with MaxCostReached."""
        self.counts: Counter[JobPhase] = Counter()
        self.cost = Decimal("0.00")
        self._floor = 0
        """Every index below it has a Job (cells are created in index order)."""
        self._best: dict[str, int] | None = {}
        """byCost and byThroughput; None: to be found again."""
        for job in jobs:
            self.put(job)

    def __len__(self) -> int:
        return len(self.by_index)

    @property
    def done(self) -> int:
        return len(self.by_index) - len(self.active)

    def put(self, job: CellJob) -> None:
        if job.index in self.by_index:
            self.drop(job.index)
        i = job.index
        self.by_index[i] = job
        self.counts[job.phase] += 1
        self.cost += job.cost
        if job.phase not in TERMINAL:
            self.active.add(i)
            if job.money_stop == "MaxCostReached":
                self.capped.add(i)
        elif job.phase is JobPhase.FAILED:
            self.failed.add(i)
        elif job.phase is JobPhase.SUCCEEDED:
            self.succeeded.add(i)
            if self._best is not None:
                self._best = self._better(self._best, job)

    def drop(self, index: int) -> None:
        job = self.by_index.pop(index, None)
        if job is None:
            return
        self.counts[job.phase] -= 1
        if not self.counts[job.phase]:
            del self.counts[job.phase]
        self.cost -= job.cost
        for held in (self.active, self.failed, self.succeeded, self.capped):
            held.discard(index)
        if self._best and index in self._best.values():
            self._best = None
        self._floor = min(self._floor, index)

    def missing(self, count: int, total: int) -> list[int]:
        """The `count` lowest indexes below `total` without a Job."""
        while self._floor in self.by_index:
            self._floor += 1
        out: list[int] = []
        i = self._floor
        while len(out) < count and i < total:
            if i not in self.by_index:
                out.append(i)
            i += 1
        return out

    def best(self) -> dict[str, int]:
        """byCost: the cheapest succeeded cell per unit where units are reported, else per cell (the
        lowest index on a tie); byThroughput: the succeeded cell with the most units per second."""
        if self._best is None:
            best: dict[str, int] = {}
            for i in sorted(self.succeeded):
                best = self._better(best, self.by_index[i])
            self._best = best
        return dict(self._best)

    def _better(self, best: dict[str, int], job: CellJob) -> dict[str, int]:
        out = dict(best)
        cheapest = self.by_index.get(best["byCost"]) if "byCost" in best else None
        if cheapest is None or (job.per_unit, job.index) < (cheapest.per_unit, cheapest.index):
            out["byCost"] = job.index
        ups = job.units_per_second
        if ups is not None:
            fastest = self.by_index.get(best["byThroughput"]) if "byThroughput" in best else None
            top = fastest.units_per_second if fastest is not None else None
            if fastest is None or top is None or (ups, -job.index) > (top, -fastest.index):
                out["byThroughput"] = job.index
        return out


class SweepIndex:
    """Every Sweep's cells, by the Sweep's key (sweeps/<project>/<name>) and its owner uid, fed with the
    cache's Job events (`on_job`, a cache listener: O(1) per event)."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, SweepCells]] = {}
        self._where: dict[str, tuple[str, str, int]] = {}
        """Job key → (Sweep key, owner uid, index) of the group that holds it."""

    def on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        was = self._where.pop(key, None)
        if was is not None:
            sweep, uid, index = was
            group = self._groups[sweep][uid]
            group.drop(index)
            if not len(group):
                del self._groups[sweep][uid]
                if not self._groups[sweep]:
                    del self._groups[sweep]
        if new is None:
            return
        owner = sweep_owner(new)
        labels = (new.get("metadata") or {}).get("labels") or {}
        if owner is None or labels.get(SWEEP_LABEL) != owner[0]:
            return
        job = CellJob.of(new)
        if job.index < 0:
            return
        sweep = f"{SWEEPS}{key.split('/', 2)[1]}/{owner[0]}"
        groups = self._groups.setdefault(sweep, {})
        cells = groups.get(owner[1])
        if cells is None:
            cells = groups[owner[1]] = SweepCells()
        cells.put(job)
        self._where[key] = (sweep, owner[1], job.index)

    def groups(self, sweep: str) -> dict[str, SweepCells]:
        """The cells of every owner uid under the Sweep key (a copy of the mapping, the same groups)."""
        return dict(self._groups.get(sweep) or {})

    def cells(self, sweep: str, uid: str) -> SweepCells:
        """The cells of the Sweep with this key and uid (empty when it has none)."""
        return (self._groups.get(sweep) or {}).get(uid) or SweepCells()

    def sweeps(self) -> list[str]:
        """The keys of the Sweeps that own cells, existing or not."""
        return list(self._groups)
