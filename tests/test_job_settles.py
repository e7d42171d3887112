"""`job.settles`: the decisions whose own writes leave a state `decide` changes nothing of, so that the Job
controller may skip the reconcile those writes set off (ADR 0071). Checked on the World of
tests/test_job_controller.py (decide and the executor's own mutations, on a stepped clock): wherever
`settles` says so, deciding again on what the decision wrote, then or at any later time before its wake-up,
gives no action and no status; and it says so for the Jobs that end without ever running (a queue
timeout, a cancel), which is what a Sweep's unplaceable cells do. The same walk checks `job.quiet` (ADR 0086):
wherever a decision changed nothing, deciding again on the same Job and attempts, then or later before its
wake-up, changes nothing either, which is what lets a resync skip it."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.job import AttemptView, Decision, JobView, decide, quiet, settles
from test_job_controller import World

P = AttemptPhase


def _inputs(w: World) -> tuple[JobView, list[AttemptView], dict[str, Any]]:
    assert w.job is not None
    return JobView.from_object(w.job), [AttemptView.from_object(a) for a in w.attempts.values()], w.status


def _step_and_check(w: World, later: float) -> bool:
    """One step of `w`; where it settles, decide again on what it wrote (now, and `later` of the way to its
    wake-up) and check that nothing changes. Whether it settled."""
    view, attempts, prev = _inputs(w)
    d = w.step()
    if quiet(view, attempts, d):  # ADR 0086: the same inputs decide the same nothing until the wake-up
        now = w.clock.now()
        for at in (now, now + later * ((d.wake_at or now + 86400) - now)):
            again = decide(*_inputs(w)[:2], at, prev=w.status)
            assert not again.actions and again.status is None, f"a quiet decision moved at +{at - now:.3f}s: {again}"
    if not settles(view, attempts, d, prev):
        return False
    assert w.job is not None, "a decision that deletes the Job does not settle"
    now = w.clock.now()
    for at in (now, now + later * ((d.wake_at or now + 86400) - now)):
        again: Decision = decide(*_inputs(w)[:2], at, prev=w.status)
        assert not again.actions and again.status is None, f"decided again at +{at - now:.3f}s: {again}"
    return True


def _live(w: World) -> list[str]:
    return sorted(n for n, a in w.attempts.items() if not P.parse(a["status"].get("phase")).terminal)


OPS = st.sampled_from(["tick", "second", "hour", "place", "run", "succeed", "fail", "warn", "explain", "cancel",
                       "suspend", "resume"])


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=14), completions=st.integers(1, 3), parallelism=st.integers(1, 3),
       queue_timeout=st.sampled_from(["1ms", "1s", "0s"]), ttl=st.sampled_from([None, 60]),
       later=st.floats(0.0, 0.999))
def test_where_a_decision_settles_deciding_again_on_its_own_writes_changes_nothing(
        ops: list[str], completions: int, parallelism: int, queue_timeout: str, ttl: int | None,
        later: float) -> None:
    spec: dict[str, Any] = {"completions": completions, "parallelism": parallelism,
                            "placement": {"queueTimeout": queue_timeout}}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    w = World(**spec)
    _step_and_check(w, later)
    for op in ops:
        if w.job is None:
            return
        live = _live(w)
        unplaced = [n for n in live if not w.attempts[n]["spec"].get("node")]
        running = [n for n in live if w.attempts[n]["status"].get("phase") == "Running"]
        if op in ("tick", "second", "hour"):
            w.clock.advance({"tick": 0.002, "second": 1.0, "hour": 3600.0}[op])
        elif op == "place" and unplaced:
            w.place(unplaced[0])
        elif op == "run" and unplaced:
            w.run(unplaced[0])
        elif op in ("succeed", "fail") and running:
            w.report(running[0], P.SUCCEEDED if op == "succeed" else P.FAILED, exit_code=0 if op == "succeed" else 1)
        elif op == "warn" and live:  # even on an unplaced attempt, which no agent reports on
            w.attempts[live[0]]["status"]["warnings"] = [{"code": "GpuUnhealthy", "message": "GPU 0: Xid 79"}]
        elif op == "explain" and unplaced:
            w.attempts[unplaced[0]]["status"]["placement"] = {"explain": "no node fits"}
        elif op in ("cancel", "suspend", "resume"):
            w.job["spec"]["state"] = {"cancel": "Cancelled", "suspend": "Suspended", "resume": "Running"}[op]
        for _ in range(4):  # the steps the writes set off
            if w.job is None:
                return
            _step_and_check(w, later)


def test_a_job_that_ends_without_running_settles_and_one_that_ran_does_not() -> None:
    w = World(placement={"queueTimeout": "1ms"})
    assert _step_and_check(w, 0.5), "the first decision creates an attempt and writes Queued: it settles"
    w.clock.advance(0.002)
    assert _step_and_check(w, 0.5), "a queue timeout ends the Job and stops its unplaced attempt"
    assert w.status["phase"] == "Failed" and w.status["reason"] == "CapacityUnavailable"

    w = World()
    _step_and_check(w, 0.5)
    assert w.job is not None
    w.job["spec"]["state"] = "Cancelled"
    assert _step_and_check(w, 0.5), "a cancel of a queued Job"

    w = World()
    _step_and_check(w, 0.5)
    w.run("train-0-1")
    assert w.job is not None
    w.job["spec"]["state"] = "Cancelled"
    assert not _step_and_check(w, 0.5), "a running attempt is stopped through its node: not finished yet"

    w = World(placement={"queueTimeout": "1ms"})
    _step_and_check(w, 0.5)
    w.attempts["train-0-1"]["status"]["warnings"] = [{"code": "GpuUnhealthy", "message": "GPU 0: Xid 79"}]
    w.clock.advance(0.002)
    assert not _step_and_check(w, 0.5), "a stopped attempt's warning leaves the GPU condition to change"


def test_a_queued_job_settles_until_an_attempt_is_placed() -> None:
    """The Queued class (ADR 0084): a new Job's first decision, and the one after placement's explain, settle;
    what an agent or placement changes is decided again, and a placed attempt leaves the class."""
    w = World(completions=2, parallelism=2, placement={"queueTimeout": "10m"})
    d = w.step()
    assert len(d.actions) == 2 and d.wake_at is not None, "the new attempts' queue timeout is a wake-up"
    w = World(completions=2, parallelism=2, placement={"queueTimeout": "10m"})
    assert _step_and_check(w, 0.999), "created and Queued: deciding again before the queue timeout changes nothing"
    w.attempts["train-0-1"]["status"]["placement"] = {"explain": "no node fits"}
    assert _step_and_check(w, 0.999), "the explain's message is written once"
    assert w.status["message"] == "waiting for capacity: no node fits"
    w.place("train-1-1")
    assert not _step_and_check(w, 0.5), "a placed attempt: Provisioning, outside the class"
