"""Recovery decisions as pure functions on a stepped clock: fencing, cadence (Young–Daly), suspend with
a checkpoint, SuspendFailed, and what a replacement's Assignment resumes from."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from test_job_controller import World

from nodus.coordinator import checkpoints as store
from nodus.coordinator.clock import duration, rfc3339
from nodus.coordinator.controllers import checkpoints as rules
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.job import AttemptView, JobPhase, JobView, StopAttempt, decide
from nodus.coordinator.controllers.interruptions import Interruptions
from nodus.coordinator.controllers.job_controller import stop
from nodus.coordinator.controllers.lease import lost
from nodus.v1 import agent_pb2

P = AttemptPhase


def commit(attempt: dict[str, Any], seq: int, sha: str = "a" * 64, epoch: int = 0, t: float = 1000.0,
           pause: float = 0.5) -> rules.Commit:
    return rules.Commit(attempt_id=attempt["spec"]["id"], job_uid=attempt["spec"]["jobUID"], seq=seq, sha256=sha,
                        size=100 + seq, uri="blob://sha256/" + sha, time=t, epoch=epoch, pause=pause,
                        reason="Periodic")


def committed(w: World, name: str, c: rules.Commit) -> None:
    siblings = list(w.attempts.values())
    assert rules.refusal(w.attempts[name], siblings, c) is None
    w.attempts[name] = {**w.attempts[name], "status": rules.with_commit(w.attempts[name]["status"], c)}


# -- fencing ----------------------------------------------------------------------------------------------

def test_only_the_current_attempt_of_an_index_commits() -> None:
    w = World()
    w.step()
    first = w.live()[0]
    w.run(first)
    committed(w, first, commit(w.attempts[first], 1))
    # Its node is lost and a replacement starts elsewhere; the old attempt keeps running, partitioned.
    w.mutate(first, lost("n1", w.clock.now()))
    w.step()
    second = next(n for n in w.live() if n != first)
    w.run(second)
    siblings = list(w.attempts.values())
    late = commit(w.attempts[first], 2, sha="b" * 64)
    why = rules.refusal(w.attempts[first], siblings, late)
    assert why is not None and "superseded" in why
    # Even were it still live, a lower-numbered attempt is never current again.
    alive_again = {**w.attempts[first], "status": {**w.attempts[first]["status"], "phase": "Running"}}
    assert "superseded" in (rules.refusal(alive_again, [alive_again, w.attempts[second]], late) or "")
    # The replacement's commit with the next seq counts; the latest is never the stale one.
    committed(w, second, commit(w.attempts[second], 2, sha="c" * 64))
    assert rules.latest(w.attempts.values())["sha256"] == "c" * 64


def test_refusals_name_their_reason() -> None:
    w = World()
    w.step()
    name = w.live()[0]
    w.run(name)
    a = w.attempts[name]
    assert rules.refusal(None, [], commit(a, 1)) == f"attempt {a['spec']['id']} is unknown"
    assert "epoch" in (rules.refusal(a, [a], commit(a, 1, epoch=3)) or "")
    assert "does not belong" in (rules.refusal(a, [a], replace(commit(a, 1), job_uid="someone-else")) or "")
    committed(w, name, commit(w.attempts[name], 3))
    a = w.attempts[name]
    assert rules.refusal(a, [a], commit(a, 3)) == "already committed"  # a resend after a reconnect
    assert "not above" in (rules.refusal(a, [a], commit(a, 3, sha="d" * 64)) or "")
    assert "not above" in (rules.refusal(a, [a], commit(a, 2, sha="d" * 64)) or "")
    ended = {**a, "status": {**a["status"], "phase": "Cancelled"}}
    assert "already ended" in (rules.refusal(ended, [ended], commit(a, 4)) or "")


def test_retention_keeps_the_newest_per_attempt() -> None:
    w = World()
    w.step()
    name = w.live()[0]
    w.run(name)
    for seq in range(1, 12):
        committed(w, name, commit(w.attempts[name], seq, sha=f"{seq:064x}"))
    kept = [c["seq"] for c in w.attempts[name]["status"]["checkpoints"]]
    assert kept == list(range(4, 12))
    assert rules.next_seq([w.attempts[name]]) == 12


# -- cadence ------------------------------------------------------------------------------------------------

def test_young_daly_interval_is_clamped_to_the_allowed_range() -> None:
    assert rules.young_daly(30, 24 * 3600) == pytest.approx(math.sqrt(2 * 30 * 86400))
    assert rules.young_daly(0.01, 3600) == rules.MIN_INTERVAL
    assert rules.young_daly(3600, 365 * 86400) == rules.MAX_INTERVAL


def test_interval_fixed_auto_and_measured() -> None:
    fixed = {"recovery": {"checkpoint": {"interval": "10m0s"}}}
    assert rules.interval(fixed, []) == 600
    auto = {"recovery": {"checkpoint": {"interval": "auto"}}}
    assert rules.interval(auto, []) == pytest.approx(math.sqrt(2 * rules.DEFAULT_COST * rules.DEFAULT_MTBI))
    w = World()
    w.step()
    name = w.live()[0]
    w.run(name)
    committed(w, name, commit(w.attempts[name], 1, pause=8.0))
    assert rules.interval(auto, w.attempts.values(), mtbi=7200) == pytest.approx(math.sqrt(2 * 8.0 * 7200))


def ran(offering: str, start: float, hours: float, phase: str = "Succeeded", reason: str = "") -> dict[str, Any]:
    """An attempt on `offering` that ran `hours` from `start` and ended in `phase`."""
    return {"spec": {"offering": offering},
            "status": {"phase": phase, "reason": reason, "startTime": rfc3339(start),
                       "finishTime": rfc3339(start + hours * 3600)}}


def test_an_offerings_mtbi_is_measured_on_its_attempts() -> None:
    now, day = 1_800_000_000.0, 86400.0
    assert rules.offering_mtbi([], "spot", now) == rules.DEFAULT_MTBI, "nothing ran there yet: the default"
    flaky = [ran("spot", now - day + i * 3600, 1, "Lost", "NodeLost") for i in range(10)]
    assert rules.offering_mtbi(flaky, "spot", now) == pytest.approx((10 * 3600 + rules.DEFAULT_MTBI) / 11)
    quiet = [ran("dedicated", now - 10 * day, 24 * 9)]
    assert rules.offering_mtbi(quiet, "dedicated", now) == pytest.approx(10 * day), "9 quiet days raise it"
    others = [ran("spot", now - day, 2, "Lost", "Drained"),  # an operator's drain is not the offering's doing
              ran("other", now - day, 1, "Lost", "NodeLost"),  # another offering
              ran("spot", now - 40 * day, 1, "Lost", "Preempted")]  # older than the window
    assert rules.offering_mtbi([*flaky, *others], "spot", now) == pytest.approx((12 * 3600 + rules.DEFAULT_MTBI) / 11)
    running = {"spec": {"offering": "spot"}, "status": {"phase": "Running", "startTime": rfc3339(now - 3600)}}
    assert rules.offering_mtbi([running], "spot", now) == pytest.approx(3600 + rules.DEFAULT_MTBI)


def test_an_auto_cadence_follows_the_offering_it_runs_on() -> None:
    """The Job controller and the agent stream ask Interruptions for the current attempt's offering: a
    flaky one checkpoints more often, in status.checkpoint.interval and in the requests."""
    w = World()  # interval auto
    w.step()
    name = w.live()[0]
    w.run(name)
    w.attempts[name]["spec"]["offering"] = "spot"
    committed(w, name, commit(w.attempts[name], 1, pause=8.0, t=w.clock.now()))
    history = [ran("spot", w.clock.now() - 86400 + i * 3600, 1, "Lost", "NodeLost") for i in range(20)]

    class Attempts:
        def attempts(self) -> list[dict[str, Any]]:
            return [*history, *w.attempts.values()]

    interruptions = Interruptions(Attempts(), w.clock)  # type: ignore[arg-type]
    mtbi = interruptions.of_offering(AttemptView.from_object(w.attempts[name]).offering)
    assert mtbi is not None and mtbi < 3 * 3600
    views = [AttemptView.from_object(a) for a in w.attempts.values()]
    every = rules.young_daly(8.0, mtbi)
    assert decide(JobView.from_object(w.job), views, w.clock.now(), mtbi=mtbi, prev=w.status).status["checkpoint"]["interval"] == duration(every)  # type: ignore[index, arg-type]
    assert decide(JobView.from_object(w.job), views, w.clock.now(), prev=w.status).status["checkpoint"]["interval"] == \
        duration(rules.young_daly(8.0, rules.DEFAULT_MTBI))  # type: ignore[index, arg-type]
    cache, asked = FakeCache(w), {}
    w.clock.advance(every + 2)  # the running attempt's own hours count too, so the figure creeps up a little
    assert [r.seq for r in store.due_requests(cache, "n1", w.clock.now(), asked, interruptions.of_offering)] == [2]  # type: ignore[arg-type]
    assert store.due_requests(cache, "n1", w.clock.now(), {}) == [], "on the default MTBI it is not due yet"  # type: ignore[arg-type]


def test_periodic_checkpoint_falls_due_on_a_stepped_clock() -> None:
    w = World(recovery={"maxAttempts": 3, "checkpoint": {"interval": "5m0s"}})
    w.step()
    name = w.live()[0]
    w.run(name)
    start = w.clock.now()
    due, at = rules.periodic_due(w.job["spec"], w.attempts[name], list(w.attempts.values()), start)
    assert not due and at == start + 300
    w.clock.advance(299)
    assert not rules.periodic_due(w.job["spec"], w.attempts[name], list(w.attempts.values()), w.clock.now())[0]
    w.clock.advance(1)
    assert rules.periodic_due(w.job["spec"], w.attempts[name], list(w.attempts.values()), w.clock.now())[0]
    committed(w, name, commit(w.attempts[name], 1, t=w.clock.now()))
    due, at = rules.periodic_due(w.job["spec"], w.attempts[name], list(w.attempts.values()), w.clock.now())
    assert not due and at == pytest.approx(w.clock.now() + 300, abs=0.01)
    ephemeral = {**w.job["spec"], "recovery": {"continuity": "Ephemeral"}}
    assert rules.periodic_due(ephemeral, w.attempts[name], [], w.clock.now() + 1e6) == (False, math.inf)


# -- suspend -------------------------------------------------------------------------------------------------

def test_suspend_of_a_running_checkpointed_job_asks_for_a_checkpoint_first() -> None:
    w = World()
    w.step()
    name = w.live()[0]
    w.run(name)
    w.job["spec"]["state"] = "Suspended"
    w.job["metadata"]["generation"] = 2
    d = decide(JobView.from_object(w.job), [AttemptView.from_object(a) for a in w.attempts.values()], w.clock.now(),
               prev=w.status)
    stops = [a for a in d.actions if isinstance(a, StopAttempt)]
    assert stops == [StopAttempt(name, "Suspended", checkpoint_seq=1)]
    w.mutate(name, stop("Suspended", 30, w.clock.now(), 1))
    assert w.attempts[name]["spec"]["stop"]["checkpointSeq"] == 1
    assert store.suspend_message(w.attempts[name]) == agent_pb2.Suspend(
        attempt_id=w.attempts[name]["spec"]["id"], reason="Suspended", seq=1, grace_seconds=30)


@pytest.mark.parametrize("continuity", ["Ephemeral", "Restartable"])
def test_suspend_without_checkpoints_is_a_plain_stop(continuity: str) -> None:
    w = World(recovery={"maxAttempts": 3, "continuity": continuity})
    w.step()
    name = w.live()[0]
    w.run(name)
    w.job["spec"]["state"] = "Suspended"
    d = decide(JobView.from_object(w.job), [AttemptView.from_object(a) for a in w.attempts.values()], w.clock.now(),
               prev=w.status)
    assert [a for a in d.actions if isinstance(a, StopAttempt)] == [StopAttempt(name, "Suspended")]


def test_suspend_failed_keeps_the_job_running_and_resets_on_resume() -> None:
    w = World()
    w.step()
    name = w.live()[0]
    w.run(name)
    w.job["spec"]["state"] = "Suspended"
    w.job["metadata"]["generation"] = 2
    w.mutate(name, stop("Suspended", 30, w.clock.now(), 1))
    # The agent tried three times and reported SuspendFailed: the coordinator records it, clears the stop.
    w.attempts[name]["status"]["suspendFailed"] = {"generation": 2, "tries": 3}
    w.attempts[name]["spec"].pop("stop")
    d = w.step()
    assert not [a for a in d.actions if isinstance(a, StopAttempt)], "no fourth try"
    assert w.status["phase"] == JobPhase.RUNNING.value and w.status["reason"] == "SuspendFailed"
    assert w.status["suspendFailures"] == 3
    assert w.condition("SuspendFailed")["status"] == "True"
    w.job["spec"]["state"] = "Running"
    w.job["metadata"]["generation"] = 3
    w.step()
    assert "suspendFailures" not in w.status and w.condition("SuspendFailed")["status"] == "False"
    # A new suspend (a new generation) tries again.
    w.job["spec"]["state"] = "Suspended"
    w.job["metadata"]["generation"] = 4
    d = decide(JobView.from_object(w.job), [AttemptView.from_object(a) for a in w.attempts.values()], w.clock.now(),
               prev=w.status)
    assert [a for a in d.actions if isinstance(a, StopAttempt)] == [StopAttempt(name, "Suspended", checkpoint_seq=1)]


# -- what a replacement resumes from ---------------------------------------------------------------------------

def _replacement(**spec: Any) -> tuple[World, dict[str, Any]]:
    w = World(**spec)
    w.step()
    first = w.live()[0]
    w.run(first)
    committed(w, first, commit(w.attempts[first], 1, sha="1" * 64))
    committed(w, first, commit(w.attempts[first], 2, sha="2" * 64))
    w.attempts[first]["status"]["progress"] = {"units": {"completed": 42, "total": 100}}
    w.mutate(first, lost("n1", w.clock.now()))
    w.step()
    second = next(n for n in w.live() if n != first)
    return w, w.attempts[second]


def test_a_checkpointed_replacement_restores_the_latest_of_its_index() -> None:
    w, second = _replacement()
    out = agent_pb2.Assignment(attempt_id=second["spec"]["id"])
    store.prepare(out, second, w.job, list(w.attempts.values()))
    assert out.restore_from.seq == 2 and out.restore_from.sha256 == "2" * 64
    assert out.restore_from.manifest.uri == "blob://sha256/" + "2" * 64
    assert list(out.checkpoint.paths) == ["/nodus/state"] and out.checkpoint.store.uri == "blob://sha256/"
    assert "NODUS_RESUME_UNITS" not in out.env


def test_a_first_attempt_restores_nothing() -> None:
    w = World()
    w.step()
    first = w.attempts[w.live()[0]]
    out = agent_pb2.Assignment()
    store.prepare(out, first, w.job, list(w.attempts.values()))
    assert not out.HasField("restore_from") and out.HasField("checkpoint")


@pytest.mark.parametrize("integration, wire", [(None, agent_pb2.CHECKPOINT_INTEGRATION_AUTO),
                                               ("Auto", agent_pb2.CHECKPOINT_INTEGRATION_AUTO),
                                               ("None", agent_pb2.CHECKPOINT_INTEGRATION_NONE),
                                               ("HFTrainer", agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER)])
def test_the_integration_reaches_the_agent(integration: str | None, wire: int) -> None:
    policy = {"integration": integration} if integration else {}
    w, second = _replacement(recovery={"maxAttempts": 3, "checkpoint": policy})
    out = agent_pb2.Assignment()
    store.prepare(out, second, w.job, list(w.attempts.values()))
    assert out.checkpoint.integration == wire


def test_restartable_passes_the_progress_cursor_and_ephemeral_nothing() -> None:
    w, second = _replacement(recovery={"maxAttempts": 3, "continuity": "Restartable"})
    out = agent_pb2.Assignment()
    store.prepare(out, second, w.job, list(w.attempts.values()))
    assert out.env["NODUS_RESUME_UNITS"] == "42" and not out.HasField("restore_from")
    assert not out.HasField("checkpoint")
    w, second = _replacement(recovery={"maxAttempts": 3, "continuity": "Ephemeral"})
    out = agent_pb2.Assignment()
    store.prepare(out, second, w.job, list(w.attempts.values()))
    assert out == agent_pb2.Assignment()


def test_job_status_shows_the_latest_checkpoint_and_what_was_restored() -> None:
    w, second = _replacement()
    name = second["metadata"]["name"]
    w.report(name, P.RUNNING, restored_from_seq=2)
    w.step()
    cp = w.status["checkpoint"]
    assert cp["seq"] == 2 and cp["size"] == 102 and cp["restoredFromSeq"] == 2 and cp["interval"]
    assert w.status["storage"]["bytes"] == 101 + 102


class FakeCache:
    """What due_requests reads from the coordinator's cache, over a World."""

    def __init__(self, w: World) -> None:
        self.w = w

    def attempts_on(self, node: str) -> list[dict[str, Any]]:
        return [a for a in self.w.attempts.values() if a["spec"].get("node") == node]

    def live_attempts_on(self, node: str) -> list[dict[str, Any]]:
        return [a for a in self.attempts_on(node) if not AttemptPhase.parse(a["status"].get("phase")).terminal]

    def job(self, project: str, name: str) -> dict[str, Any] | None:
        return self.w.job

    def attempts_of(self, project: str, name: str) -> list[dict[str, Any]]:
        return list(self.w.attempts.values())

    def attempts_of_index(self, project: str, name: str, index: int) -> list[dict[str, Any]]:
        return [a for a in self.w.attempts.values() if int(a["spec"].get("index", 0)) == index]

    def attempt_view(self, key: str) -> AttemptView | None:
        obj = self.w.attempts.get(key.rsplit("/", 1)[-1])
        return None if obj is None else AttemptView.from_object(obj)


