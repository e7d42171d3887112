"""A node reclaimed (a preemption notice): its attempts checkpoint within the grace, then stop."""
from __future__ import annotations

from typing import Any

from ..clock import rfc3339
from ..controllers import checkpoints as rules
from ..controllers.attempts import AttemptPhase, phase_of
from ..controllers.cache import Cache, attempt_key
from ..controllers.job_controller import stop
from ..controllers.objects import Objects
from ..controllers.reasons import AttemptReason


async def reclaim(cache: Cache, objects: Objects, node: str, grace_seconds: int, now: float) -> int:
    """A preemption notice for every attempt on `node`: a running attempt of a Checkpointed Job
    checkpoints (reason Preemption) within the grace and then stops; any other stops at once. Either
    way the stop reason is Preempted, so the attempt is recorded Lost (counted against
    recovery.maxAttempts) and replaced elsewhere, restoring the latest checkpoint. Returns how many
    attempts were asked to checkpoint."""
    asked = 0
    for attempt in cache.attempts_on(node):
        if phase_of(attempt).terminal:
            continue
        project, spec = attempt["metadata"]["namespace"], attempt["spec"]
        job = cache.job(project, spec["job"]) or {}
        if spec.get("gang"):
            asked += await _reclaim_gang(cache, objects, attempt, job, grace_seconds, now)
            continue
        seq = 0
        if phase_of(attempt) is AttemptPhase.RUNNING and rules.continuity(job.get("spec") or {}) == "Checkpointed":
            index = int(spec.get("index", 0))
            siblings = rules.index_attempts(cache.attempts_of_index(project, spec["job"], index), spec.get("jobUID", ""),
                                            index)
            seq = rules.next_seq(siblings)
        asked += await _notice(objects, attempt, AttemptReason.PREEMPTED, grace_seconds, now, seq)
    return asked


async def _notice(objects: Objects, attempt: dict[str, Any], reason: AttemptReason, grace_seconds: int, now: float,
                  seq: int) -> int:
    """Stops `attempt` for `reason` within the grace, checkpointing `seq` first (0: none) by the
    deadline; 1 when a checkpoint was asked for."""
    mutation = stop(reason, grace_seconds, now, seq)

    def noticed(obj: dict[str, Any]) -> dict[str, Any] | None:
        new = mutation(obj)
        if new is not None and seq:
            new["spec"]["stop"]["checkpointDeadline"] = rfc3339(now + grace_seconds)
        return new
    key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])
    return 1 if await objects.mutate(key, noticed) is not None and seq else 0


async def _reclaim_gang(cache: Cache, objects: Objects, attempt: dict[str, Any], job: dict[str, Any],
                        grace_seconds: int, now: float) -> int:
    """A gang member's node is reclaimed: the whole gang checkpoints with one seq (every rank its part
    for Dcp, rank 0 its state for a Snapshot) within the grace, then stops; the reclaimed member is
    Preempted (Lost: the gang restarts at the next epoch from that checkpoint), the others GangRestart."""
    project, spec = attempt["metadata"]["namespace"], attempt["spec"]
    epoch = int(spec["gang"].get("epoch") or 0)
    siblings = cache.attempts_of(project, spec["job"])
    members = [m for m in siblings if ((m.get("spec") or {}).get("gang") or {}).get("epoch") == epoch
               and (m.get("spec") or {}).get("jobUID") == spec.get("jobUID") and not phase_of(m).terminal]
    job_spec = job.get("spec") or {}
    dcp = ((job_spec.get("recovery") or {}).get("checkpoint") or {}).get("format") == "Dcp"
    running = (all(phase_of(m) is AttemptPhase.RUNNING for m in members)
               and len(members) == int(spec["gang"].get("size") or 0))
    seq = 0
    if running and rules.continuity(job_spec) == "Checkpointed":
        seq = rules.next_seq(rules.index_attempts(siblings, spec.get("jobUID", ""), 0))
    asked = 0
    for m in members:
        rank = int(m["spec"]["gang"].get("rank") or 0)
        reason = AttemptReason.PREEMPTED if m["spec"]["id"] == spec["id"] else AttemptReason.GANG_RESTART
        asked += await _notice(objects, m, reason, grace_seconds, now, seq if dcp or rank == 0 else 0)
    return asked
