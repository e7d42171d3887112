"""The Sweep controller's decision: from (a Sweep, its cell Jobs, now) to the cells to create, the cell
states to set and the Sweep's next status.

Pure and level-triggered, like `job.decide`. The cells are the product of `matrix.gpu` ×
`matrix.regions` × `matrix.params` (parameter names in sorted order, each name's values as listed) ×
`repetitions`, and a cell's index is that product's mixed-radix number with the GPU outermost and the
repetition innermost:

    index = ((gpu · R + region) · P₁ + p₁ … · Pₙ + pₙ) · repetitions + repetition

An empty dimension has one value: the template's own. Each cell is the Job `<sweep>-<index>`, so a
restarted coordinator (or a second pass) never creates a cell twice: it finds the Job by its name.
At most `maxParallel` cells are active (created and not finished) at once; a finished cell frees its
slot for the next in index order. `spec.state` propagates to every unfinished cell; lost capacity is
the cell Job's own business (its recovery policy), so only a cell that ends Failed counts as failed.
"""
from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

import orjson

from ..clock import parse, rfc3339
from .job_status import set_condition
from .views import JobPhase, JobState

SWEEP_LABEL, CELL_LABEL = "nodus.dev/sweep", "nodus.dev/cell"
TERMINAL = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell of the matrix."""

    index: int
    gpu: Mapping[str, Any] | None
    """matrix.gpu's value (None: the template's resources.gpu)."""
    region: str
    """matrix.regions' value ("": the template's placement.regions)."""
    params: Mapping[str, str]
    repetition: int


def sweep_owner(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """(sweep name, sweep uid) of a cell Job (its controller ownerReference); None for any other Job."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Sweep" and ref.get("controller"):
            return str(ref.get("name")), str(ref.get("uid"))
    return None


def cells_in(jobs: Iterable[tuple[str, dict[str, Any]]], sweep: str) -> list[tuple[str, dict[str, Any]]]:
    """The cell Jobs of the Sweep named `sweep` among a project's (key, Job) pairs: labelled with it and
    owned by a Sweep of that name (a recreated Sweep's uid may differ: the controller tells them apart)."""
    return [(k, j) for k, j in jobs if (j.get("metadata") or {}).get("labels", {}).get(SWEEP_LABEL) == sweep
            and (sweep_owner(j) or ("",))[0] == sweep]


def cells_of(spec: Mapping[str, Any]) -> list[Cell]:
    """Every cell of a Sweep spec, in index order (the same list for the same matrix and repetitions:
    both are immutable, and a 10,000-cell Sweep is decided on every cell change)."""
    return list(_cells(orjson.dumps({"m": spec.get("matrix") or {}, "r": spec.get("repetitions") or 1},
                                    option=orjson.OPT_SORT_KEYS)))


@functools.lru_cache(maxsize=64)
def _cells(key: bytes) -> tuple[Cell, ...]:
    doc = orjson.loads(key)
    return tuple(_expand({"matrix": doc["m"], "repetitions": doc["r"]}))


def _expand(spec: Mapping[str, Any]) -> list[Cell]:
    matrix = spec.get("matrix") or {}
    gpus: list[Mapping[str, Any] | None] = list(matrix.get("gpu") or []) or [None]
    regions: list[str] = list(matrix.get("regions") or []) or [""]
    params = matrix.get("params") or {}
    names = sorted(params)
    values = [[str(v) for v in params[n]] for n in names]
    reps = int(spec.get("repetitions") or 1)
    out = []
    for n, (gpu, region, combo, rep) in enumerate(itertools.product(gpus, regions, itertools.product(*values),
                                                                      range(reps))):
        out.append(Cell(n, gpu, region, dict(zip(names, combo)), rep))
    return out


def gpu_text(gpu: Mapping[str, Any] | None) -> str:
    """A GPU request in the "H100:1" form."""
    if not gpu:
        return ""
    return f"{'/'.join(gpu.get('type') or [])}:{int(gpu.get('count') or 1)}"


def cell_name(sweep: str, index: int) -> str:
    return f"{sweep}-{index}"


