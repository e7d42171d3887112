"""The Job decision's side of recovery, on views: status.checkpoint, status.storage, the stops of a
customer suspend and what counts as progress interrupted.

Pure, like `job.decide` that calls it: the Job's and its Attempts' views and `now` in, values out.
The checkpoint rules themselves (fencing, which checkpoint is complete, the cadence, retention) are
`checkpoints.py`'s, shared with the checkpoint service that reads stored Attempts.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..clock import duration
from . import checkpoints as rules
from .attempt_machine import AttemptPhase
from .reasons import AttemptReason
from .views import AttemptView, JobView


def records(attempts: Iterable[AttemptView]) -> list[dict[str, Any]]:
    """The committed checkpoint records of these attempts, by seq."""
    return rules.by_seq(dict(c) for a in attempts for c in a.checkpoints)


def job_checkpoint_status(job: JobView, mine: Sequence[AttemptView],
                          mtbi: float | None = None) -> dict[str, Any] | None:
    """status.checkpoint: the latest committed checkpoint, the cadence (for `auto`, on the current
    attempt's offering: `mtbi`), and what the current attempt restored."""
    done = records(mine)
    found = rules.complete_records(done)
    top = found[-1] if found else None
    current = max(mine, key=lambda a: a.number, default=None)
    restored = current.restored_from_seq if current is not None else 0
    if top is None and not restored:
        return None
    out: dict[str, Any] = {}
    if top is not None:
        out.update(seq=int(top["seq"]), time=top.get("time"), size=int(top.get("size") or 0))
    if job.continuity == "Checkpointed":
        out["interval"] = duration(rules.cadence(job.checkpoint_interval, done, mtbi))
    if restored:
        out["restoredFromSeq"] = restored
    return out


def storage_bytes(mine: Sequence[AttemptView], outputs: Sequence[dict[str, Any]] | None,
                  checkpoints: bool = True) -> tuple[int, int]:
    """(owned, held): checkpoints (unless released: `checkpoints` False) plus outputs and logs, in bytes;
    `held` leaves out checkpoints in the customer's own bucket, which the customer's provider bills."""
    kept = records(mine) if checkpoints else []
    outs = sum(int(o.get("size") or 0) for o in outputs or []) + sum(a.log_bytes for a in mine)
    owned = sum(int(c.get("size") or 0) for c in kept)
    held = sum(int(c.get("size") or 0) for c in kept if not rules.in_s3(c))
    return owned + outs, held + outs


def storage_status(total: int, held: int | None = None, free: int = rules.FREE_STORAGE_BYTES) -> dict[str, int] | None:
    """status.storage: the bytes a Job owns and the share of those Nodus holds (`held`, default all)
    above the free inclusion."""
    held = total if held is None else held
    return {"bytes": total, "billedBytes": max(0, held - free)} if total else None


def suspend_failed(attempt: AttemptView, generation: int) -> int:
    """Failed suspend checkpoints recorded on an attempt for this generation of the Job's spec."""
    failed = attempt.suspend_failed or {}
    return int(failed.get("tries") or 0) if int(failed.get("generation") or 0) == generation else 0


def suspend(job: JobView, live: Sequence[AttemptView], mine: Sequence[AttemptView]) -> tuple[list[Any], int]:
    """The stops of a customer suspend, and the failures that keep the Job running (0: none).

    A running attempt of a Checkpointed Job is asked to checkpoint first (StopAttempt.checkpoint_seq:
    the agent gets a Suspend) with a seq above every committed or already asked seq of its index; one
    whose suspend checkpoint already failed SUSPEND_TRIES times for this spec generation keeps running."""
    from .job import StopAttempt  # noqa: PLC0415 - job.py imports this module

    stops: list[Any] = []
    failed = 0
    for a in live:
        tries = suspend_failed(a, job.generation)
        if tries >= rules.SUSPEND_TRIES:
            failed = max(failed, tries)
            continue
        if a.stop_requested:
            continue
        running = a.placed and a.started is not None and a.phase is AttemptPhase.RUNNING
        seq = 0
        if running and job.continuity == "Checkpointed":
            same = [m for m in mine if m.job_uid == a.job_uid and m.index == a.index]
            seq = rules.seq_after(records(same), (m.checkpoint_seq_asked for m in same))
        stops.append(StopAttempt(a.name, AttemptReason.SUSPENDED, checkpoint_seq=seq))
    return stops, failed


def made_progress(attempt: AttemptView, min_progress: float) -> bool:
    """Whether a (Lost) attempt's main command ran at least `min_progress` seconds: such a loss is
    progress interrupted, not a replacement that failed to get going, and is not counted against
    recovery.maxAttempts."""
    if attempt.started is None:
        return False
    ended = attempt.finished or attempt.lost_at
    return ended is not None and ended - attempt.started >= min_progress