def test_the_stream_asks_for_periodic_checkpoints_as_they_fall_due() -> None:
    w = World(recovery={"maxAttempts": 3, "checkpoint": {"interval": "5m0s"}})
    w.step()
    name = w.live()[0]
    w.run(name)
    cache, asked = FakeCache(w), {}
    assert store.due_requests(cache, "n1", w.clock.now(), asked) == []  # type: ignore[arg-type]
    w.clock.advance(300)
    [request] = store.due_requests(cache, "n1", w.clock.now(), asked)  # type: ignore[arg-type]
    assert request.seq == 1 and request.reason == agent_pb2.CHECKPOINT_REASON_PERIODIC
    w.clock.advance(5)
    assert store.due_requests(cache, "n1", w.clock.now(), asked) == [], "asked once, not every tick"  # type: ignore[arg-type]
    committed(w, name, commit(w.attempts[name], 1, t=w.clock.now()))
    w.clock.advance(299)
    assert store.due_requests(cache, "n1", w.clock.now(), asked) == []  # type: ignore[arg-type]
    w.clock.advance(1)
    assert [r.seq for r in store.due_requests(cache, "n1", w.clock.now(), asked)] == [2]  # type: ignore[arg-type]
    # A checkpoint that never came is asked for again one interval later.
    w.clock.advance(300)
    assert [r.seq for r in store.due_requests(cache, "n1", w.clock.now(), asked)] == [2]  # type: ignore[arg-type]
    # A stopped attempt is not asked.
    w.mutate(name, stop("Cancelled", 30, w.clock.now()))
    w.clock.advance(600)
    assert store.due_requests(cache, "n1", w.clock.now(), asked) == []  # type: ignore[arg-type]


