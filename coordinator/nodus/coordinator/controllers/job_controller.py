"""The Job controller's executor: it runs `job.decide` for a Job and performs what it says.

Driven by the cache (a Job or one of its Attempts changed: the Job's key is queued), by the wake-up
time each decision returns (deadlines, TTLs, queue timeouts) and by a periodic resync that queues
every Job and every Attempt owner, so a missed trigger is only ever late, never lost. Everything it
reads is in the store, so a restarted coordinator simply decides again from there.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..api.attempt import INDEX_LABEL, JOB_LABEL, RANK_LABEL, attempt_name
from ..api.job_folding import effective_image
from ..clock import Clock, rfc3339
from ..errors import NodusError
from ..store.base import Record
from ..store.lease import Fence
from .attempt_machine import Created, Refusal, StoppedUnplaced, phase_of, transition
from .cache import ATTEMPTS, JOBS, Cache, attempt_key, job_key, owner_of
from .checkpoints import FREE_STORAGE_BYTES
from .gang import CreateMember, GangConfig, decide_gang
from .interruptions import Interruptions
from .job import (Action, CreateAttempt, Decision, DeleteAttempt, DeleteJob, JobPhase, StopAttempt, collect_orphans,
                  decide, queued_message, quiet, settles)
from .objects import Objects, new_uid
from .views import AttemptView, JobView, Producer, topology
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.job")

Explainer = Callable[[Sequence[dict[str, Any]], dict[str, Any]], str]
"""(a Job's new attempts, not stored yet; the Job) → the explain placement would write on them now, stamped on each,
when none of them fits any node; "" (nothing stamped) otherwise (PlacementController.explain_new, ADR 0096)."""

RESYNC_SECONDS = 30.0
WORKERS = 64
"""Jobs reconciled at once (`nodus-coordinator --job-workers`). A reconcile spends most of its time waiting
for its writes' commit, so many in flight let the store's group commit share one transaction among them:
bench/sweep.py turns cells over 1.6-2.4 times as fast with 64 as with 4 (ADR 0028)."""


def new_attempt(job: dict[str, Any], index: int, number: int, now: float) -> dict[str, Any]:
    """The Attempt object for one index: Pending, labelled and owned by its Job."""
    meta, spec = job["metadata"], job.get("spec") or {}
    image = effective_image(spec, job.get("status") or {})
    resources = {k: v for k, v in (spec.get("resources") or {}).items() if k != "nodes"}
    attempt_spec: dict[str, Any] = {
        "id": "att-" + secrets.token_hex(8), "job": meta["name"], "jobUID": meta["uid"], "index": index,
        "number": number, "runtime": "oci" if image else "process",
        "command": list(spec.get("command") or []) + list(spec.get("args") or []), "resources": resources,
    }
    if image:
        attempt_spec["image"] = image
    constraints = {k: v for k, v in (spec.get("placement") or {}).items() if k in ("regions", "offerings") and v}
    if constraints:
        attempt_spec["placement"] = constraints
    obj: dict[str, Any] = {
        "apiVersion": "nodus.dev/v1", "kind": "Attempt",
        "metadata": {
            "name": attempt_name(meta["name"], index, number), "namespace": meta["namespace"], "uid": new_uid(),
            "generation": 1, "creationTimestamp": rfc3339(now),
            "labels": {JOB_LABEL: meta["name"], INDEX_LABEL: str(index)},
            "ownerReferences": [{"apiVersion": "nodus.dev/v1", "kind": "Job", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": attempt_spec,
    }
    status = transition(obj, Created())
    assert not isinstance(status, Refusal)  # a new object has no phase yet
    obj["status"] = status
    return obj


def gang_env(topo: Mapping[str, Any], member: CreateMember) -> dict[str, str]:
    """The gang variables a member knows from its creation (its init command sees them), from the Job's
    resolved topology; rendezvous variables come with the start (launchers/contract.py)."""
    per_node = int(topo.get("gpusPerNode") or 0)
    return {"NODUS_RANK": str(member.rank), "NODUS_NODES": str(member.size), "NODUS_GPUS_PER_NODE": str(per_node),
            "NODUS_WORLD_SIZE": str(member.size * max(per_node, 1)), "NODUS_GANG_EPOCH": str(member.epoch)}


def new_member(job: dict[str, Any], member: CreateMember, now: float) -> dict[str, Any]:
    """The Attempt of one gang rank: index 0, numbered by its epoch, with spec.gang."""
    obj = new_attempt(job, 0, member.epoch, now)
    meta = job["metadata"]
    obj["metadata"]["name"] = f"{meta['name']}-{member.epoch}-r{member.rank}"
    obj["metadata"]["labels"][RANK_LABEL] = str(member.rank)
    obj["spec"]["epoch"] = member.epoch
    obj["spec"]["gang"] = {"epoch": member.epoch, "rank": member.rank, "size": member.size}
    # distributed.gpusPerNode (or totalGPUs) without resources.gpu.count: each member reserves its node's share.
    per_node = int(topology(job.get("spec") or {}, (job.get("status") or {}).get("topology")).get("gpusPerNode") or 0)
    gpu = dict(obj["spec"]["resources"].get("gpu") or {})
    if per_node and not gpu.get("count"):
        obj["spec"]["resources"]["gpu"] = {**gpu, "count": per_node}
    placement = dict(obj["spec"].get("placement") or {})
    if member.prefer_node:
        placement["preferNode"] = member.prefer_node
    if member.avoid_nodes:
        placement["avoidNodes"] = list(member.avoid_nodes)
    if placement:
        obj["spec"]["placement"] = placement
    return obj


def stop(reason: str, grace_seconds: int, now: float, checkpoint_seq: int = 0, force: bool = False) -> Any:
    """The mutation that stops an attempt: an unplaced one ends Cancelled at once (no agent has it);
    a placed one gets spec.stop, which its node's stream turns into a Cancel (a Suspend with a
    checkpoint seq). `force` replaces a Suspend asked before with this stop (its stream then sends the
    Cancel); any other stop asked before stands."""
    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        asked = (obj.get("spec") or {}).get("stop")
        if phase_of(obj).terminal or (asked and not (force and asked.get("checkpointSeq") and not checkpoint_seq)):
            return None
        if not obj["spec"].get("node"):
            status = transition(obj, StoppedUnplaced(reason, now))
            if isinstance(status, Refusal):
                log.warning("attempt %s not stopped: %s", obj["metadata"].get("name"), status)
                return None
            obj["status"] = status
            return obj
        obj["spec"]["stop"] = {"reason": reason, "graceSeconds": grace_seconds,
                               "time": (asked or {}).get("time") or rfc3339(now)}  # a forced stop keeps its time
        if checkpoint_seq:
            obj["spec"]["stop"]["checkpointSeq"] = checkpoint_seq  # a Suspend: checkpoint, then stop
        obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
        return obj
    return mutate


def _deletable(obj: dict[str, Any]) -> bool:
    return phase_of(obj).terminal or not (obj.get("spec") or {}).get("node")


@dataclass(frozen=True, slots=True)
class Settled:
    """The revisions a reconcile's own writes left a Job and its attempts at, where `job.settles` shows that
    deciding again on them changes nothing (ADR 0071), or the revisions a decision that changed nothing was
    made on (`job.quiet`, ADR 0086): a reconcile or a resync that finds exactly these before `wake_at` skips
    the Job."""

    job: int
    attempts: Mapping[str, int]
    """Each attempt's key → its revision."""
    wake_at: float | None
    """When time alone changes the decision (the decision's own wake-up)."""


