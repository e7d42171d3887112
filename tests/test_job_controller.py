"""The Job controller's decision, and the Attempt state machine, as pure functions on a stepped clock.

`World` plays the executor and the agents without any I/O: it applies a Decision's actions with the
same mutations the real executor uses (new_attempt, stop, bind, lost, fold_report) and steps a
ManualClock, so deadlines, TTLs and queue timeouts are tested without sleeping.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus.coordinator.api.attempt import PHASES
from nodus.coordinator.api.job import STATES
from nodus.coordinator.clock import ManualClock, rfc3339
from nodus.coordinator.controllers.attempts import (AttemptPhase, ProgressReport, Report, fold_progress, fold_report,
                                                    scrub)
from nodus.coordinator.controllers.job import (AttemptView, CreateAttempt, Decision, DeleteAttempt, DeleteJob, JobState,
                                               JobView, JobPhase, StopAttempt, compress_ranges, decide, expand_ranges,
                                               terminal_phases)
from nodus.coordinator.controllers.job_controller import new_attempt, stop
from nodus.coordinator.controllers.lease import lost
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.errors import REGISTRY
from nodus.coordinator.scheduler import Placement

P = AttemptPhase


class World:
    """A Job, its Attempts and a clock; `step` decides once and applies what the decision says."""

    def __init__(self, **spec: Any) -> None:
        self.clock = ManualClock()
        body = {"completions": 1, "parallelism": 1, "backoffLimit": 6, "state": "Running",
                "recovery": {"maxAttempts": 3}, "placement": {"queueTimeout": "24h0m0s"},
                "command": ["python", "-c", "pass"]}
        body.update(spec)
        self.job: dict[str, Any] | None = {
            "apiVersion": "nodus.dev/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "default", "uid": "uid-1", "generation": 1},
            "spec": body}
        self.attempts: dict[str, dict[str, Any]] = {}
        self.decisions: list[Decision] = []

    @property
    def status(self) -> dict[str, Any]:
        assert self.job is not None
        return self.job.get("status") or {}

    def step(self) -> Decision:
        assert self.job is not None
        now = self.clock.now()
        d = decide(JobView.from_object(self.job), [AttemptView.from_object(a) for a in self.attempts.values()], now,
                   prev=self.status)
        for action in d.actions:
            if isinstance(action, CreateAttempt):
                a = new_attempt(self.job, action.index, action.number, now)
                assert a["metadata"]["name"] not in self.attempts, "an attempt is never created twice"
                self.attempts[a["metadata"]["name"]] = a
            elif isinstance(action, StopAttempt):
                self.mutate(action.name, stop(action.reason, action.grace_seconds, now, action.checkpoint_seq,
                                              action.force))
            elif isinstance(action, DeleteAttempt):
                del self.attempts[action.name]
            elif isinstance(action, DeleteJob):
                self.job = None
        if d.status is not None and self.job is not None:
            self.job["status"] = d.status
        self.decisions.append(d)
        return d

    def settle(self) -> Decision:
        """Steps until a decision changes nothing: the controller is level-triggered and converges."""
        for _ in range(10):
            d = self.step()
            if not d.actions and d.status is None:
                return d
        raise AssertionError("the decision did not converge")

    def mutate(self, name: str, mutation: Any) -> None:
        new = mutation(copy.deepcopy(self.attempts[name]))
        if new is not None:
            self.attempts[name] = new

    def place(self, name: str, node: str = "n1") -> None:
        self.mutate(name, bind(Placement(node, explain=f"{node}: the only fitting node"), self.clock.now()))

    def report(self, name: str, phase: AttemptPhase, **fields: Any) -> None:
        fields.setdefault("time", self.clock.now())
        report = Report(phase=phase, **fields)
        status = fold_report(self.attempts[name], report, self.clock.now())
        if status is not None:
            self.attempts[name] = {**self.attempts[name], "status": status}

    def run(self, name: str) -> None:
        self.place(name)
        self.report(name, P.RUNNING)

    def live(self) -> list[str]:
        return sorted(n for n, a in self.attempts.items()
                      if not AttemptPhase.parse(a["status"].get("phase")).terminal)

    def condition(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions", []) if c["type"] == type_), None)


# -- ranges ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("indexes, text", [
    ([], ""), ([0], "0"), ([0, 1, 2, 3, 5], "0-3,5"), ([5, 3, 1], "1,3,5"), ([2, 2, 3], "2-3"),
    ([0, 1, 3, 4, 6, 8, 9, 10], "0-1,3-4,6,8-10"),
])
def test_compress_ranges(indexes: list[int], text: str) -> None:
    assert compress_ranges(indexes) == text
    assert expand_ranges(text) == set(indexes)


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_compress_ranges_round_trips(indexes: set[int]) -> None:
    text = compress_ranges(indexes)
    assert expand_ranges(text) == indexes
    assert compress_ranges(expand_ranges(text)) == text


# -- vocabularies -----------------------------------------------------------------------------------------

def test_phase_vocabularies() -> None:
    assert [p.value for p in AttemptPhase] == list(PHASES)
    assert {p for p in AttemptPhase if p.terminal} == {P.SUCCEEDED, P.FAILED, P.LOST, P.CANCELLED}
    assert terminal_phases() == {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED}
    for reason in ("BackoffLimitExceeded", "MaxAttemptsExceeded", "DeadlineExceeded", "CapacityUnavailable",
                   "Cancelled", "Suspended"):
        assert REGISTRY[reason].fix


def test_job_state_is_parsed_into_its_enum_with_the_admitted_words() -> None:
    assert [s.value for s in JobState] == list(STATES), "the decision's states are the words admission accepts"
    job = World(state="Suspended").job
    assert job is not None
    assert JobView.from_object(job).state is JobState.SUSPENDED
    del job["spec"]["state"]
    assert JobView.from_object(job).state is JobState.RUNNING, "an absent spec.state runs the Job"


def test_the_job_view_decodes_the_spec_defaults_and_what_the_decision_wrote_before() -> None:
    w = World()
    assert w.job is not None
    view = JobView.from_object(w.job)
    assert (view.continuity, view.retain_after_finish, view.gang, view.phase) == \
        ("Checkpointed", 168 * 3600.0, False, JobPhase.PENDING)
    w.settle()
    w.job["status"]["costUSD"] = "1.25"  # a field another writer owns
    w.run("train-0-1")
    w.step()
    view = JobView.from_object(w.job)
    assert view.phase is JobPhase.RUNNING and view.started is not None and view.timeout_start is not None
    assert w.status["costUSD"] == "1.25", "the next status is written over the stored one: others' fields stay"


# -- completions and parallelism ------------------------------------------------------------------------

def test_indexed_job_never_runs_more_than_parallelism_and_completes() -> None:
    w = World(completions=4, parallelism=2)
    d = w.settle()
    assert w.live() == ["train-0-1", "train-1-1"]
    assert w.status["phase"] == "Queued" and w.status["active"] == 2 and d.wake_at is not None
    env_attempt = w.attempts["train-0-1"]
    assert env_attempt["spec"]["id"].startswith("att-") and len(env_attempt["spec"]["id"]) == 20
    assert env_attempt["metadata"]["labels"] == {"nodus.dev/job": "train", "nodus.dev/index": "0"}
    assert env_attempt["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    w.run("train-0-1")
    w.settle()
    assert w.status["phase"] == "Running" and w.status["startTime"]
    finished = []
    while len(finished) < 4:
        assert len(w.live()) <= 2
        name = w.live()[0]
        if w.attempts[name]["status"]["phase"] == "Pending":
            w.run(name)
        w.clock.advance(1)
        w.report(name, P.SUCCEEDED, exit_code=0)
        finished.append(name)
        w.settle()
    assert finished == ["train-0-1", "train-1-1", "train-2-1", "train-3-1"]
    s = w.status
    assert s["phase"] == "Succeeded" and s["completedIndexes"] == "0-3" and s["succeeded"] == 4
    assert s["active"] == 0 and s["failed"] == 0 and s["attempts"] == {"current": 1, "max": 3, "total": 4}
    assert s["completionTime"] and "reason" not in s
    assert w.condition("Complete")["status"] == "True"
    # Level-triggered and idempotent: deciding again, later, changes nothing.
    w.clock.advance(3600)
    again = w.step()
    assert again.actions == () and again.status is None and again.wake_at is None


def test_completed_indexes_mid_run() -> None:
    w = World(completions=6, parallelism=3)
    w.settle()
    for name in ("train-0-1", "train-2-1"):
        w.run(name)
        w.report(name, P.SUCCEEDED, exit_code=0)
    w.settle()
    assert w.status["completedIndexes"] == "0,2" and w.status["succeeded"] == 2
    assert sorted(w.live()) == ["train-1-1", "train-3-1", "train-4-1"]


def test_parallelism_may_change_while_running() -> None:
    w = World(completions=5, parallelism=1)
    w.settle()
    assert w.live() == ["train-0-1"]
    assert w.job is not None
    w.job["spec"]["parallelism"] = 3
    w.job["metadata"]["generation"] = 2
    w.settle()
    assert w.live() == ["train-0-1", "train-1-1", "train-2-1"]
    assert w.status["observedGeneration"] == 2


# -- failures -------------------------------------------------------------------------------------------------

def test_customer_failures_retry_then_fail_with_backoff_limit_exceeded() -> None:
    w = World(backoffLimit=1)
    w.settle()
    w.run("train-0-1")
    log = "\n".join(f"line {i}" for i in range(1, 6))
    w.report("train-0-1", P.FAILED, exit_code=1, message=log)
    w.settle()
    assert w.live() == ["train-0-2"], "a customer failure within backoffLimit gets a new attempt"
    assert w.status["failed"] == 1 and w.status["phase"] == "Queued"
    w.run("train-0-2")
    w.report("train-0-2", P.FAILED, exit_code=137, oom_killed=True, message=log)
    w.settle()
    s = w.status
    assert s["phase"] == "Failed" and s["reason"] == "BackoffLimitExceeded" and s["failed"] == 2
    assert s["fix"] == REGISTRY["BackoffLimitExceeded"].fix
    assert "exit code 137 (OOMKilled)" in s["message"]
    assert s["message"].endswith("line 3\nline 4\nline 5") and "line 2" not in s["message"], "at most 3 log lines"
    assert w.attempts["train-0-2"]["status"]["reason"] == "OOMKilled"
    assert w.condition("Failed")["reason"] == "BackoffLimitExceeded"
    assert w.live() == []


def test_backoff_limit_counts_failures_across_indexes() -> None:
    w = World(completions=3, parallelism=3, backoffLimit=1)
    w.settle()
    for name in ("train-0-1", "train-1-1"):
        w.run(name)
        w.report(name, P.FAILED, exit_code=2)
    w.settle()
    assert w.status["reason"] == "BackoffLimitExceeded"
    assert w.attempts["train-2-1"]["status"]["phase"] == "Cancelled", "an unplaced attempt is cancelled at once"


def test_lost_capacity_is_replaced_and_counted_against_max_attempts_not_backoff_limit() -> None:
    w = World(backoffLimit=0, recovery={"maxAttempts": 1})
    w.settle()
    w.run("train-0-1")
    w.mutate("train-0-1", lost("n1", w.clock.now()))
    w.settle()
    assert w.attempts["train-0-1"]["status"]["reason"] == "NodeLost"
    assert w.live() == ["train-0-2"] and w.status["failed"] == 0 and w.status["phase"] == "Queued"
    assert w.status["attempts"] == {"current": 2, "max": 1, "total": 2}
    w.run("train-0-2")
    w.mutate("train-0-2", lost("n1", w.clock.now()))
    w.settle()
    assert w.status["phase"] == "Failed" and w.status["reason"] == "MaxAttemptsExceeded"
    assert "more than spec.recovery.maxAttempts 1" in w.status["message"]


def test_a_replacement_that_succeeds_completes_the_job() -> None:
    w = World(backoffLimit=0)
    w.settle()
    w.run("train-0-1")
    w.mutate("train-0-1", lost("n1", w.clock.now()))
    w.settle()
    w.run("train-0-2")
    w.report("train-0-2", P.SUCCEEDED, exit_code=0)
    w.settle()
    assert w.status["phase"] == "Succeeded" and w.status["failed"] == 0


def test_on_interruption_fail() -> None:
    w = World(recovery={"maxAttempts": 3, "onInterruption": "Fail"})
    w.settle()
    w.run("train-0-1")
    w.mutate("train-0-1", lost("n1", w.clock.now()))
    w.settle()
    assert w.status["reason"] == "MaxAttemptsExceeded" and "onInterruption is Fail" in w.status["message"]


# -- time ----------------------------------------------------------------------------------------------------

def test_timeout_counts_from_the_first_provisioning() -> None:
    w = World(timeout="10s")
    w.settle()
    w.clock.advance(100)  # queued time does not count
    w.step()
    assert "timeoutStartTime" not in w.status
    start = w.clock.now()
    w.run("train-0-1")
    d = w.settle()
    assert w.status["timeoutStartTime"] == rfc3339(start)
    assert w.status["timeoutTime"] == rfc3339(start + 10) and d.wake_at == pytest.approx(start + 10)
    w.clock.advance(9.9)
    assert w.step().status is None
    w.clock.advance(0.1)
    d = w.step()
    assert w.status["phase"] == "Failed" and w.status["reason"] == "DeadlineExceeded"
    assert StopAttempt("train-0-1", "DeadlineExceeded") in d.actions
    assert w.attempts["train-0-1"]["spec"]["stop"]["reason"] == "DeadlineExceeded"
    w.report("train-0-1", P.CANCELLED, reason="DeadlineExceeded")
    w.settle()
    assert w.attempts["train-0-1"]["status"]["phase"] == "Cancelled" and w.status["active"] == 0


def test_suspend_stops_attempts_and_the_timeout_clock_then_resume_starts_new_ones() -> None:
    w = World(timeout="10s")
    w.settle()
    start = w.clock.now()
    w.run("train-0-1")
    w.settle()
    w.clock.advance(4)
    assert w.job is not None
    w.job["spec"]["state"] = "Suspended"
    w.settle()
    assert w.status["phase"] == "Suspended" and w.status["reason"] == "Suspended"
    assert w.attempts["train-0-1"]["spec"]["stop"]["reason"] == "Suspended"
    assert w.condition("Suspended")["status"] == "True"
    w.report("train-0-1", P.CANCELLED, reason="Suspended")
    w.settle()
    assert w.status["active"] == 0 and w.live() == []
    w.clock.advance(100)  # far past the deadline, but suspended time does not count
    assert w.step().status is None
    w.job["spec"]["state"] = "Running"
    w.settle()
    assert w.status["suspendedDuration"] == "1m40s"
    assert w.status["timeoutTime"] == rfc3339(start + 110)
    assert w.condition("Suspended")["status"] == "False" and w.condition("Suspended")["reason"] == "Resumed"
    assert w.live() == ["train-0-2"] and w.status["phase"] == "Queued"
    assert w.status["failed"] == 0, "a suspend counts against nothing"
    w.run("train-0-2")
    w.clock.advance(5.9)
    w.settle()
    assert w.status["phase"] == "Running"
    w.clock.advance(0.1)
    w.settle()
    assert w.status["reason"] == "DeadlineExceeded"


def test_cancel_stops_for_good() -> None:
    w = World(completions=2, parallelism=2)
    w.settle()
    w.run("train-0-1")
    assert w.job is not None
    w.job["spec"]["state"] = "Cancelled"
    w.settle()
    s = w.status
    assert s["phase"] == "Cancelled" and s["reason"] == "Cancelled" and s["fix"] == REGISTRY["Cancelled"].fix
    assert w.attempts["train-0-1"]["spec"]["stop"]["reason"] == "Cancelled"
    assert w.attempts["train-1-1"]["status"]["phase"] == "Cancelled"
    w.job["spec"]["state"] = "Running"
    w.settle()
    assert w.status["phase"] == "Cancelled" and len(w.attempts) == 2, "a terminal phase is never left"


def test_ttl_deletes_the_finished_job() -> None:
    w = World(ttlSecondsAfterFinished=30)
    w.settle()
    w.run("train-0-1")
    w.report("train-0-1", P.SUCCEEDED, exit_code=0)
    d = w.settle()
    done = w.clock.now()
    assert d.wake_at == pytest.approx(done + 30)
    w.clock.advance(29)
    assert not w.step().actions
    w.clock.advance(1)
    assert DeleteJob() in w.step().actions and w.job is None


def test_queue_timeout_fails_with_capacity_unavailable() -> None:
    w = World(placement={"queueTimeout": "1m0s"})
    d = w.settle()
    assert d.wake_at == pytest.approx(w.clock.now() + 60, abs=0.01)
    w.attempts["train-0-1"]["status"]["placement"] = {"explain": "no node fits: a: cpu: wants 4, 2 free"}
    w.clock.advance(59)
    w.settle()
    assert w.status["phase"] == "Queued" and "cpu: wants 4" in w.status["message"]
    w.clock.advance(1)
    w.settle()
    s = w.status
    assert s["phase"] == "Failed" and s["reason"] == "CapacityUnavailable" and "waited" in s["message"]
    assert w.attempts["train-0-1"]["status"]["phase"] == "Cancelled"


def test_zero_queue_timeout_waits_forever() -> None:
    w = World(placement={"queueTimeout": "0s"})
    w.settle()
    w.clock.advance(10 * 86400)
    w.settle()
    assert w.status["phase"] == "Queued"


# -- orphans, progress, outputs ---------------------------------------------------------------------------------

def test_attempts_of_an_older_job_with_the_same_name_are_collected() -> None:
    w = World()
    w.settle()
    old_live = copy.deepcopy(w.attempts["train-0-1"])
    old_live["metadata"]["name"] = "train-0-9"
    old_live["spec"].update(jobUID="uid-0", number=9, node="n1")
    old_done = copy.deepcopy(old_live)
    old_done["metadata"]["name"] = "train-0-8"
    old_done["status"] = {"phase": "Succeeded"}
    w.attempts.update({"train-0-9": old_live, "train-0-8": old_done})
    d = w.step()
    assert StopAttempt("train-0-9", "JobDeleted") in d.actions and DeleteAttempt("train-0-8") in d.actions
    assert w.status["succeeded"] == 0, "another Job's attempts never count"


def test_progress_and_unit_metrics_come_from_the_attempts() -> None:
    w = World(completions=2, parallelism=2)
    w.settle()
    t = w.clock.now()
    for name, step_ms in (("train-0-1", 100), ("train-1-1", 300)):
        w.run(name)
        for i in range(5):
            status = fold_progress(w.attempts[name], ProgressReport(stage="map", units_completed=i * 2,
                                                                    units_total=10, metrics={"loss": "0.5"},
                                                                    time=t + i * step_ms * 2 / 1000))
            assert status is not None
            w.attempts[name] = {**w.attempts[name], "status": status}
    resent = fold_progress(w.attempts["train-0-1"], ProgressReport(stage="map", units_completed=8, time=t + 0.8))
    assert resent is None, "a resent line changes nothing"
    w.settle()
    s = w.status
    assert s["progress"] == {"stage": "map", "metrics": {"loss": "0.5"}, "units": {"completed": 16, "total": 20}}
    assert s["unitMetrics"] == {"completed": 16, "p50Ms": 100, "p95Ms": 300}


def test_the_progress_total_is_the_planned_total_of_every_index_from_the_first_report() -> None:
    # The README's demo: three indexes of ten units, two at a time. The total says 30 while index 2 has
    # not started (it said 20 then 30: "20/20, then 22/30").
    w = World(completions=3, parallelism=2)
    w.settle()
    t = w.clock.now()

    def report(name: str, done: int) -> None:
        status = fold_progress(w.attempts[name], ProgressReport(stage="train", units_completed=done, units_total=10,
                                                                time=t + done / 100))
        assert status is not None
        w.attempts[name] = {**w.attempts[name], "status": status}

    w.run("train-0-1")
    report("train-0-1", 4)
    w.settle()
    assert w.status["progress"]["units"] == {"completed": 4, "total": 30}
    w.run("train-1-1")
    report("train-1-1", 10)
    report("train-0-1", 10)
    w.settle()
    assert w.status["progress"]["units"] == {"completed": 20, "total": 30}
    for name in ("train-0-1", "train-1-1"):
        w.report(name, P.SUCCEEDED, exit_code=0)
    w.settle()
    w.run("train-2-1")
    w.report("train-2-1", P.SUCCEEDED, exit_code=0)  # the last index never reports progress
    w.settle()
    assert w.status["progress"]["units"] == {"completed": 20, "total": 20}, "an index that reported nothing counts for nothing"


def test_outputs_of_succeeded_attempts_are_committed_to_the_job() -> None:
    w = World(completions=2, parallelism=2)
    w.settle()
    w.run("train-1-1")
    w.report("train-1-1", P.SUCCEEDED, exit_code=0, outputs=({"name": "outputs", "path": "/nodus/outputs", "rank": 0,
                                                               "uri": "blob://sha256/" + "a" * 64, "sha256": "a" * 64,
                                                               "size": 10},))
    w.settle()
    assert w.status["outputs"] == [{"index": 1, "name": "outputs", "path": "/nodus/outputs", "sha256": "a" * 64,
                                    "size": 10}]


# -- the Attempt state machine -----------------------------------------------------------------------------

def _attempt(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "a"}, "spec": {"node": "n1", **spec}, "status": {"phase": "Provisioning"}}


def test_fold_is_idempotent_and_ignores_what_is_older() -> None:
    a = _attempt()
    running = Report(P.RUNNING, time=100.0)
    a["status"] = fold_report(a, running, 100.0)
    assert a["status"]["phase"] == "Running" and a["status"]["startTime"]
    assert fold_report(a, running, 101.0) is None, "the same report twice changes nothing"
    assert fold_report(a, Report(P.MATERIALIZING, time=99.0), 101.0) is None, "an older report changes nothing"
    assert fold_report(a, Report(P.MATERIALIZING), 101.0) is None, "phases never go back"
    done = Report(P.SUCCEEDED, exit_code=0, time=102.0)
    a["status"] = fold_report(a, done, 102.0)
    assert a["status"]["reason"] == "Completed" and a["status"]["finishTime"]
    assert fold_report(a, Report(P.FAILED, exit_code=1, time=200.0), 200.0) is None, "terminal is never left"
    assert fold_report(a, done, 300.0) is None


def test_checkpointing_returns_to_running() -> None:
    a = _attempt()
    a["status"] = fold_report(a, Report(P.CHECKPOINTING, time=1.0), 1.0)
    assert fold_report(a, Report(P.RUNNING, time=2.0), 2.0)["phase"] == "Running"


def test_what_a_cancelled_report_counts_as() -> None:
    unasked = fold_report(_attempt(), Report(P.CANCELLED, reason="Unassigned"), 1.0)
    assert unasked["phase"] == "Lost" and unasked["reason"] == "Unassigned", "a stop nobody asked for is lost capacity"
    drained = fold_report(_attempt(stop={"reason": "Drained"}), Report(P.CANCELLED, reason="Drained"), 1.0)
    assert drained["phase"] == "Lost" and drained["reason"] == "Drained" and drained["lostTime"]
    asked = fold_report(_attempt(stop={"reason": "Suspended"}), Report(P.CANCELLED), 1.0)
    assert asked["phase"] == "Cancelled" and asked["reason"] == "Suspended"
    sigterm = fold_report(_attempt(stop={"reason": "Cancelled"}), Report(P.FAILED, exit_code=143), 1.0)
    assert sigterm["phase"] == "Cancelled" and sigterm["exitCode"] == 143, "a stop we asked for is not a failure"


def test_scrub_keeps_the_last_three_lines() -> None:
    assert scrub("a\n\nb\nc\nd\n") == "b\nc\nd"
    assert scrub("") == ""


def _money_stop(w: World, reason: str, stop_by: float | None = None) -> None:
    """What the money controller writes: a False Funded condition (and stopByTime for credits)."""
    assert w.job is not None
    status = dict(w.status)
    status["conditions"] = [*[c for c in status.get("conditions", []) if c["type"] != "Funded"],
                            {"type": "Funded", "status": "False", "reason": reason, "message": f"{reason} now",
                             "lastTransitionTime": rfc3339(w.clock.now())}]
    if stop_by is not None:
        status["stopByTime"] = rfc3339(stop_by)
    w.job["status"] = status


def test_money_suspends_a_running_job_through_its_checkpoint_and_a_funded_job_resumes() -> None:
    w = World()
    w.settle()
    w.run("train-0-1")
    w.settle()
    _money_stop(w, "MaxCostReached")
    w.settle()
    assert w.status["phase"] == "Suspended" and w.status["reason"] == "MaxCostReached"
    assert w.status["fix"] == REGISTRY["MaxCostReached"].fix and w.condition("Suspended")["reason"] == "MaxCostReached"
    assert w.attempts["train-0-1"]["spec"]["stop"]["checkpointSeq"] == 1, "checkpoint first, then stop"
    assert w.job is not None and w.job["spec"]["state"] == "Running", "the customer's spec.state is never rewritten"
    w.report("train-0-1", P.CANCELLED, reason="Suspended")
    w.settle()
    assert w.live() == []
    w.job["status"]["conditions"] = [{**c, "status": "True", "reason": "Funded"} if c["type"] == "Funded" else c
                                     for c in w.status["conditions"]]
    w.settle()
    assert w.live() == ["train-0-2"] and w.condition("Suspended")["reason"] == "Resumed"


def test_out_of_credits_it_checkpoints_until_stop_by_time_then_stops_without_the_checkpoint() -> None:
    w = World()
    w.settle()
    w.run("train-0-1")
    w.settle()
    stop_by = w.clock.now() + 120
    _money_stop(w, "InsufficientCredits", stop_by)
    d = w.settle()
    asked = w.attempts["train-0-1"]["spec"]["stop"]
    assert asked["checkpointSeq"] == 1 and w.status["reason"] == "InsufficientCredits"
    assert d.wake_at == stop_by, "it looks again at the funded edge"
    w.clock.advance(121)  # the checkpoint did not finish in time
    w.settle()
    forced = w.attempts["train-0-1"]["spec"]["stop"]
    assert "checkpointSeq" not in forced and forced["reason"] == "InsufficientCredits"
    assert forced["time"] == asked["time"], "the stop keeps the time it was first asked"


def test_a_many_index_job_refills_the_lowest_free_indexes_and_shows_the_newest_inputs_ready() -> None:
    """Slots freed one at a time take the lowest indexes neither succeeded nor running, a failed index comes back
    as its next number, and status.inputsReadyTime is the newest attempt's (ADR 0109's one-pass forms)."""
    w = World(completions=40, parallelism=4, backoffLimit=10)
    w.settle()
    assert w.live() == ["train-0-1", "train-1-1", "train-2-1", "train-3-1"]
    for name in w.live():
        w.place(name)
        w.report(name, P.RUNNING, inputs_ready_time=w.clock.now())
    w.clock.advance(1)
    w.report("train-2-1", P.SUCCEEDED, exit_code=0)
    w.report("train-1-1", P.FAILED, exit_code=3)
    w.settle()
    assert w.live() == ["train-0-1", "train-1-2", "train-3-1", "train-4-1"]
    w.place("train-4-1")
    w.report("train-4-1", P.RUNNING, inputs_ready_time=w.clock.now())
    w.place("train-1-2")
    w.report("train-1-2", P.RUNNING, inputs_ready_time=w.clock.now() + 0.5)
    w.settle()
    assert w.status["inputsReadyTime"] == w.attempts["train-1-2"]["status"]["inputsReadyTime"], \
        "the newest by creation, then number: train-1-2 and train-4-1 were created together, 1-2 is the later number"
    for name in ("train-0-1", "train-3-1", "train-4-1"):
        w.report(name, P.SUCCEEDED, exit_code=0)
    w.report("train-1-2", P.FAILED, exit_code=3)
    w.settle()
    assert w.live() == ["train-1-3", "train-5-1", "train-6-1", "train-7-1"]
    assert w.status["succeeded"] == 4 and w.status["completedIndexes"] == "0,2-4" and w.status["failed"] == 2