def cell_job(sweep: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    """The Job of one cell: the template with the cell's GPU, its one region and NODUS_PARAM_<NAME>
    for each parameter; labelled and owned by the Sweep."""
    meta, spec = sweep["metadata"], sweep["spec"]
    body = copy.deepcopy((spec.get("template") or {}).get("spec") or {})
    if cell.gpu is not None:
        body.setdefault("resources", {})["gpu"] = copy.deepcopy(dict(cell.gpu))
    if cell.region:
        body.setdefault("placement", {})["regions"] = [cell.region]
    if cell.params:
        env = [e for e in body.get("env") or [] if not str(e.get("name", "")).startswith("NODUS_PARAM_")]
        env += [{"name": f"NODUS_PARAM_{name}", "value": value} for name, value in sorted(cell.params.items())]
        body["env"] = env
    state = JobState.parse(spec.get("state"))
    if state is not JobState.RUNNING:
        body["state"] = state.value
    return {"apiVersion": "nodus.dev/v1", "kind": "Job",
            "metadata": {"name": cell_name(meta["name"], cell.index), "namespace": meta.get("namespace", ""),
                         "labels": {SWEEP_LABEL: meta["name"], CELL_LABEL: str(cell.index)},
                         "ownerReferences": [{"apiVersion": "nodus.dev/v1", "kind": "Sweep", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": body}


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
        return cls(meta.get("name", ""), int((meta.get("labels") or {}).get(CELL_LABEL, -1)),
                   JobPhase.parse(status.get("phase")), JobState.parse(spec.get("state")),
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


@dataclass(frozen=True, slots=True)
class CreateCell:
    cell: Cell


@dataclass(frozen=True, slots=True)
class SetCellState:
    name: str
    state: JobState


SweepAction = CreateCell | SetCellState


@dataclass(frozen=True, slots=True)
class SweepDecision:
    status: dict[str, Any] | None
    """The Sweep's next status; None when it does not change."""
    actions: tuple[SweepAction, ...] = field(default_factory=tuple)


def decide_sweep(sweep: Mapping[str, Any], jobs: Sequence[CellJob], now: float) -> SweepDecision:
    spec, prev = sweep.get("spec") or {}, dict(sweep.get("status") or {})
    generation = int((sweep.get("metadata") or {}).get("generation") or 1)
    state = JobState.parse(spec.get("state"))
    cells = cells_of(spec)
    by_index = {j.index: j for j in jobs}
    actions: list[SweepAction] = []
    # The desired state reaches every cell that has not finished.
    for job in jobs:
        if job.phase not in TERMINAL and job.state is not state:
            actions.append(SetCellState(job.name, state))
    active = sum(1 for job in jobs if job.phase not in TERMINAL)
    capped = _capped(spec, jobs)
    if state is JobState.RUNNING and not capped:
        free = int(spec.get("maxParallel") or 4) - active
        for cell in cells:
            if free <= 0:
                break
            if cell.index not in by_index:
                actions.append(CreateCell(cell))
                free -= 1

    rows, failed = [], []
    for cell in cells:
        j = by_index.get(cell.index)
        row: dict[str, Any] = {"index": cell.index, "object": cell_name(sweep["metadata"]["name"], cell.index),
                               "phase": (j.phase if j is not None else JobPhase.PENDING).value,
                               "repetition": cell.repetition, "costUSD": str(j.cost if j is not None else "0.00")}
        if cell.gpu is not None:
            row["gpu"] = gpu_text(cell.gpu)
        if cell.region:
            row["region"] = cell.region
        if cell.params:
            row["params"] = dict(cell.params)
        if j is not None and j.wall_seconds is not None:
            row["wallSeconds"] = int(j.wall_seconds)
        if j is not None and (ups := j.units_per_second) is not None:
            row["unitsPerSecond"] = str(ups)
        if j is not None and j.phase is JobPhase.FAILED:
            failed.append(row["object"])
        rows.append(row)

    status = dict(prev)
    status["cells"] = rows
    status["cost"] = {"totalUSD": str(sum((job.cost for job in jobs), Decimal("0.00")))}
    done = [by_index[c.index] for c in cells if c.index in by_index and by_index[c.index].phase in TERMINAL]
    conditions = [dict(c) for c in prev.get("conditions") or []]
    if jobs and "startTime" not in status:
        status["startTime"] = rfc3339(now)
    phase, reason, message = _phase(state, cells, by_index, done, failed, active)
    if capped and phase is JobPhase.RUNNING:
        phase, reason = JobPhase.SUSPENDED, "MaxCostReached"
        message = (f"the cells have spent {status['cost']['totalUSD']} USD of the shared spec.maxCostUSD "
                   f"{spec.get('maxCostUSD')}: running cells suspend through their checkpoints and no new cell starts; "
                   "raise spec.maxCostUSD to resume")
    if phase in TERMINAL and "completionTime" not in status:
        status["completionTime"] = rfc3339(now)
        kind = {JobPhase.SUCCEEDED: "Complete", JobPhase.FAILED: "Failed", JobPhase.CANCELLED: "Cancelled"}[phase]
        conditions = set_condition(conditions, kind, "True", reason or "Completed", message, now, generation)
    status.update(phase=phase.value, observedGeneration=generation)
    for key, value in (("reason", reason), ("message", message)):
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    if conditions:
        status["conditions"] = conditions
    best = _best(cells, by_index)
    if best:
        status["best"] = best
    return SweepDecision(None if status == prev else status, tuple(actions))


def _capped(spec: Mapping[str, Any], jobs: Sequence[CellJob]) -> bool:
    """The shared cap is reached: what the cells spent covers it, or money stopped a cell for it."""
    cap = spec.get("maxCostUSD")
    if not cap:
        return False
    spent = sum((job.cost for job in jobs), Decimal(0))
    return spent >= Decimal(str(cap)) or any(job.money_stop == "MaxCostReached" and job.phase not in TERMINAL
                                             for job in jobs)


def _phase(state: JobState, cells: list[Cell], by_index: Mapping[int, CellJob], done: list[CellJob],
           failed: list[str], active: int) -> tuple[JobPhase, str, str]:
    if len(done) == len(cells) and cells:
        if failed:
            return (JobPhase.FAILED, "CellsFailed",
                    f"{len(failed)} of {len(cells)} cells failed: {', '.join(failed[:20])}"
                    + (" …" if len(failed) > 20 else ""))
        if any(by_index[c.index].phase is JobPhase.CANCELLED for c in cells):
            return JobPhase.CANCELLED, "Cancelled", "cells were cancelled"
        return JobPhase.SUCCEEDED, "", f"{len(cells)} of {len(cells)} cells succeeded"
    if state is JobState.CANCELLED:
        return (JobPhase.CANCELLED, "Cancelled", "spec.state is Cancelled: every cell is stopped for good") \
            if active == 0 else (JobPhase.RUNNING, "", "cancelling the cells")
    if state is JobState.SUSPENDED:
        return JobPhase.SUSPENDED, "Suspended", "spec.state is Suspended: every running cell is suspended"
    if not by_index:
        return JobPhase.PENDING, "", ""
    return JobPhase.RUNNING, "", f"{len(done)} of {len(cells)} cells finished, {active} active"


def _best(cells: list[Cell], by_index: Mapping[int, CellJob]) -> dict[str, int]:
    """byCost: the cheapest succeeded cell per unit where units are reported, else per cell;
    byThroughput: the succeeded cell with the most units per second."""
    ok = [by_index[c.index] for c in cells if c.index in by_index and by_index[c.index].phase is JobPhase.SUCCEEDED]
    if not ok:
        return {}
    def per_unit(j: CellJob) -> Decimal:
        return j.cost / j.units if j.units else j.cost
    out = {"byCost": min(ok, key=lambda j: (per_unit(j), j.index)).index}
    fast = [(ups, -j.index, j) for j in ok if (ups := j.units_per_second) is not None]
    if fast:
        out["byThroughput"] = max(fast, key=lambda t: (t[0], t[1]))[2].index
    return out