@dataclass(frozen=True, slots=True)
class FirstDecision:
    """A new Job's first decision, made before the Job is stored, so that the Job (created with this status) and
    the attempts it creates are one commit (`JobController.decide_first`, ADR 0108)."""

    status: dict[str, Any]
    """The status to create the Job with: the decision's, with placement's explain in its message (ADR 0096)."""
    attempts: dict[str, dict[str, Any]]
    """The attempts it creates, by key, in the order they are written after the Job."""
    wake_at: float | None
    """The decision's wake-up (a queue timeout)."""


@dataclass(frozen=True, slots=True)
class ReportDecision:
    """A Job's decision on an attempt an agent reported, made before the report is written, so that the report,
    the Job's status and the attempts it creates are one commit (`JobController.decide_report`, ADR 0127)."""

    job: dict[str, Any]
    """The Job as the cache holds it (at its resourceVersion): what the status is written over."""
    status: dict[str, Any] | None
    """The status to write (None: the decision leaves it as it is)."""
    attempts: dict[str, dict[str, Any]]
    """The attempts it creates, by key, in the order they are written."""


class JobWriter(Protocol):
    """What the controller writes to Jobs, as the system: their status (admitted and compared on
    resourceVersion, so a changed Job raises Conflict) and the delete a TTL asks for. The resource
    service implements it; the controller needs nothing else of it."""

    async def write_job_status(self, project: str, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Writes `status` over `job`, the Job as stored at its resourceVersion (the cache's copy); returns
        the Job as written (`job` itself when the admitted status is the stored one)."""

    async def delete_job(self, project: str, name: str) -> None:
        """Deletes the Job (its attempts become orphans the controller collects)."""


class JobController:
    def __init__(self, cache: Cache, objects: Objects, jobs: JobWriter, clock: Clock,
                 workers: int = WORKERS, gangs: GangConfig = GangConfig(),
                 interruptions: Interruptions | None = None, free_storage: int = FREE_STORAGE_BYTES,
                 explain: Explainer | None = None) -> None:
        self.cache, self.objects, self.writer, self.clock = cache, objects, jobs, clock
        self.explain = explain
        """Placement's answer for a Job's first attempts before they are written (None: they are created without)."""
        self.fence: Fence | None = None
        """The lease epoch this controller leads under (set by the control plane): what a Job created with its first
        decision writes its attempts under (`decide_first`, ADR 0108)."""
        self.gangs = gangs
        self.free_storage = free_storage
        """status.storage's free inclusion per Job (`--free-storage`)."""
        self.queue: WorkQueue[str] = WorkQueue()
        self.workers = workers
        self.interruptions = interruptions or Interruptions(cache, clock)
        self._consumers: dict[str, set[str]] = {}
        """A Job's key → the keys of the unfinished Jobs whose `output` inputs name it (decided again when it
        changes, so a consumer starts once its producer commits). Rebuilt by reconciling: a restart loses nothing."""
        self._producers_of: dict[str, frozenset[str]] = {}
        """The inverse: a consumer's key → its producers' keys."""
        self._settled: dict[str, Settled] = {}
        """A Job's key → the state its last reconcile's writes left, when its decision settles (ADR 0071)."""
        cache.listen(JOBS, self._on_job)
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self.queue.add(key, urgent=old is None)  # a new Job's attempt first: placement before status (ADR 0075)
        for consumer in self._consumers.get(key, ()):
            self.queue.add(consumer)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        project, job = owner_of(new or old)  # type: ignore[arg-type]
        self.queue.add(job_key(project, job))

    async def run(self) -> None:
        await self.cache.synced.wait()
        await run_workers(self.queue, self.reconcile, workers=self.workers, resync=self.resync,
                          resync_seconds=RESYNC_SECONDS, log=log, name="job-controller")

    def resync(self) -> None:
        """Queues every Job whose inputs moved since its settled decision (or that has none recorded), its
        wake-up come, and the owner of every attempt whose Job is gone: a settled finished Job costs a
        comparison of revisions, not a decision (ADR 0086)."""
        now = self.clock.now()
        for key, _ in self.cache.under(JOBS):
            if not self._still_settled(key, now):
                self.queue.add(key)
        for project, job in self.cache.attempt_owners():
            key = job_key(project, job)
            if self.cache.revision(key) is None:  # an orphan's: the loop above queued every other
                self.queue.add(key)

    def _still_settled(self, key: str, now: float) -> bool:
        """Whether the Job at `key` and its attempts are at the revisions of its settled record, before its wake-up."""
        settled = self._settled.get(key)
        if settled is None or (settled.wake_at is not None and now >= settled.wake_at):
            return False
        return (settled.job, settled.attempts) == self.cache.job_revisions(key)

    async def reconcile(self, key: str) -> None:
        project, _, name = key[len(JOBS):].partition("/")
        now = self.clock.now()
        if self._still_settled(key, now):
            return  # the state its last decision wrote, or decided on, which it changes nothing of
        self._settled.pop(key, None)
        revision, revisions = self.cache.job_revisions(key)
        view = self.cache.job_view(project, name)
        # The stored Job too: new attempts copy its spec, and the status write is compared on its version.
        job = self.cache.job(project, name)
        attempts = self.cache.attempt_views_of(project, name)
        if job is None or view is None or view.deleting:
            self._watch(key, frozenset())
            await self._execute(project, collect_orphans(attempts), now, {})
            return
        view = self._with_producers(key, view)
        mtbi = self._mtbi(view, attempts)
        prev = job.get("status") or {}
        if view.gang:
            decision = decide_gang(view, attempts, now, self.gangs, mtbi, self.free_storage, prev=prev)
        else:
            decision = decide(view, attempts, now, mtbi=mtbi, free_storage=self.free_storage, prev=prev)
        made = self._made(job, project, decision.actions, now, view.topology)
        status = self._pre_explained(view, attempts, decision, made, job)
        # The actions and the status write go to the store together, so one group commit takes both (a
        # reconcile waited for two commits, one after the other); a status that meets a changed Job is
        # decided again on the new one, with what the actions wrote.
        written: dict[str, Any] | None = job
        if status is None:
            stopped = await self._execute(project, decision.actions, now, made, revisions)
        else:
            stopped, written = await asyncio.gather(
                self._execute(project, decision.actions, now, made, revisions),
                self._write_status(job, project, status))
        if written is None:
            self.queue.add_after(key, 0.02)  # the Job changed meanwhile: decide again on the new one
            return
        ended = {k: rv for k, rv in stopped.items() if rv is not None}  # stopped and created attempts' revisions
        if quiet(view, attempts, decision):
            # Nothing written: the same revisions decide the same nothing until the wake-up (ADR 0086).
            assert revision is not None  # the Job is in the cache: `job` is
            self._settled[key] = Settled(revision, revisions, decision.wake_at)
        elif len(ended) == len(stopped) and settles(view, attempts, decision, prev):
            # What its own writes set off would change nothing (job.settles): skipped while nothing else moves.
            self._settled[key] = Settled(int(written["metadata"]["resourceVersion"]), {**revisions, **ended},
                                         decision.wake_at)
        if any(isinstance(a, DeleteJob) for a in decision.actions):
            await self._delete_job(project, name)
            self.queue.add(key)  # and then its attempts, as orphans
        if decision.wake_at is not None:
            self.queue.add_after(key, decision.wake_at - self.clock.now())

    def decide_first(self, project: str, job: dict[str, Any]) -> FirstDecision | None:
        """What the Job's first reconcile would decide and write, decided on `job` (admitted, its metadata set, not
        stored yet) as that reconcile decides it on the stored Job with no attempts: the caller creates the Job with
        `status` and the attempts in one commit and hands the records to `first_written` (ADR 0108). None where
        the first reconcile is left to do it: the cache not synced (a restart: the Job's inputs are not all
        known), a gang (decide_gang), `output` inputs (their producers), a Job being deleted, and any decision but
        a Queued status with attempts to create that settles (`job.settles`: decided again on what it writes, it
        changes nothing), such as a Job created Suspended or Cancelled."""
        if not self.cache.synced.is_set():
            return None
        view = JobView.from_object(job)
        if view.gang or view.output_inputs or view.deleting:
            return None
        now = self.clock.now()
        prev = job.get("status") or {}
        decision = decide(view, [], now, mtbi=self._mtbi(view, []), free_storage=self.free_storage, prev=prev)
        if (decision.status is None or not decision.actions
                or JobPhase.parse(decision.status.get("phase")) is not JobPhase.QUEUED
                or not settles(view, [], decision, prev)):
            return None
        made = self._made(job, project, decision.actions, now, view.topology)
        status = self._pre_explained(view, [], decision, made, job)
        assert status is not None  # a Queued decision has one
        return FirstDecision(status, made, decision.wake_at)

    def decide_report(self, project: str, name: str, attempt: dict[str, Any]) -> ReportDecision | None:
        """What the Job's reconcile would decide and write once `attempt` (one of its attempts, as an agent's report
        is about to write it) is stored, decided now on the cache's Job and its other attempts, so that the report,
        the status and the attempts it creates are one commit (ADR 0127). None where the reconcile is left to do it:
        the cache not synced, the Job gone or being deleted, a gang (decide_gang), `output` inputs (their
        producers), or a decision that stops or deletes anything (only creates go with a report). The caller
        holds the Job's key (`queue.claim`): no reconcile of it runs meanwhile, and one runs after."""
        if not self.cache.synced.is_set():
            return None
        job, view = self.cache.job(project, name), self.cache.job_view(project, name)
        if job is None or view is None or view.gang or view.output_inputs or view.deleting:
            return None
        reported = AttemptView.from_object(attempt)
        attempts = [reported if a.name == reported.name else a for a in self.cache.attempt_views_of(project, name)]
        now = self.clock.now()
        decision = decide(view, attempts, now, mtbi=self._mtbi(view, attempts), free_storage=self.free_storage,
                          prev=job.get("status") or {})
        if not all(isinstance(a, CreateAttempt) for a in decision.actions):
            return None
        made = self._made(job, project, decision.actions, now, view.topology)
        return ReportDecision(job, self._pre_explained(view, attempts, decision, made, job), made)

    def first_written(self, records: Sequence[Record], first: FirstDecision, job: dict[str, Any], *,
                      lead: bool = True) -> None:
        """The Job and its first attempts as one commit stored them (the Job's record first): into the cache, and
        the Job recorded settled at those revisions, as its reconcile records its own writes (ADR 0071), so the
        reconcile their events set off skips it. If this is never called (the create was cancelled after its
        commit), the cache's watch brings them and the reconcile decides again: the same status, nothing written.
        `job` and `first.attempts` are the documents the records' values encode: the cache takes them as they are,
        with their resourceVersion set, rather than decoding the bytes just written back into the same objects
        (ADR 0114); they are the cache's from here, read-only to the caller. A follower's (`lead` False, ADR 0122)
        only go into the cache: it reconciles nothing, and the leader records its own settled state."""
        job_rec, attempt_recs = records[0], records[1:]
        key = job_rec.key
        self.cache.apply_written(records, (job, *first.attempts.values()))  # the Job first: its attempts' listeners find it
        if not lead:
            return
        self._settled[key] = Settled(job_rec.revision, {rec.key: rec.revision for rec in attempt_recs}, first.wake_at)
        if first.wake_at is not None:
            self.queue.add_after(key, first.wake_at - self.clock.now())

    def _pre_explained(self, view: JobView, attempts: list[AttemptView], decision: Decision,
                       made: Mapping[str, dict[str, Any]], job: dict[str, Any]) -> dict[str, Any] | None:
        """The status to write. A Job's first attempts that fit no node now are created with the explain placement
        would write on them, and the Queued status names it, as the decision on that explain would: one
        write, one decision and one watch event of the Job fewer per create (ADR 0096). Only for the Job's first
        decision (no attempts yet, so no other explain can come first in the message) of a single (not gang)
        Job; the pass still decides each new attempt, and writes nothing when it finds the same answer."""
        status = decision.status
        if (self.explain is None or attempts or view.gang or not made or status is None or status.get("message")
                or JobPhase.parse(status.get("phase")) is not JobPhase.QUEUED
                or not all(isinstance(a, CreateAttempt) for a in decision.actions)):
            return status
        explain = self.explain(list(made.values()), job)
        return {**status, "message": queued_message(explain)} if explain else status

    def _with_producers(self, key: str, view: JobView) -> JobView:
        """The view with the Jobs its `output` inputs name, as the cache has them now (decide reads them
        there); a Job being deleted counts as gone. Watches them while the consumer is unfinished."""
        if not view.output_inputs:
            self._watch(key, frozenset())
            return view
        names = {ref.job for ref in view.output_inputs}
        self._watch(key, frozenset() if view.phase.terminal else frozenset(job_key(view.project, n) for n in names))
        found = {n: p for n in names if (p := self.cache.job_view(view.project, n)) is not None and not p.deleting}
        return replace(view, producers={n: Producer.of(p) for n, p in found.items()})

    def _watch(self, consumer: str, producers: frozenset[str]) -> None:
        before = self._producers_of.get(consumer, frozenset())
        if before == producers:
            return
        for gone in before - producers:
            waiting = self._consumers.get(gone, set())
            waiting.discard(consumer)
            if not waiting:
                self._consumers.pop(gone, None)
        for added in producers - before:
            self._consumers.setdefault(added, set()).add(consumer)
        if producers:
            self._producers_of[consumer] = producers
        else:
            self._producers_of.pop(consumer, None)

    def _mtbi(self, job: JobView, attempts: list[AttemptView]) -> float | None:
        """The measured MTBI of the offering the Job last ran on, for an `auto` checkpoint cadence: the
        newest placed attempt's, so a replacement still Pending does not swing the interval shown."""
        if job.checkpoint_interval != "auto":
            return None
        placed = [a for a in attempts if a.job_uid == job.uid and a.offering]
        return self.interruptions.of_offering(max(placed, key=lambda a: a.number).offering) if placed else None

    @staticmethod
    def _made(job: dict[str, Any], project: str, actions: tuple[Action | CreateMember, ...], now: float,
              topo: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        """The attempts the actions create, by key, made from the stored `job`; `topo` is the gang's resolved
        topology (the view's) its members' variables come from."""
        made: dict[str, dict[str, Any]] = {}
        for action in actions:
            if isinstance(action, CreateAttempt):
                obj = new_attempt(job, action.index, action.number, now)
            elif isinstance(action, CreateMember):
                obj = new_member(job, action, now)
                obj["spec"]["env"] = gang_env(topo or {}, action)
            else:
                continue
            made[attempt_key(project, obj["metadata"]["name"])] = obj
        return made

    async def _execute(self, project: str, actions: tuple[Action | CreateMember, ...], now: float,
                       made: Mapping[str, dict[str, Any]], decided: Mapping[str, int] | None = None) -> dict[str, int | None]:
        """Performs the actions, creating the attempts `made` (`_made`); `decided` is the attempts' revisions the
        actions were decided from. Returns each stopped attempt's key → the revision its stop wrote when that
        stop ended it on the revision decided from (None otherwise: something else wrote it between), and each
        created attempt's key → its revision (None: it existed already)."""
        stopped: dict[str, int | None] = {}
        for action in actions:
            if isinstance(action, StopAttempt):
                key = attempt_key(project, action.name)
                stopped[key] = await self._stop(key, stop(action.reason, action.grace_seconds, now,
                                                          action.checkpoint_seq, action.force), (decided or {}).get(key))
            elif isinstance(action, DeleteAttempt):
                await self.objects.delete(attempt_key(project, action.name), _deletable)
        if made:  # one group commit for a wave of new attempts
            stopped.update(await asyncio.gather(*(self._create(key, obj) for key, obj in made.items())))
        return stopped

    async def _create(self, key: str, obj: dict[str, Any]) -> tuple[str, int | None]:
        created = await self.objects.create(key, obj)
        return key, None if created is None else int(created["metadata"]["resourceVersion"])

    async def _stop(self, key: str, mutation: Any, decided: int | None) -> int | None:
        """Stops the attempt at `key`; the revision written when the stop applied to revision `decided` (the
        first try: nothing wrote it since the decision) and left it finished, else None."""
        tries: list[bool] = []

        def on_decided(obj: dict[str, Any]) -> dict[str, Any] | None:
            tries.append(decided is not None and obj["metadata"].get("resourceVersion") == str(decided))
            result: dict[str, Any] | None = mutation(obj)
            return result
        stored = await self.objects.mutate(key, on_decided)
        if stored is None or tries != [True] or not phase_of(stored).terminal:
            return None
        return int(stored["metadata"]["resourceVersion"])

    async def _write_status(self, job: dict[str, Any], project: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """The Job as written (None: it changed or went meanwhile, and nothing was written)."""
        name = job["metadata"]["name"]
        try:
            written = await self.writer.write_job_status(project, job, status)
        except NodusError as e:
            if e.reason in ("Conflict", "NotFound"):
                return None
            raise
        self.cache.apply(job_key(project, name), written, int(written["metadata"]["resourceVersion"]))
        return written

    async def _delete_job(self, project: str, name: str) -> None:
        try:
            await self.writer.delete_job(project, name)
        except NodusError as e:
            if e.reason != "NotFound":
                raise
        log.info("deleted Job %s/%s: ttlSecondsAfterFinished passed", project, name)
