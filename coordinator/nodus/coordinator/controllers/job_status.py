"""The parts of a Job's status derived from its Attempts, and the conditions helpers (pure).

Kept apart from `job.py` so that the decision reads as the state machine it is: `decide` says what
phase the Job is in and what to do; these say what its progress, unit timings and outputs are.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Mapping

from ..clock import parse, rfc3339
from .assignment import VOLUME_OUTPUT
from .attempts import AttemptPhase
from .views import AttemptView


def put(status: dict[str, Any], key: str, value: Any) -> None:
    """Sets `key`, or removes it when the value is empty (an empty field is left out, not written)."""
    if value:
        status[key] = value
    else:
        status.pop(key, None)


def condition(conditions: list[dict[str, Any]], type_: str) -> str | None:
    return next((c.get("status") for c in conditions if c.get("type") == type_), None)


def condition_time(conditions: list[dict[str, Any]], type_: str) -> str | None:
    return next((c.get("lastTransitionTime") for c in conditions if c.get("type") == type_), None)


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  now: float, generation: int) -> list[dict[str, Any]]:
    """Sets one condition; lastTransitionTime moves only when its status changes (API conventions)."""
    out, found = [], False
    for c in conditions:
        if c.get("type") == type_:
            found = True
            moved = c.get("status") != status
            c = {"type": type_, "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": rfc3339(now) if moved else c.get("lastTransitionTime", rfc3339(now)),
                 "observedGeneration": generation}
            if not message:
                del c["message"]
        out.append(c)
    if not found:
        c = {"type": type_, "status": status, "reason": reason, "message": message,
             "lastTransitionTime": rfc3339(now), "observedGeneration": generation}
        if not message:
            del c["message"]
        out.append(c)
    return out


GPU_UNHEALTHY = "GpuUnhealthy"
"""The warning code an Attempt on an unhealthy GPU carries in status.warnings (gpu_warnings.py)."""
GPU_HEALTHY = "GpuHealthy"
"""The Job condition that turns False while one of its live attempts runs on an unhealthy GPU."""


def gpu_condition(conditions: list[dict[str, Any]], live: list[AttemptView], now: float,
                  generation: int) -> list[dict[str, Any]]:
    """GpuHealthy False naming each live attempt's unhealthy GPU; back to True once none is (and left
    out of a Job that never had one)."""
    warned = [(a, w) for a in live for w in a.warnings if w.get("code") == GPU_UNHEALTHY]
    if warned:
        message = "; ".join(f"attempt {a.name}: {w.get('message', '')}" for a, w in warned)
        return set_condition(conditions, GPU_HEALTHY, "False", GPU_UNHEALTHY, message, now, generation)
    if condition(conditions, GPU_HEALTHY) == "False":
        return set_condition(conditions, GPU_HEALTHY, "True", "GpusHealthy", "", now, generation)
    return conditions


# -- progress, unit metrics and outputs, from the attempts ------------------------------------------------

def progress_of(mine: list[AttemptView], completions: int = 0) -> dict[str, Any]:
    """Units summed over the newest reporting attempt of each index; stage and metrics from the latest line.

    The total is the planned total of all `completions` indexes, not of those that reported so far: an
    index that has not reported yet counts as the mean of the totals reported (exact once every index
    has), and one that succeeded without reporting counts for nothing. Without a total on every line
    there is none."""
    newest: dict[int, tuple[int, Mapping[str, Any]]] = {}
    for a in mine:
        p = a.progress
        if p and (a.index not in newest or a.number > newest[a.index][0]):
            newest[a.index] = (a.number, p)
    if not newest:
        return {}
    lines = [p for _, p in newest.values()]
    latest = max(lines, key=lambda p: parse(p.get("time")) or 0.0)
    out: dict[str, Any] = {}
    if latest.get("stage"):
        out["stage"] = latest["stage"]
    if latest.get("metrics"):
        out["metrics"] = dict(latest["metrics"])
    totals = [(p.get("units") or {}).get("total") for p in lines]
    units: dict[str, int] = {"completed": sum(int((p.get("units") or {}).get("completed") or 0) for p in lines)}
    known = [t for t in totals if isinstance(t, int) and t > 0]
    if len(known) == len(totals):
        silent = {a.index for a in mine if a.phase == AttemptPhase.SUCCEEDED} - set(newest)
        planned = max(completions - len(silent), len(known))
        units["total"] = (sum(known) * planned + len(known) // 2) // len(known)
    out["units"] = units
    return out


def unit_metrics(mine: list[AttemptView], progress: dict[str, Any] | None,
                 cost: dict[str, Any] | None = None) -> dict[str, Any]:
    """status.unitMetrics; with a `cost` (status.cost, the money controller's copy of the ledger)
    costPerUnitUSD is what the Job has been charged per completed unit, to a millionth of a dollar."""
    samples = sorted(s for a in mine for s in a.unit_samples_ms)
    out: dict[str, Any] = {}
    if progress and (progress.get("units") or {}).get("completed") is not None:
        out["completed"] = progress["units"]["completed"]
        total = (cost or {}).get("totalUSD")
        if total and int(out["completed"] or 0) > 0:
            out["costPerUnitUSD"] = str((Decimal(str(total)) / int(out["completed"])).quantize(MICRO_USD))
    if samples:
        out["p50Ms"] = percentile(samples, 50)
        out["p95Ms"] = percentile(samples, 95)
    return out


MICRO_USD = Decimal("0.000001")


def percentile(ordered: list[int], p: int) -> int:
    """Nearest rank."""
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[rank - 1]


def committed_outputs(committed: Any, mine: list[AttemptView], completions: int, gang: bool = False,
                      sinks: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Committed outputs only accumulate: those already in status stay (an attempt may be gone, or
    the output was committed by other means), and each succeeded attempt's outputs are added. A gang
    Job's outputs each name the rank that produced them, rank 0 included. An output named in `sinks`
    starts at sink phase Pending; the sink loader (sinks.py) owns the phase from there."""
    out: dict[tuple[int, str, int], dict[str, Any]] = {
        (int(o.get("index") or 0), str(o.get("name")), int(o.get("rank") or 0)): o
        for o in committed or [] if isinstance(o, dict)}
    # Only succeeded attempts with outputs add any, so only they are sorted: decide runs this on every change of
    # a Job, and a sort of all its attempts made a Job of n indexes O(n² log n) (ADR 0109).
    for a in sorted((a for a in mine if a.outputs and a.phase is AttemptPhase.SUCCEEDED and a.index < completions),
                    key=lambda a: (a.index, a.number)):
        for o in a.outputs:
            if str(o.get("name", "")).startswith(VOLUME_OUTPUT):
                continue  # a writable volume's content: the Volume's next revision, not an output of the Job
            item = {"index": a.index, "name": o.get("name", ""), "path": o.get("path", ""),
                    "sha256": o.get("sha256", ""), "size": int(o.get("size") or 0)}
            if o.get("archive"):
                item["directory"] = True  # stored as a tar.zst archive: an output input unpacks it
            if gang or o.get("rank"):
                item["rank"] = int(o.get("rank") or 0)
            key = (a.index, item["name"], int(o.get("rank") or 0))
            if "sink" in out.get(key, {}):
                item["sink"] = out[key]["sink"]  # the sink loader's (sinks.py)
            elif item["name"] in sinks:
                item["sink"] = {"phase": "Pending"}
            out[key] = item
    return [out[k] for k in sorted(out)]
