"""Periodic and requested checkpoints: which CheckpointRequests fall due on a node now (each agent
stream asks). A requested one is the Job's `nodus.dev/checkpoint-requested-at` annotation not handled
yet (controllers/job_requests.py): asked of an attempt whose newest checkpoint is older than it."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from nodus.v1 import agent_pb2

from ..controllers import checkpoints as rules
from ..controllers.attempts import AttemptPhase, phase_of
from ..controllers.cache import Cache, attempt_key
from ..controllers.job_requests import pending_checkpoint, taken_since

Mtbi = Callable[[str], "float | None"]
"""An offering → its measured MTBI (controllers/interruptions.py `of_offering`), for `auto` cadences."""


def _offering(cache: Cache, attempt: dict[str, Any]) -> str:
    """The offering `attempt` (the cache's own dict, read in this same call) runs on, from the cache's view."""
    view = cache.attempt_view(attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"]))
    return view.offering if view is not None else ""


def _requested(attempt: dict[str, Any], requested_at: float | None) -> bool:
    """A checkpoint the Job's annotation asks for that `attempt` (running) has not taken yet."""
    return (requested_at is not None and phase_of(attempt) is AttemptPhase.RUNNING
            and not taken_since((attempt.get("status") or {}).get("checkpoints") or [], requested_at))


def _gang_due(cache: Cache, spec: dict[str, Any], attempt: dict[str, Any], same: Sequence[dict[str, Any]],
              now: float, mtbi: Mtbi, requested_at: float | None = None) -> tuple[bool, int]:
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
    return (due or _requested(rank0, requested_at)) and phase_of(attempt) is AttemptPhase.RUNNING, 0


CADENCE_TICK = 5.0
"""How often each agent stream checks whether a Periodic checkpoint fell due (intervals are ≥ 1m)."""


def due_requests(cache: Cache, node: str, now: float, asked: dict[str, tuple[int, float]],
                 mtbi: Mtbi = lambda offering: None) -> list[agent_pb2.CheckpointRequest]:
    """Periodic and requested CheckpointRequests due on `node` now. `asked` (attempt id → (seq, when)) is the
    stream's memory of what it asked, so a request is repeated only when its checkpoint never came."""
    out = []
    live = cache.live_attempts_on(node)  # a node's finished attempts only grow: they ask for nothing
    for gone in asked.keys() - {a["spec"]["id"] for a in live}:
        del asked[gone]
    for attempt in live:
        spec = attempt["spec"]
        if spec.get("stop"):
            asked.pop(spec["id"], None)
            continue
        job = cache.job(attempt["metadata"]["namespace"], spec["job"]) or {}
        if (job.get("metadata") or {}).get("uid") != spec.get("jobUID"):
            continue
        job_spec = job.get("spec") or {}
        requested_at = (pending_checkpoint((job.get("metadata") or {}).get("annotations") or {},
                                           (job.get("status") or {}).get("handledRequests") or {})
                        if rules.continuity(job_spec) == "Checkpointed" else None)
        # The index's attempts only (what the cadence reads): a walk over the whole Job per live attempt and tick
        # made a Job of n indexes O(n²) (ADR 0109).
        siblings = cache.attempts_of_index(attempt["metadata"]["namespace"], spec["job"], int(spec.get("index", 0)))
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
            if dcp:  # every part of one seq, asked when rank 0 is due or has not taken the requested one
                due, seq = _gang_due(cache, job_spec, attempt, same, now, mtbi, requested_at)
                requested = due and requested_at is not None
                due = due and not requested
            else:
                due, seq = rules.periodic_due(job_spec, attempt, siblings, now, own_mtbi)[0], 0
                requested = _requested(attempt, requested_at)
        else:
            due, seq = rules.periodic_due(job_spec, attempt, siblings, now, own_mtbi)[0], 0
            requested = _requested(attempt, requested_at)
        if not (due or requested):
            continue
        seq = seq or rules.next_seq(same)  # only once due: it reads every committed checkpoint
        before = asked.get(spec["id"])
        if before is not None and before[0] == seq and now - before[1] < rules.interval(job.get("spec") or {}, same,
                                                                                         own_mtbi):
            continue
        asked[spec["id"]] = (seq, now)
        why = agent_pb2.CHECKPOINT_REASON_REQUESTED if requested else agent_pb2.CHECKPOINT_REASON_PERIODIC
        out.append(agent_pb2.CheckpointRequest(attempt_id=spec["id"], reason=why, seq=seq))
    return out
