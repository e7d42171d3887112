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

The decision reads the cells as a `SweepCells` (sweep_index.py), which keeps what it asks (the active
cells, the count per phase, the cost, the failed cells, the best) as the Jobs change, so a pass costs
O(active cells + cells it creates), not O(cells). A Sweep of more cells than
`SweepSettings.summary_cells` gets its summary as its status (phase, reason, message, cellCounts, cost,
best, conditions, times) and no `cells`: those rows are served from the cell Jobs on read
(sweep_cells.py), built by the same `cell_row` as a small Sweep's stored rows.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

import orjson

from ..api.jsondoc import copy_json
from ..clock import rfc3339
from .job_status import set_condition
from .sweep_index import CELL_LABEL as CELL_LABEL
from .sweep_index import SWEEP_LABEL as SWEEP_LABEL
from .sweep_index import TERMINAL as TERMINAL
from .sweep_index import CellJob as CellJob
from .sweep_index import SweepCells as SweepCells
from .sweep_index import sweep_owner as sweep_owner
from .views import JobPhase, JobState


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """How large Sweeps are kept: one value, given to the resource service (`ResourceService(sweeps=…)`),
    that it (serving status.cells) and the Sweep controller (writing the status) share."""

    summary_cells: int = 256
    """A Sweep of more cells than this stores only its summary (phase, cellCounts, cost, best, conditions);
    its status.cells is served from the cell Jobs on every read (ADR 0028)."""
    summary_interval: float = 1.0
    """The least seconds between two writes of a large Sweep's summary (a watcher's event each)."""

    def __post_init__(self) -> None:
        if self.summary_cells < 0 or self.summary_interval < 0:
            raise ValueError(f"sweep summary settings must not be negative: {self!r}")

    def large(self, cells: int) -> bool:
        return cells > self.summary_cells


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


def cells_in(jobs: Iterable[tuple[str, dict[str, Any]]], sweep: str) -> list[tuple[str, dict[str, Any]]]:
    """The cell Jobs of the Sweep named `sweep` among a project's (key, Job) pairs: labelled with it and
    owned by a Sweep of that name (a recreated Sweep's uid may differ: the controller tells them apart)."""
    return [(k, j) for k, j in jobs if (j.get("metadata") or {}).get("labels", {}).get(SWEEP_LABEL) == sweep
            and (sweep_owner(j) or ("",))[0] == sweep]