def test_a_loss_after_min_progress_duration_does_not_use_up_max_attempts() -> None:
    w = World(recovery={"maxAttempts": 1, "minProgressDuration": "2m0s"})
    w.step()
    for number in (1, 2, 3):
        name = f"train-0-{number}"
        w.run(name)
        w.clock.advance(121)  # it ran long enough to count as progress
        w.mutate(name, lost("n1", w.clock.now()))
        w.step()
    assert w.status["phase"] != "Failed" and w.live() == ["train-0-4"]
    w.run("train-0-4")
    w.clock.advance(30)  # lost before making progress: this one counts
    w.mutate("train-0-4", lost("n1", w.clock.now()))
    w.step()
    assert w.live() == ["train-0-5"]
    w.run("train-0-5")
    w.mutate("train-0-5", lost("n1", w.clock.now()))
    w.step()
    assert w.status["phase"] == "Failed" and w.status["reason"] == "MaxAttemptsExceeded"


def test_on_interruption_fail_fails_on_any_loss() -> None:
    w = World(recovery={"maxAttempts": 3, "onInterruption": "Fail"})
    w.step()
    w.run("train-0-1")
    w.clock.advance(3600)
    w.mutate("train-0-1", lost("n1", w.clock.now()))
    w.step()
    assert w.status["phase"] == "Failed" and "onInterruption is Fail" in w.status["message"]
