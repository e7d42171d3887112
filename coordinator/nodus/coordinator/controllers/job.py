"""The Job controller's decision: from (Job, its Attempts, now) to the next status and the actions.

Pure and level-triggered: `decide` reads the whole picture every time and returns what the Job's
status should be and which steps move the world toward the spec; it never depends on having seen an
event. Running it again on its own result does nothing (no actions, the same status): every time
it writes is either taken from an attempt or sticky once written (timeoutStartTime, startTime,
completionTime, a condition's lastTransitionTime). Counts are derived from the Attempt objects, so
a report resent by an agent after a reconnect cannot count twice. `job_controller.py` performs the
actions.

What counts against what (spec/job.md): a Failed attempt (non-zero exit, OOM) is a customer failure,
counted across all indexes against `backoffLimit`; a Lost attempt (lease expired, drained, agent
fault) is lost capacity, counted per index against `recovery.maxAttempts`, and both get a new
attempt (number + 1) while their budget lasts. Cancelled attempts (cancel, suspend, deadline) count
against nothing.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from itertools import filterfalse, islice
from typing import Any, Iterable, Mapping, Sequence

from ..clock import duration, parse, rfc3339
from ..errors import REGISTRY
from . import checkpoints as ckpt
from . import recovery
from .attempts import AttemptPhase, scrub
from .job_inputs import input_gate, input_status
from .job_requests import CHECKPOINT, checkpoint_handled
from .job_status import (committed_outputs, condition, condition_time, gpu_condition, progress_of, put, set_condition,
                         unit_metrics)
from .reasons import AttemptReason
from .views import AttemptView as AttemptView  # re-exported: callers of decide build views from here
from .views import TERMINAL_PHASES as TERMINAL_PHASES
from .views import JobPhase as JobPhase
from .views import JobState as JobState
from .views import terminal_phases as terminal_phases
from .views import JobView as JobView

STOP_GRACE_SECONDS = 30
"""SIGTERM to SIGKILL for attempts the controller stops (Kubernetes' default grace period)."""
INPUTS_READY = "InputsReady"
"""The condition of a Job with `output` inputs: False (WaitingForInput) until every one is committed."""


# -- ranges -------------------------------------------------------------------------------------------

def compress_ranges(indexes: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 5]` → `"0-3,5"`: the succeeded indexes as compressed ranges (Kubernetes' format)."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def expand_ranges(text: str) -> set[int]:
    """The inverse of compress_ranges."""
    out: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


# -- what decide sees and says --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CreateAttempt:
    index: int
    number: int


@dataclass(frozen=True, slots=True)
class StopAttempt:
    """Stop a live attempt: an unplaced one becomes Cancelled at once; a placed one gets spec.stop."""

    name: str
    reason: str
    grace_seconds: int = STOP_GRACE_SECONDS
    checkpoint_seq: int = 0
    """Checkpoint first (a Suspend with this seq), then stop; 0 stops at once."""
    force: bool = False
    """Replace a stop asked before (a Suspend still checkpointing) with this one."""


@dataclass(frozen=True, slots=True)
class DeleteAttempt:
    """Delete a finished (or never placed) attempt of a Job that is gone."""

    name: str


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """ttlSecondsAfterFinished has passed."""


Action = CreateAttempt | StopAttempt | DeleteAttempt | DeleteJob


@dataclass(frozen=True, slots=True)
class Decision:
    status: dict[str, Any] | None
    """The Job's next status; None when it does not change."""
    actions: tuple[Action, ...]
    wake_at: float | None
    """When time alone would change the decision (a deadline, a TTL, a queue timeout)."""


# -- decide ---------------------------------------------------------------------------------------------

def collect_orphans(attempts: Sequence[AttemptView]) -> tuple[Action, ...]:
    """Attempts whose Job is gone (or was recreated): stop the live ones, delete the rest."""
    actions: list[Action] = []
    for a in attempts:
        if a.phase.terminal or not a.placed:
            actions.append(DeleteAttempt(a.name))
        elif not a.stop_requested:
            actions.append(StopAttempt(a.name, AttemptReason.JOB_DELETED))
    return tuple(actions)


def decide(job: JobView, attempts: Sequence[AttemptView], now: float,
           extra_verdict: tuple[JobPhase, str, str] | None = None, mtbi: float | None = None,
           free_storage: int = ckpt.FREE_STORAGE_BYTES, *, prev: Mapping[str, Any]) -> Decision:
    """`prev` is the Job's stored status: the next status is written over a copy of it, so that fields
    other writers own are kept (what the decision reads of it, it reads from the view). `extra_verdict`
    ends the Job for a reason only its caller knows (a gang that never assembled), unless it is
    cancelled or done anyway. `mtbi` is the measured mean time between interruptions of the offering
    the Job runs on (None: the default), for an `auto` checkpoint cadence. `free_storage` is the
    operator's free inclusion of status.storage."""
    mine = [a for a in attempts if a.job_uid == job.uid]
    actions: list[Action] = list(collect_orphans([a for a in attempts if a.job_uid != job.uid]))
    completions, parallelism, backoff_limit = job.completions, job.parallelism, job.backoff_limit
    max_attempts, timeout, ttl, state = job.max_attempts, job.timeout, job.ttl, job.state
    queue_timeout = job.queue_timeout

    succeeded = {a.index for a in mine if a.phase is AttemptPhase.SUCCEEDED and a.index < completions}
    live = [a for a in mine if not a.phase.terminal]
    failures = sorted((a for a in mine if a.phase is AttemptPhase.FAILED), key=lambda a: (a.created or 0, a.number))
    # A lost attempt that ran recovery.minProgressDuration made progress: it does not use up maxAttempts.
    min_progress = job.min_progress or ckpt.DEFAULT_MIN_PROGRESS
    fail_on_loss = job.fail_on_interruption  # then every loss counts (and fails the Job)
    losses = Counter(a.index for a in mine if a.phase is AttemptPhase.LOST
                     and (fail_on_loss or not recovery.made_progress(a, min_progress)))

    status = dict(prev)
    conditions = [dict(c) for c in job.conditions]
    generation = job.generation
    timeout_start = job.timeout_start or _earliest(a.provisioned for a in mine)
    suspended_for = job.suspended_for
    wake: list[float] = []

    phase, reason, message = job.phase, job.reason, job.message
    creates: list[CreateAttempt] = []
    stopping: set[str] = set()

    def stop_all(why: str) -> None:
        for a in live:
            if not a.stop_requested:
                actions.append(StopAttempt(a.name, why))
                if not a.placed:
                    stopping.add(a.name)

    resuming = not phase.terminal and state is JobState.RUNNING and condition(conditions, "Suspended") == "True"
    if resuming:
        # Suspended time since timeoutStartTime does not count against spec.timeout.
        since = parse(condition_time(conditions, "Suspended")) or now
        if timeout_start is not None:
            suspended_for += max(0.0, now - max(since, timeout_start))
        conditions = set_condition(conditions, "Suspended", "False", "Resumed", "", now, generation)

    # Indexes that need a new attempt now, and whether the Job's output inputs let it make them.
    wanted = _wanted(mine, live, succeeded, completions, parallelism)
    gate = input_gate(job) if state is JobState.RUNNING and not phase.terminal else None

    if not phase.terminal:
        verdict = _verdict(job, mine, live, succeeded, failures, losses, completions, backoff_limit, max_attempts,
                           timeout, timeout_start, suspended_for, queue_timeout, state, now)
        if verdict is None and gate is not None and gate.failed and wanted:
            verdict = JobPhase.FAILED, AttemptReason.INPUT_FAILED, gate.message
        if extra_verdict is not None and (verdict is None or verdict[0] is JobPhase.FAILED):
            verdict = extra_verdict
        if verdict is not None:
            phase, reason, message = verdict
            status["completionTime"] = rfc3339(now)
            conditions = set_condition(conditions, _TERMINAL_CONDITION[phase], "True", reason, message, now,
                                        generation)
            if condition(conditions, "Suspended") == "True":  # cancelled while suspended
                conditions = set_condition(conditions, "Suspended", "False", "JobFinished", "", now, generation)
            if phase is JobPhase.SUCCEEDED:
                reason, message = "", ""  # status.reason says why a Job failed or stopped; the condition says done
    if phase.terminal:
        stop_all(reason or AttemptReason.COMPLETED)
        finished = parse(status.get("completionTime")) or now
        held = any(a.checkpoints for a in mine)
        if ttl is not None:
            # The retention sweep deletes the checkpoints first (they go at the TTL too); a Job is
            # deleted once none is left, or after RELEASE_GRACE if no sweep runs.
            if now >= finished + ttl + (ckpt.RELEASE_GRACE if held else 0.0):
                actions.append(DeleteJob())
            else:
                wake.append(finished + ttl + (ckpt.RELEASE_GRACE if held and now >= finished + ttl else 0.0))
        retain_until = finished + job.retain_after_finish
        if held and retain_until > now:
            wake.append(retain_until)  # status.checkpoint and status.storage drop the checkpoints then
    elif state is JobState.SUSPENDED:
        stops, failed = recovery.suspend(job, live, mine)
        if job.money_stop is not None and job.spec_state is JobState.RUNNING and job.stop_by is not None:
            # Out of credits: checkpoint until the funded edge, then stop without the checkpoint.
            if now >= job.stop_by:
                stops = [replace(stop, checkpoint_seq=0) for stop in stops]
                stops += [StopAttempt(a.name, job.money_stop[0], force=True) for a in live
                          if a.stop_requested and a.checkpoint_seq_asked and not a.phase.terminal]
            else:
                wake.append(job.stop_by)
        actions.extend(stops)
        stopping.update(a.name for a in live if not a.placed and not a.stop_requested)
        if failed:
            phase, reason = JobPhase.RUNNING, AttemptReason.SUSPEND_FAILED
            message = (f"the suspend checkpoint failed {failed} times (the first try and two retries); the Job keeps "
                       f"running: set spec.state to Running, or to Suspended again to retry")
            status["suspendFailures"] = failed
            if condition(conditions, "SuspendFailed") != "True":
                conditions = set_condition(conditions, "SuspendFailed", "True", AttemptReason.SUSPEND_FAILED, message,
                                           now, generation)
        else:
            phase, reason = JobPhase.SUSPENDED, AttemptReason.SUSPENDED
            message = "spec.state is Suspended: attempts are stopped and capacity freed; set it to Running to resume"
            if job.money_stop is not None and job.spec_state is JobState.RUNNING:
                reason, message = job.money_stop  # money suspends it (the Funded condition)
            if condition(conditions, "Suspended") != "True":
                conditions = set_condition(conditions, "Suspended", "True", reason, message, now, generation)
    else:
        creates = wanted if gate is None else []  # an input not committed yet: nothing starts without it
        actions.extend(creates)
        phase, reason, message = _running_phase(live, creates), "", ""
        if job.output_inputs and gate is None:
            conditions = set_condition(conditions, INPUTS_READY, "True", "OutputsCommitted", "", now, generation)
        if gate is not None and wanted:
            reason, message = AttemptReason.WAITING_FOR_INPUT, gate.message
            conditions = set_condition(conditions, INPUTS_READY, "False", reason, message, now, generation)
        elif phase is JobPhase.QUEUED:
            waiting = [a for a in live if not a.placed]
            message = queued_message(next((a.placement_explain for a in waiting if a.placement_explain), ""))
        if timeout is not None and timeout_start is not None:
            wake.append(timeout_start + timeout + suspended_for)
        if queue_timeout:
            wake.extend(a.created + queue_timeout for a in live if not a.placed and a.created is not None)
            if creates:  # and the attempts it creates, stamped with `now` as new_attempt stamps them
                wake.append((parse(rfc3339(now)) or now) + queue_timeout)

    # -- the derived status fields ----------------------------------------------------------------
    if state is not JobState.SUSPENDED:
        status.pop("suspendFailures", None)  # counts the current customer suspend only
        if condition(conditions, "SuspendFailed") == "True":
            conditions = set_condition(conditions, "SuspendFailed", "False", "Resumed", "", now, generation)
    remaining = [a for a in live if a.name not in stopping]
    conditions = gpu_condition(conditions, live, now, generation)
    status["phase"] = phase.value
    put(status, "reason", reason)
    put(status, "message", message)
    put(status, "fix", REGISTRY[reason].fix if reason in REGISTRY else "")
    status["active"] = len({a.index for a in remaining} | {c.index for c in creates})
    status["succeeded"] = len(succeeded)
    status["failed"] = len(failures)
    put(status, "completedIndexes", compress_ranges(succeeded))
    numbers_all = [a.number for a in mine] + [c.number for c in creates]
    status["attempts"] = {"current": max(numbers_all, default=0), "max": max_attempts,
                          "total": len(mine) + len(creates)}
    if timeout_start is not None:
        status["timeoutStartTime"] = rfc3339(timeout_start)
        if timeout is not None:
            status["timeoutTime"] = rfc3339(timeout_start + timeout + suspended_for)
    if suspended_for:
        status["suspendedDuration"] = duration(suspended_for)
    started = job.started or _earliest(a.started for a in mine)
    if started is not None:
        status["startTime"] = rfc3339(started)
    put(status, "progress", progress_of(mine, completions))
    put(status, "unitMetrics", unit_metrics(mine, status.get("progress"), status.get("cost")))
    put(status, "outputs", committed_outputs(job.outputs, mine, completions, job.gang, job.sink_outputs))
    # A finished Job's checkpoints drop out of its status once retention releases them.
    release_at = ckpt.release_time(job, parse(status.get("completionTime")))
    released = phase.terminal and (job.deleting or (release_at is not None and now >= release_at))
    put(status, "checkpoint", None if released else recovery.job_checkpoint_status(job, mine, mtbi))
    put(status, "storage", recovery.storage_status(*recovery.storage_bytes(mine, status.get("outputs"), not released),
                                                    free=free_storage))
    put(status, "inputs", input_status(job, mine))
    handled = checkpoint_handled(job.checkpoint_requested, job.handled_requests, remaining, phase.terminal)
    if handled is not None:
        status["handledRequests"] = {**job.handled_requests, CHECKPOINT: handled}
    ready = _newest(a for a in mine if a.inputs_ready_time)
    if ready is not None:
        status["inputsReadyTime"] = ready.inputs_ready_time
    status["conditions"] = [{**c, "observedGeneration": generation} for c in conditions]
    if not status["conditions"]:
        del status["conditions"]
    status["observedGeneration"] = generation
    future = [t for t in wake if t > now]
    return Decision(None if status == prev else status, tuple(actions), min(future) if future else None)


def queued_message(explain: str) -> str:
    """A Queued Job's status.message: why its first waiting attempt fits no node yet (placement's explain)."""
    return f"waiting for capacity: {explain}" if explain else ""


def settles(job: JobView, attempts: Sequence[AttemptView], decision: Decision, prev: Mapping[str, Any]) -> bool:
    """Whether `decision`, once written as it says (its status over the Job's revision, each StopAttempt
    ending an unplaced attempt Cancelled on the revision decided from), leaves a state `decide` changes
    nothing of: then the reconcile its own writes set off may be skipped (ADR 0071).

    Only where no attempt of the Job was ever placed (no agent reported anything into one: no progress,
    warnings, checkpoints, outputs, provisioning or start times; no offering, so no MTBI), the decision
    ends the Job (its phase terminal) and every attempt is finished or one it stops. Decided again on its
    own result, the terminal branch reads the written status back through the view (phase, reason,
    message, conditions, completionTime), no attempt is live (no stop, no GPU condition: the ones it
    stops carry no warning, nothing
    `remaining`), the counts over the attempts are the same (a Cancelled attempt counts against nothing,
    and stopping ones were left out of `active` already), and the wake-ups (the TTL, retention) read the
    same completionTime. Gangs (decide_gang), Jobs with `output` inputs (producers change on their own)
    and a decision that resumes the Job as it ends it (its suspendedDuration goes through a duration
    string and back) are left out; `prev` is the status it was decided over."""
    if job.gang or job.output_inputs:
        return False
    if decision.status is not None and decision.status.get("suspendedDuration") != prev.get("suspendedDuration"):
        return False
    if JobPhase.parse((prev if decision.status is None else decision.status).get("phase")) is JobPhase.QUEUED:
        return _settles_queued(job, attempts, decision)
    if decision.status is None or not JobPhase.parse(decision.status.get("phase")).terminal:
        return False
    stopped = set()
    for action in decision.actions:
        if not isinstance(action, StopAttempt) or action.checkpoint_seq:
            return False
        stopped.add(action.name)
    return all(a.job_uid == job.uid and not a.placed and not a.offering
               and (a.phase.terminal or (a.name in stopped and not a.stop_requested and not a.warnings))
               for a in attempts) \
        and stopped <= {a.name for a in attempts if not a.phase.terminal}


def quiet(job: JobView, attempts: Sequence[AttemptView], decision: Decision) -> bool:
    """Whether `decision` changes nothing (no action, no status) of a Job whose decision read nothing but the
    Job, its attempts and the time: then deciding again on the same revisions before its wake-up gives the
    same nothing, and a resync may skip it (ADR 0086). Left out: gangs (decide_gang), Jobs with `output`
    inputs (their producers are other Jobs) and a Checkpointed Job on the `auto` cadence with a checkpoint
    (status.checkpoint.interval reads its offering's MTBI, which other Jobs' attempts move)."""
    if decision.actions or decision.status is not None or job.gang or job.output_inputs:
        return False
    return not (job.continuity == "Checkpointed" and job.checkpoint_interval == "auto"
                and any(a.checkpoints or a.restored_from_seq for a in attempts))


def _settles_queued(job: JobView, attempts: Sequence[AttemptView], decision: Decision) -> bool:
    """The Queued class of `settles`: every attempt of the Job is Pending and was never placed (no stop,
    no warning, no offering, nothing an agent reports), the Job is not resuming, and the decision only
    creates attempts. Decided again with those attempts (Pending, unplaced), `_wanted` wants nothing more, the
    phase is Queued again, the message names the same first explain (new attempts have none, or, for a Job's
    first attempts, the one explain they were all created with and the message was written with: the
    controller's pre-explain, ADR 0096), the counts took `creates` in already, and the queue timeouts are in
    `wake_at` (decide adds the new attempts'). What placement writes next (an explain) is another writer's
    change: decided again."""
    if job.state is not JobState.RUNNING or any(c.get("type") == "Suspended" and c.get("status") == "True"
                                                for c in job.conditions):
        return False
    if not all(isinstance(a, CreateAttempt) for a in decision.actions):
        return False
    return all(a.job_uid == job.uid and a.phase is AttemptPhase.PENDING and not a.placed and not a.offering
               and not a.stop_requested and not a.warnings and not a.checkpoints and not a.restored_from_seq
               for a in attempts)


def _wanted(mine: list[AttemptView], live: list[AttemptView], succeeded: set[int], completions: int,
            parallelism: int) -> list[CreateAttempt]:
    """The attempts to create now: the lowest indexes neither succeeded nor live, up to parallelism."""
    live_indexes = {a.index for a in live}
    free = parallelism - len(live_indexes)
    if free <= 0:
        return []
    # The lowest free indexes found in C (filterfalse, islice), their numbers read for them only: decide runs on every
    # change of a Job, and Python loops over its indexes and attempts there made a Job of n indexes O(n²) (ADR 0109).
    chosen = list(islice(filterfalse((succeeded | live_indexes).__contains__, range(completions)), free))
    numbers = dict.fromkeys(chosen, 0)
    for a in mine:
        if a.index in numbers and a.number > numbers[a.index]:
            numbers[a.index] = a.number
    return [CreateAttempt(i, numbers[i] + 1) for i in chosen]


def _verdict(job: JobView, mine: list[AttemptView], live: list[AttemptView], succeeded: set[int],
             failures: list[AttemptView], losses: Counter[int], completions: int, backoff_limit: int,
             max_attempts: int, timeout: float | None, timeout_start: float | None, suspended_for: float,
             queue_timeout: float | None, state: JobState, now: float) -> tuple[JobPhase, str, str] | None:
    """Whether the Job ends now: (terminal phase, reason, message), or None."""
    if state is JobState.CANCELLED:
        return JobPhase.CANCELLED, AttemptReason.CANCELLED, "spec.state is Cancelled: the Job was stopped for good"
    if len(succeeded) >= completions:
        return JobPhase.SUCCEEDED, AttemptReason.COMPLETED, f"{completions} of {completions} indexes succeeded"
    if len(failures) > backoff_limit:
        last = failures[-1]
        exit_text = f"exit code {last.exit_code}" if last.exit_code is not None else last.reason or "failed"
        if last.oom_killed:
            exit_text += " (OOMKilled)"
        tail = scrub(last.message)
        return (JobPhase.FAILED, AttemptReason.BACKOFF_LIMIT_EXCEEDED,
                f"{len(failures)} customer failures exceed spec.backoffLimit {backoff_limit}; the last: index "
                f"{last.index} attempt {last.number}, {exit_text}" + (f":\n{tail}" if tail else ""))
    over = sorted(i for i, n in losses.items() if n > max_attempts)
    if over or (job.fail_on_interruption and losses):
        index = over[0] if over else min(losses)
        last = max((a for a in mine if a.index == index and a.phase is AttemptPhase.LOST), key=lambda a: a.number)
        if over:
            why = (f"index {index} lost its capacity {losses[index]} times, more than spec.recovery.maxAttempts "
                   f"{max_attempts}")
        else:
            why = f"index {index} lost its capacity and spec.recovery.onInterruption is Fail"
        return (JobPhase.FAILED, AttemptReason.MAX_ATTEMPTS_EXCEEDED,
                f"{why}; the last: attempt {last.number} on node {last.node or '?'}, {last.reason or 'Lost'}")
    if timeout is not None and timeout_start is not None and state is not JobState.SUSPENDED \
            and now >= timeout_start + timeout + suspended_for:
        return (JobPhase.FAILED, AttemptReason.DEADLINE_EXCEEDED,
                f"the Job ran longer than spec.timeout {duration(timeout)} from {rfc3339(timeout_start)}"
                + (f" (not counting {duration(suspended_for)} suspended)" if suspended_for else ""))
    if queue_timeout and state is JobState.RUNNING:
        for a in sorted(live, key=lambda a: a.index):
            if not a.placed and a.created is not None and now >= a.created + queue_timeout:
                explain = a.placement_explain or "no node fits"
                return (JobPhase.FAILED, AttemptReason.CAPACITY_UNAVAILABLE,
                        f"index {a.index} waited spec.placement.queueTimeout {duration(queue_timeout)} for "
                        f"capacity: {explain}")
    return None


_TERMINAL_CONDITION = {JobPhase.SUCCEEDED: "Complete", JobPhase.FAILED: "Failed", JobPhase.CANCELLED: "Cancelled"}


def _running_phase(live: list[AttemptView], creates: list[CreateAttempt]) -> JobPhase:
    if any(a.phase in (AttemptPhase.RUNNING, AttemptPhase.CHECKPOINTING)
           or (a.phase is AttemptPhase.STOPPING and a.started is not None) for a in live):
        return JobPhase.RUNNING
    if any(a.placed for a in live):
        return JobPhase.PROVISIONING
    if live or creates:
        return JobPhase.QUEUED
    return JobPhase.PENDING


def _newest(attempts: Iterable[AttemptView]) -> AttemptView | None:
    """The last of `attempts` by (created, number), the later one in their order on a tie: what a stable sort's
    last item is, in one pass (decide runs on every change of a Job: ADR 0109)."""
    newest: AttemptView | None = None
    for a in attempts:
        if newest is None or (a.created or 0, a.number) >= (newest.created or 0, newest.number):
            newest = a
    return newest


def _earliest(times: Iterable[float | None]) -> float | None:
    return min((t for t in times if t is not None), default=None)
