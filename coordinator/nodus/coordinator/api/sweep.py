"""Sweep (nodus.dev/v1): a Job template fanned out over a matrix of GPUs, regions and parameters.

The template's spec is the Job spec tree itself (job.JOB_SPEC) and gets the Job's folding,
defaults and rules at `spec.template.spec`, so a Sweep cell can never be a Job the Job kind refuses.
"""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from .job import GPU, JOB_SPEC, STATES, complete_spec, fold_gpu, fold_spec, resolve_secrets, spec_rules
from .references import resolve_service_account
from .job_status import CONDITIONS, COST, ESTIMATE
from .kinds import sweep_cell_count
from .labels import labels_map
from .limits import AdmissionLimits
from .schema import Int, KindSchema, List, Map, Obj, Resolution, Scalar, Str, get, money, strings

MAX_CELLS = 10_000
"""The most cells one Sweep may create (product of the non-empty dimensions × repetitions).

The spec pages set no bound; 10,000 matches Job's largest completions, and keeps a Sweep's status
(one entry per cell) within what one stored object can hold."""

_PARAM_NAME = r"^[A-Z][A-Z0-9_]*$"


def _param_values(values: list[Any], path: str) -> list[Cause]:
    return [] if values else [errors.required(path, "a parameter needs at least one value")]


def _sweep_status() -> Obj:
    s = lambda d="": Str(description=d)  # noqa: E731 - a local shorthand for the long status tree
    i = lambda d="": Int(description=d)  # noqa: E731
    return Obj(description="SweepStatus is what Nodus observed about a Sweep.", fields={
        "best": Obj(description="SweepBest points at the best succeeded cells.", fields={
            "byCost": i("ByCost is the index of the cheapest succeeded cell."),
            "byThroughput": i("ByThroughput is the index of the succeeded cell with the most units per second.")}),
        "cells": List(description="Cells has one entry per cell, in index order. A Sweep of more cells than the "
                                  "coordinator's summary threshold (256) stores only its summary and is served "
                                  "this list built from its cell Jobs.", items=Obj(
            description="SweepCell is one cell of the matrix and what it measured.", fields={
                "costUSD": s("CostUSD is what the cell has cost."),
                "gpu": s("GPU is the cell’s GPU request, when the matrix sweeps GPUs."),
                "index": i("Index is the cell’s position; the cell Job is named after the Sweep and the index."),
                "object": s("Object is the cell Job’s name."),
                "params": Map(description="Params are the cell’s parameter values.", values=s()),
                "phase": s("Phase is the cell Job’s phase; Pending before the Job exists."),
                "region": s("Region is the cell’s region, when the matrix sweeps regions."),
                "repetition": i("Repetition counts from 0."),
                "unitsPerSecond": s("UnitsPerSecond is the throughput the program reported, as a decimal string."),
                "wallSeconds": i("WallSeconds is the cell’s wall time from start to completion.")})),
        "cellCounts": Map(description="CellCounts is how many cells are in each phase (Pending counts the cells "
                                      "not created yet); a Sweep's summary, stored for every Sweep.", values=i()),
        "completionTime": s("CompletionTime is when the Sweep reached a terminal phase."),
        "conditions": List(description="Conditions are the Sweep’s conditions.", items=CONDITIONS.items),
        "cost": COST,
        "estimate": ESTIMATE,
        "message": s("Message explains the phase in a sentence."),
        "observedGeneration": i("ObservedGeneration is the spec generation this status reflects."),
        "phase": s("Phase is the lifecycle phase, from the run-to-completion vocabulary."),
        "reason": s("Reason is the machine-readable reason for the phase, for example CellsFailed or MaxCostReached."),
        "startTime": s("StartTime is when the first cell Job was created."),
    })


