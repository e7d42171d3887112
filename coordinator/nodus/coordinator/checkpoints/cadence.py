"""Periodic checkpoints: which CheckpointRequests fall due on a node now (each agent stream asks)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from nodus.v1 import agent_pb2

from ..controllers import checkpoints as rules
from ..controllers.attempts import AttemptPhase, phase_of
from ..controllers.cache import Cache, attempt_key

Mtbi = Callable[[str], "float | None"]
"""An offering → its measured MTBI (controllers/interruptions.py `of_offering`), for `auto` cadences."""


def _offering(cache: Cache, attempt: dict[str, Any]) -> str:
    """The offering `attempt` (the cache's own dict, read in this same call) runs on, from the cache's view."""
    view = cache.attempt_view(attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"]))
    return view.offering if view is not None else ""


def _gang_due(cache: Cache, spec: dict[str, Any], attempt: dict[str, Any], same: Sequence[dict[str, Any]],
              now: float, mtbi: Mtbi) -> tuple[bool, int]:
    """For one member of a Dcp gang: whether to ask it for a part now, and which seq (0: a new one). A
    seq some member of the epoch already stored is asked of the others (so the parts meet); otherwise
    a new seq, when rank 0's cadence is due."""
    gang = attempt["spec"]["gang"]
    epoch = [s for s in same if ((s.get("spec") or {}).get("gang") or {}).get("epoch") == gang.get("epoch")
             and not phase_of(s).terminal]
    stored = {int(c.get("seq", 0)) for s in epoch for c in (s.get("status") or {}).get("checkpoints") or []}
    mine = {int(c.get("seq", 0)) for c in (attempt.get("status") or {}).get("checkpoints") or []}
    pending = sorted(stored - mine)
    if pending:
        return phase_of(attempt) is AttemptPhase.RUNNING, pending[-1]
    rank0 = next((s for s in epoch if int(((s.get("spec") or {}).get("gang") or {}).get("rank") or 0) == 0), None)
    if rank0 is None:
        return False, 0
    due, _ = rules.periodic_due(spec, rank0, same, now, mtbi(_offering(cache, rank0)))
    return due and phase_of(attempt) is AttemptPhase.RUNNING, 0


CADENCE_TICK = 5.0
"""How often each agent stream checks whether a Periodic checkpoint fell due (intervals are ≥ 1m)."""


def due_requests(cache: Cache, node: str, now: float, asked: dict[str, tuple[int, float]],
                 mtbi: Mtbi = lambda offering: None) -> list[agent_pb2.CheckpointRequest]:
    """Periodic CheckpointRequests due on `node` now. `asked` (attempt id → (seq, when)) is the
    stream's memory of what it asked, so a request is repeated only when its checkpoint never came."""
    out = []
    for attempt in cache.attempts_on(node):
        spec = attempt["spec"]
        if phase_of(attempt).terminal or spec.get("stop"):
            asked.pop(spec["id"], None)
            continue
        job = cache.job(attempt["metadata"]["namespace"], spec["job"]) or {}
        if (job.get("metadata") or {}).get("uid") != spec.get("jobUID"):
            continue
        siblings = cache.attempts_of(attempt["metadata"]["namespace"], spec["job"])
        same = rules.index_attempts(siblings, spec.get("jobUID", ""), int(spec.get("index", 0)))
        gang = spec.get("gang") or {}
        own_mtbi = mtbi(_offering(cache, attempt))
        if gang:
            # A gang's Snapshot is rank 0's state (every rank holds the same replica); a Dcp checkpoint
            # is every rank's part of the same seq, asked when rank 0's cadence says so.
            dcp = (((job.get("spec") or {}).get("recovery") or {}).get("checkpoint") or {}).get("format") == "Dcp"
            if not dcp and int(gang.get("rank") or 0):
                asked.pop(spec["id"], None)
                continue
            if dcp:
                due, seq = _gang_due(cache, job.get("spec") or {}, attempt, same, now, mtbi)
            else:
                due, seq = rules.periodic_due(job.get("spec") or {}, attempt, siblings, now, own_mtbi)[0], 0
        else:
            due, seq = rules.periodic_due(job.get("spec") or {}, attempt, siblings, now, own_mtbi)[0], 0
        if not due:
            continue
        seq = seq or rules.next_seq(same)  # only once due: it reads every committed checkpoint
        before = asked.get(spec["id"])
        if before is not None and before[0] == seq and now - before[1] < rules.interval(job.get("spec") or {}, same,
                                                                                         own_mtbi):
            continue
        asked[spec["id"]] = (seq, now)
        out.append(agent_pb2.CheckpointRequest(attempt_id=spec["id"], reason=agent_pb2.CHECKPOINT_REASON_PERIODIC,
                                               seq=seq))
    return out
