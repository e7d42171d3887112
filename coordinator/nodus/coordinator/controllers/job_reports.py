"""An agent's report of an attempt, written in one commit with what the Job controller decides on it
(docs/adr/0127-a-report-is-written-with-its-jobs-decision.md).

Without this, a report that moves an attempt (RUNNING, SUCCEEDED …) is one commit, and the Job controller,
woken by it, decides the Job again and writes what that changes (the Job Running, an index counted and the
next index's attempt created) in a second commit after it: two commits and a queue hop between the agent's
report and what the Job's watchers see. Here, where this replica leads and no reconcile of the Job is queued
or running (the Job's key is claimed from the controller's queue, so none starts meanwhile), the report's
writer makes that decision itself, with the controller's own code on the cache's Job and attempts with the
report applied, and writes the attempt, the Job's status and the new attempts as one group: all of them or
none, each compared on the revision it was decided from, under the controller's lease. Only a decision that
creates (or changes nothing) goes this way; one that stops or deletes is left to the controller. A refused
group (the Job or the attempt changed, a deposed leader) costs nothing but the plain write after it. The
claimed key is released after the commit, and the reconcile that the writes queue then decides again on what
was written, as the controller's own writes are (finding nothing more to do).
"""
from __future__ import annotations

from typing import Any, Callable

import orjson

from ..api.jsondoc import copy_json
from ..errors import NodusError
from ..store.base import Store
from ..store.lease import FENCE
from .cache import job_key, owner_of
from .job_controller import JobController
from .objects import Mutation, Objects, encode

StatusDocument = Callable[[dict[str, Any], Any], "tuple[dict[str, Any], int] | None"]
"""(a Job as stored, a status) → the Job with that status admitted over it and the revision it was read at, or
None when the admitted status is the stored one (status_write.status_document for Jobs)."""

_REFUSED = ("Conflict", "NotFound", "AlreadyExists", "LeaderDeposed")


class ReportWriter:
    def __init__(self, objects: Objects, store: Store, status_document: StatusDocument) -> None:
        self.objects, self.store, self.cache = objects, store, objects.cache
        self._status_document = status_document
        self.jobs: JobController | None = None
        """The Job controller while this replica leads it (set by the control plane); None: plain writes only."""
        self.together = 0
        """Reports written with their Job's decision (what the path saves shows here)."""

    async def mutate(self, key: str, mutation: Mutation) -> None:
        """Writes the report `mutation` makes of the attempt at `key` (as `Objects.mutate`), with its Job's
        decision where it can."""
        jobs = self.jobs
        if jobs is None or not self.store.creates_together or not await self._with_decision(jobs, key, mutation):
            await self.objects.mutate(key, mutation)

    async def _with_decision(self, jobs: JobController, key: str, mutation: Mutation) -> bool:
        """True when the report is written (or changes nothing); False: left to the plain write."""
        cached, revision = self.cache.get(key), self.cache.revision(key)
        if cached is None or revision is None:
            return False
        project, name = owner_of(cached)
        jkey = job_key(project, name)
        if not jobs.queue.claim(jkey):
            return False  # a reconcile of the Job is queued or running: it decides after the plain write
        try:
            attempt = mutation(copy_json(cached))
            if attempt is None or attempt == cached:
                return True
            decided = jobs.decide_report(project, name, attempt)
            if decided is None:
                return False
            items: list[tuple[str, bytes, int | None]] = [(key, encode(attempt), revision)]
            written = None if decided.status is None else self._status_document(decided.job, decided.status)
            if written is not None:
                items.append((jkey, orjson.dumps(written[0]), written[1]))
            items += [(k, encode(a), None) for k, a in decided.attempts.items()]
            fence = FENCE.set(jobs.fence)  # the controller's writes, under its lease (as its own reconcile's)
            try:
                records = await self.store.write_together(items)
            except NodusError as e:
                if e.reason in _REFUSED:
                    return False
                raise
            finally:
                FENCE.reset(fence)
            self.cache.apply_written(records, [attempt, *([written[0]] if written is not None else []),
                                               *decided.attempts.values()])
            self.together += 1
            return True
        finally:
            jobs.queue.done(jkey)  # and the writes' own events decide it again after