SWEEP_SPEC = Obj(
    description="SweepSpec describes a Sweep. Everything is immutable after create except maxParallel, maxCostUSD "
                "(raise only) and state.",
    required=("template",),
    fields={
        "matrix": Obj(
            description="SweepMatrix lists the values of each swept dimension. An empty dimension keeps the "
                        "template’s value.",
            fields={
                "gpu": List(description="GPU overrides resources.gpu per cell, at most 16 values, in the same "
                                        "“H100:1” form.", items=GPU, max_items=16),
                "params": Map(description="Params maps an environment variable name (upper case, digits and "
                                          "underscores) to its values; each cell gets NODUS_PARAM_<NAME>.",
                              key_pattern=_PARAM_NAME,
                              key_message="must be upper case letters, digits and underscores, starting with a "
                                          f"letter (regex used for validation is '{_PARAM_NAME}')",
                              values=List(items=Scalar(), checks=(_param_values,))),
                "regions": strings("Regions narrows placement.regions to one region per cell; it may narrow, never "
                                   "widen, the template’s.", unique=True),
            }),
        "maxCostUSD": money("MaxCostUSD is one cap shared by every cell. Reaching it suspends every running cell with "
                            "MaxCostReached; raising it resumes them."),
        "maxParallel": Int(description="MaxParallel is how many cells may run at once, 1 to 256; the default is 4.",
                           minimum=1, maximum=256, default=4),
        "repetitions": Int(description="Repetitions runs every combination this many times, 1 to 64; the default "
                                       "is 1.", minimum=1, maximum=64, default=1),
        "state": Str(description="State is the desired state: Running (the default), Suspended, or Cancelled, the "
                                 "cancel state. It propagates to the cells.", enum=STATES, default="Running"),
        "template": Obj(description="SweepTemplate is the object every cell creates.", required=("spec",),
                        materialize=False, fields={
                            "kind": Str(description="Kind is the cell kind: Job.", enum=("Job",), default="Job"),
                            "metadata": Obj(description="Metadata is every cell Job's: its labels, with the Sweep's own "
                                                        "labels over them and nodus.dev/sweep and nodus.dev/cell "
                                                        "last, so a Budget selecting the Sweep's labels caps its "
                                                        "cells.", fields={
                                "labels": labels_map("Labels are copied onto every cell Job, under the Sweep's "
                                                     "own labels.")}),
                            "spec": JOB_SPEC,
                        }),
    },
)


def fold_body(body: dict[str, Any]) -> list[Cause]:
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return []
    causes: list[Cause] = []
    template = spec.get("template")
    if isinstance(template, dict):
        causes += fold_spec(template.get("spec"), "spec.template.spec")
    gpus = get(spec, "matrix.gpu")
    if isinstance(gpus, list):
        for i, gpu in enumerate(gpus):
            gpus[i], found = fold_gpu(gpu, f"spec.matrix.gpu[{i}]")
            causes += found
    return causes


def complete_body(body: dict[str, Any]) -> None:
    template = get(body, "spec.template.spec")
    if isinstance(template, dict):
        complete_spec(template)


def body_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return []
    causes: list[Cause] = []
    template = get(spec, "template.spec")
    if isinstance(template, dict):
        causes += spec_rules(template, limits, "spec.template.spec")
        allowed = get(template, "placement.regions") or []
        for i, region in enumerate(get(spec, "matrix.regions") or []):
            if allowed and region not in allowed:
                causes.append(errors.invalid_value(
                    f"spec.matrix.regions[{i}]", region,
                    "may narrow, never widen, spec.template.spec.placement.regions (" + ", ".join(allowed) + ")"))
    cells = sweep_cell_count(spec)
    if cells > MAX_CELLS:
        causes.append(errors.invalid_value("spec.matrix", cells,
                                           f"must make at most {MAX_CELLS} cells (the product of the non-empty "
                                           "dimensions times spec.repetitions)"))
    return causes


async def _resolve(body: dict[str, Any], lookup: Any, project: str) -> Resolution:
    # Cells pin their own versions when they are admitted; here only existence and keys are checked.
    template = get(body, "spec.template.spec")
    if not isinstance(template, dict):
        return Resolution()
    found = await resolve_secrets(template, lookup, project, "spec.template.spec")
    return Resolution(found.causes + await resolve_service_account(template, lookup, project, "spec.template.spec"))


SWEEP = KindSchema(
    kind="Sweep",
    description="Sweep fans a Job template out over a matrix of GPUs, regions and parameters, and reports cost, "
                "wall time and throughput per cell. Parameters reach a Job as NODUS_PARAM_<NAME>.",
    body=Obj(fields={"spec": SWEEP_SPEC}, required=("spec",)),
    status=_sweep_status(),
    rules=body_rules,
    fold=fold_body,
    complete=complete_body,
    resolve=_resolve,
    mutable=("spec.maxParallel", "spec.maxCostUSD", "spec.state"),
    raise_only=("spec.maxCostUSD",),
)
