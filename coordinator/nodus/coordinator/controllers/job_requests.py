"""Requests a user makes of a running Job through an annotation (pure).

`nodus.dev/checkpoint-requested-at: <RFC 3339 time>` (`nodus checkpoint now JOB`, or `kubectl
annotate`) asks for a checkpoint of every running attempt at once, beside the cadence. The agent
streams send the request (checkpoints/cadence.py); the Job controller records the annotation's value
in `status.handledRequests.checkpoint` once every attempt that checkpoints for the Job (each running
index's attempt, a gang's rank 0) holds a checkpoint taken at or after that time, or the Job ended.
A request made while nothing runs is taken when the Job runs again. The time is the requester's
clock: an agent whose clock lags it is asked again until its checkpoint is stamped after it.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..api.job_annotations import CHECKPOINT_REQUESTED
from ..clock import parse
from .attempts import AttemptPhase
from .views import AttemptView

__all__ = ["CHECKPOINT", "CHECKPOINT_REQUESTED", "checkpoint_handled", "pending_checkpoint", "taken_since"]
CHECKPOINT = "checkpoint"
"""The action's key in status.handledRequests."""


def pending_checkpoint(annotations: Mapping[str, Any], handled: Mapping[str, Any]) -> float | None:
    """The requested time of a checkpoint request not handled yet, else None."""
    value = annotations.get(CHECKPOINT_REQUESTED)
    if not isinstance(value, str) or not value or handled.get(CHECKPOINT) == value:
        return None
    return parse(value)


def taken_since(checkpoints: Sequence[Mapping[str, Any]], at: float) -> bool:
    """Whether one of an attempt's checkpoint records was taken at or after `at`."""
    return any((parse(c.get("time")) or 0.0) >= at for c in checkpoints)


def checkpoint_handled(requested: str, handled: Mapping[str, Any], live: Sequence[AttemptView],
                       ended: bool) -> str | None:
    """The request value to record in status.handledRequests.checkpoint now, or None."""
    at = pending_checkpoint({CHECKPOINT_REQUESTED: requested}, handled)
    if at is None:
        return None
    if ended:
        return requested
    takers = [a for a in live if a.phase is AttemptPhase.RUNNING and (not a.in_gang or a.rank == 0)]
    if takers and all(taken_since(a.checkpoints, at) for a in takers):
        return requested
    return None
