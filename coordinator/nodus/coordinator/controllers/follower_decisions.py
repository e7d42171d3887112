"""A follower's Job creates carry their first decision too, written under the leader's epoch (ADR 0122).

On the leader a Job that will wait is created with its Queued status and first attempts in one commit
(ADR 0108, `JobController.decide_first`). A follower has the same Job controller, fed by the same cache, that
only its leader runs; it can make that first decision as well, and write it under the fence of the epoch its
last claim of the lease saw: the store commits the group only while the lease is still at that epoch, so a
decision made in a term that has ended is refused whole (LeaderDeposed) and the create falls back to the plain
one, which the new leader reconciles. The first decision is a create: no other decision can have been made on
the Job before it, and every later one is the leader's reconcile of what the store holds.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..store.base import Record
from ..store.lease import CONTROLLERS, Fence
from .job_controller import FirstDecision, JobController
from .leader import Leadership


class FollowerDecisions:
    """The resource service's `FirstDecider` while this replica follows: the local Job controller's decision,
    fenced with the epoch last seen; None (the plain create) while no claim has answered yet."""

    def __init__(self, jobs: JobController, leadership: Leadership) -> None:
        self._jobs, self._leadership = jobs, leadership

    @property
    def fence(self) -> Fence | None:
        seen = self._leadership.seen
        return None if seen is None else Fence(CONTROLLERS, seen.epoch)

    def decide_first(self, project: str, job: dict[str, Any]) -> FirstDecision | None:
        if self._leadership.seen is None:
            return None  # no epoch to write it under: left to the leader
        return self._jobs.decide_first(project, job)

    def first_written(self, records: Sequence[Record], first: FirstDecision, job: dict[str, Any]) -> None:
        # Into this replica's cache only: the leader's reconcile records what is settled and the wake-ups.
        self._jobs.first_written(records, first, job, lead=False)
