"""The Sweep controller's pure decision (controllers/sweep.py): the documented index order, at most
maxParallel cells active, the state reaching every unfinished cell, a failed cell reported only once
every cell has finished, and the same picture deciding the same thing again (level-triggered)."""
from __future__ import annotations

from decimal import Decimal

from nodus.coordinator.controllers.sweep import (CellJob, CreateCell, SetCellState, cell_job, cells_of,
                                                 decide_sweep)
from nodus.coordinator.controllers.views import JobPhase, JobState

SPEC = {"template": {"kind": "Job", "spec": {"command": ["train"], "placement": {"regions": ["us", "eu"]}}},
        "matrix": {"gpu": [{"type": ["A100"], "count": 1}, {"type": ["H100"], "count": 2}], "regions": ["us", "eu"],
                   "params": {"LR": ["0.1", "0.2"], "BATCH": ["8"]}},
        "repetitions": 2, "maxParallel": 3}


def sweep(**spec: object) -> dict[str, object]:
    return {"metadata": {"name": "s", "namespace": "p", "uid": "u-1", "generation": 1}, "spec": {**SPEC, **spec}}


def job(index: int, phase: JobPhase, state: JobState = JobState.RUNNING, cost: str = "0.00", units: int | None = None,
        started: float | None = None, finished: float | None = None) -> CellJob:
    return CellJob(f"s-{index}", index, phase, state, Decimal(cost), started, finished, units)


def test_cells_are_numbered_gpu_outermost_then_region_then_sorted_params_then_repetition() -> None:
    cells = cells_of(SPEC)
    assert len(cells) == 2 * 2 * 2 * 1 * 2
    first = [(c.gpu["type"][0] if c.gpu else "", c.region, c.params["LR"], c.repetition) for c in cells[:5]]
    assert first == [("A100", "us", "0.1", 0), ("A100", "us", "0.1", 1), ("A100", "us", "0.2", 0),
                     ("A100", "us", "0.2", 1), ("A100", "eu", "0.1", 0)]
    assert cells[8].gpu == {"type": ["H100"], "count": 2} and cells[8].params == {"BATCH": "8", "LR": "0.1"}
    body = cell_job(sweep(), cells[9])
    assert body["metadata"]["name"] == "s-9" and body["metadata"]["labels"] == {"nodus.dev/sweep": "s",
                                                                                "nodus.dev/cell": "9"}
    assert body["spec"]["resources"]["gpu"] == {"type": ["H100"], "count": 2}
    assert body["spec"]["placement"]["regions"] == ["us"], "one region per cell, narrowing the template's"
    assert body["spec"]["env"] == [{"name": "NODUS_PARAM_BATCH", "value": "8"}, {"name": "NODUS_PARAM_LR", "value": "0.1"}]
    assert cells_of({"template": {"spec": {}}}) == cells_of({"template": {"spec": {}}, "repetitions": 1})
    assert len(cells_of({"template": {"spec": {}}})) == 1, "empty dimensions keep the template's value"


def test_a_cell_carries_the_template_labels_under_the_sweeps_own_and_the_sweep_labels_last() -> None:
    labelled = sweep(template={**SPEC["template"], "metadata": {"labels": {
        "team": "other", "stage": "tune", "nodus.dev/sweep": "elsewhere", "nodus.dev/cell": "0"}}})
    labelled["metadata"] = {**labelled["metadata"], "labels": {"team": "vision", "cost-center": "r-and-d"}}
    body = cell_job(labelled, cells_of(SPEC)[3])
    assert body["metadata"]["labels"] == {"team": "vision", "stage": "tune", "cost-center": "r-and-d",
                                          "nodus.dev/sweep": "s", "nodus.dev/cell": "3"}


def test_at_most_max_parallel_cells_are_active_and_finished_ones_free_their_slot() -> None:
    d = decide_sweep(sweep(), [], 100.0)
    assert [a.cell.index for a in d.actions if isinstance(a, CreateCell)] == [0, 1, 2]
    running = [job(0, JobPhase.RUNNING), job(1, JobPhase.SUCCEEDED), job(2, JobPhase.QUEUED)]
    d = decide_sweep(sweep(), running, 101.0)
    assert [a.cell.index for a in d.actions if isinstance(a, CreateCell)] == [3], "one slot is free"
    again = decide_sweep({**sweep(), "status": d.status}, running, 101.0)
    assert again.status is None and [type(a) for a in again.actions] == [CreateCell], "level-triggered"


def test_the_state_reaches_every_unfinished_cell_and_a_suspended_sweep_starts_none() -> None:
    cells = [job(0, JobPhase.RUNNING), job(1, JobPhase.SUCCEEDED)]
    d = decide_sweep(sweep(state="Suspended"), cells, 5.0)
    assert d.actions == (SetCellState("s-0", JobState.SUSPENDED),)
    assert d.status is not None and d.status["phase"] == "Suspended"
    d = decide_sweep(sweep(state="Cancelled"), [job(0, JobPhase.RUNNING, JobState.CANCELLED)], 5.0)
    assert not [a for a in d.actions if isinstance(a, CreateCell)]


def test_a_failed_cell_fails_the_sweep_with_cells_failed_once_all_have_finished() -> None:
    spec = {"template": {"spec": {}}, "matrix": {"params": {"X": ["1", "2", "3"]}}, "maxParallel": 3, "repetitions": 1}
    cells = [job(0, JobPhase.SUCCEEDED, cost="2.00", units=10, started=0, finished=10),
             job(1, JobPhase.FAILED), job(2, JobPhase.RUNNING)]
    d = decide_sweep(sweep(**spec), cells, 20.0)
    assert d.status is not None and d.status["phase"] == "Running", "the other cells go on"
    cells[2] = job(2, JobPhase.SUCCEEDED, cost="1.00", units=4, started=0, finished=2)
    d = decide_sweep(sweep(**spec), cells, 30.0)
    assert d.status is not None and (d.status["phase"], d.status["reason"]) == ("Failed", "CellsFailed")
    assert "s-1" in d.status["message"] and d.status["completionTime"]
    # byCost per unit: 2.00/10 = 0.20 beats 1.00/4 = 0.25; byThroughput: 4 units in 2 s beats 10 in 10 s.
    assert d.status["best"] == {"byCost": 0, "byThroughput": 2}
    assert d.status["cost"] == {"totalUSD": "3.00"}


def test_the_incremental_cell_figures_equal_those_built_from_scratch_after_any_changes() -> None:
    import random

    from nodus.coordinator.controllers.sweep import SweepCells
    rng = random.Random(13)
    phases = list(JobPhase)
    kept = SweepCells()
    for step in range(3000):
        index = rng.randrange(40)
        if rng.random() < 0.2:
            kept.drop(index)
        else:
            kept.put(job(index, rng.choice(phases), cost=f"{rng.randrange(500) / 100:.2f}",
                         units=rng.choice([None, rng.randrange(1, 50)]), started=0.0, finished=float(rng.randrange(1, 9))))
        if step % 97 == 0:
            kept.best()  # the best is kept between changes too, not only found at the end
    fresh = SweepCells(kept.by_index.values())
    assert (kept.counts, kept.cost, kept.active, kept.failed, kept.succeeded) == \
        (fresh.counts, fresh.cost, fresh.active, fresh.failed, fresh.succeeded)
    assert kept.best() == fresh.best() and kept.missing(5, 45) == fresh.missing(5, 45)
    assert kept.missing(5, 45) == [i for i in range(45) if i not in kept.by_index][:5]