def cells_of(spec: Mapping[str, Any]) -> tuple[Cell, ...]:
    """Every cell of a Sweep spec, in index order (the same tuple for the same matrix and repetitions:
    both are immutable, and a 10,000-cell Sweep is decided on every cell change)."""
    return (_cells(orjson.dumps({"m": spec.get("matrix") or {}, "r": spec.get("repetitions") or 1},
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


def cell_labels(sweep: Mapping[str, Any], index: int) -> dict[str, str]:
    """The labels of cell `index`: the template's (spec.template.metadata.labels), the Sweep's own over
    them, and nodus.dev/sweep and nodus.dev/cell last. The Sweep's win over the template's, so a Budget
    narrowed by a label of the Sweep matches every cell (a template cannot label its cells out of it)."""
    meta = sweep.get("metadata") or {}
    template = ((sweep.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return {**(template.get("labels") or {}), **(meta.get("labels") or {}),
            SWEEP_LABEL: str(meta.get("name") or ""), CELL_LABEL: str(index)}


def cell_job(sweep: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    """The Job of one cell: the template with the cell's GPU, its one region and NODUS_PARAM_<NAME>
    for each parameter; labelled (`cell_labels`) and owned by the Sweep."""
    meta, spec = sweep["metadata"], sweep["spec"]
    body = copy_json((spec.get("template") or {}).get("spec") or {})
    if cell.gpu is not None:
        body.setdefault("resources", {})["gpu"] = copy_json(dict(cell.gpu))
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
                         "labels": cell_labels(sweep, cell.index),
                         "ownerReferences": [{"apiVersion": "nodus.dev/v1", "kind": "Sweep", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": body}


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


def cell_row(sweep: str, cell: Cell, job: CellJob | None) -> dict[str, Any]:
    """A cell's row of status.cells: the matrix's values and a projection of its Job (Pending, cost 0.00
    before the Job exists). The stored list of a small Sweep and the served list of a large one are
    both built here, so both have one shape."""
    row: dict[str, Any] = {"index": cell.index, "object": cell_name(sweep, cell.index),
                           "phase": (job.phase if job is not None else JobPhase.PENDING).value,
                           "repetition": cell.repetition, "costUSD": str(job.cost if job is not None else "0.00")}
    if cell.gpu is not None:
        row["gpu"] = gpu_text(cell.gpu)
    if cell.region:
        row["region"] = cell.region
    if cell.params:
        row["params"] = dict(cell.params)
    if job is not None and job.wall_seconds is not None:
        row["wallSeconds"] = int(job.wall_seconds)
    if job is not None and (ups := job.units_per_second) is not None:
        row["unitsPerSecond"] = str(ups)
    return row


def cell_counts(total: int, cells: SweepCells) -> dict[str, int]:
    """status.cellCounts: how many cells are in each phase (Pending counts the cells not created yet)."""
    counts = dict(cells.counts)
    counts[JobPhase.PENDING] = counts.get(JobPhase.PENDING, 0) + max(total - len(cells), 0)
    return {phase.value: counts[phase] for phase in JobPhase if counts.get(phase)}


def decide_sweep(sweep: Mapping[str, Any], jobs: Sequence[CellJob] | SweepCells, now: float,
                 settings: SweepSettings = SweepSettings()) -> SweepDecision:
    """O(active cells + cells created) for a large Sweep: `jobs` keeps its figures as its Jobs change,
    and a large Sweep's status is its summary, without a row per cell (`SweepSettings`)."""
    spec, prev = sweep.get("spec") or {}, dict(sweep.get("status") or {})
    name = sweep["metadata"]["name"]
    generation = int((sweep.get("metadata") or {}).get("generation") or 1)
    state = JobState.parse(spec.get("state"))
    cells = cells_of(spec)
    have = jobs if isinstance(jobs, SweepCells) else SweepCells(jobs)
    actions: list[SweepAction] = []
    # The desired state reaches every cell that has not finished.
    for i in sorted(have.active):
        if have.by_index[i].state is not state:
            actions.append(SetCellState(have.by_index[i].name, state))
    active = len(have.active)
    capped = _capped(spec, have)
    if state is JobState.RUNNING and not capped:
        free = int(spec.get("maxParallel") or 4) - active
        actions += [CreateCell(cells[i]) for i in have.missing(free, len(cells))]

    status = dict(prev)
    if settings.large(len(cells)):
        status.pop("cells", None)  # served from the cell Jobs (sweep_cells.py)
    else:
        status["cells"] = [cell_row(name, cell, have.by_index.get(cell.index)) for cell in cells]
    status["cellCounts"] = cell_counts(len(cells), have)
    status["cost"] = {"totalUSD": str(have.cost)}
    conditions = [dict(c) for c in prev.get("conditions") or []]
    if len(have) and "startTime" not in status:
        status["startTime"] = rfc3339(now)
    phase, reason, message = _phase(state, name, len(cells), have)
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
    best = have.best()
    if best:
        status["best"] = best
    return SweepDecision(None if status == prev else status, tuple(actions))


def _capped(spec: Mapping[str, Any], cells: SweepCells) -> bool:
    """The shared cap is reached: what the cells spent covers it, or money stopped a cell for it."""
    cap = spec.get("maxCostUSD")
    if not cap:
        return False
    return cells.cost >= Decimal(str(cap)) or bool(cells.capped)


def _phase(state: JobState, sweep: str, total: int, cells: SweepCells) -> tuple[JobPhase, str, str]:
    active = len(cells.active)
    if cells.done == total and total:
        if cells.failed:
            failed = [cell_name(sweep, i) for i in sorted(cells.failed)[:20]]
            return (JobPhase.FAILED, "CellsFailed",
                    f"{len(cells.failed)} of {total} cells failed: {', '.join(failed)}"
                    + (" …" if len(cells.failed) > 20 else ""))
        if cells.counts.get(JobPhase.CANCELLED):
            return JobPhase.CANCELLED, "Cancelled", "cells were cancelled"
        return JobPhase.SUCCEEDED, "", f"{total} of {total} cells succeeded"
    if state is JobState.CANCELLED:
        return (JobPhase.CANCELLED, "Cancelled", "spec.state is Cancelled: every cell is stopped for good") \
            if active == 0 else (JobPhase.RUNNING, "", "cancelling the cells")
    if state is JobState.SUSPENDED:
        return JobPhase.SUSPENDED, "Suspended", "spec.state is Suspended: every running cell is suspended"
    if not len(cells):
        return JobPhase.PENDING, "", ""
    return JobPhase.RUNNING, "", f"{cells.done} of {total} cells finished, {active} active"
