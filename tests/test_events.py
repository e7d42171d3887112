"""A Job's Events: what its state implies (pure), written once each across restarts and dropped after
the TTL (the recorder on a real store), and shown by a real kubectl (`describe`, `get events`)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Coordinator
from e2e import create, ended, job_events, start_agent, wait_events
from nodus.coordinator.clock import ManualClock, rfc3339
from nodus.coordinator.controllers import events
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.event_recorder import PREFIX, EventRecorder
from nodus.coordinator.controllers.workqueue import WorkQueue
from nodus.coordinator.store.sqlite import SqliteStore

T0 = 1_767_225_600.0


def _job(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team", "uid": "u-1"}, "status": status}


def _attempt(number: int, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"train-0-{number}", "namespace": "team", "creationTimestamp": rfc3339(T0 + number)},
            "spec": {"job": "train", "index": 0, "number": number, "node": f"node-{number}"}, "status": status}


def test_an_attempt_lost_with_its_node_and_its_replacement_tell_their_story() -> None:
    lost = _attempt(1, phase="Lost", reason="NodeLost", message="the lease ran out", provisioningTime=rfc3339(T0),
                    startTime=rfc3339(T0 + 1), lostTime=rfc3339(T0 + 9),
                    checkpoints=[{"seq": 3, "time": rfc3339(T0 + 5), "reason": "Periodic", "size": 10}])
    said = [(h.reason, h.type) for h in events.of_attempt(lost)]
    assert said == [(events.Reason.PLACED, events.EventType.NORMAL), (events.Reason.STARTED, events.EventType.NORMAL),
                    (events.Reason.CHECKPOINTED, events.EventType.NORMAL),
                    (events.Reason.NODE_LOST, events.EventType.WARNING)]
    node_lost = events.of_attempt(lost)[-1]
    assert node_lost.message == "attempt train-0-1 lost node node-1 (NodeLost): the lease ran out"
    replacement = events.of_attempt(_attempt(2))
    assert [(h.reason, h.message) for h in replacement] == [
        (events.Reason.REPLACED, "attempt train-0-2 replaces attempt 1 of index 0")]
    failed = events.of_attempt(_attempt(1, phase="Failed", reason="Error", exitCode=3, finishTime=rfc3339(T0)))
    assert failed[-1].type is events.EventType.WARNING and "exit code 3" in failed[-1].message


def test_a_jobs_suspend_resume_and_end_are_events_named_by_what_they_record() -> None:
    job = _job(phase="Succeeded", completionTime=rfc3339(T0 + 60), conditions=[
        {"type": "Suspended", "status": "False", "reason": "Resumed", "lastTransitionTime": rfc3339(T0 + 30)}])
    assert [h.reason for h in events.of_job(job)] == [events.Reason.RESUMED, events.Reason.SUCCEEDED]
    suspended = _job(phase="Suspended", conditions=[{"type": "Suspended", "status": "True", "reason": "MaxCostReached",
                                                     "message": "spent 1.00", "lastTransitionTime": rfc3339(T0)}])
    (h,) = events.of_job(suspended)
    assert (h.reason, h.message) == (events.Reason.SUSPENDED, "suspended (MaxCostReached): spent 1.00")
    a, b = events.event(job, h, "x"), events.event(job, h, "y")
    assert a["metadata"]["name"] == b["metadata"]["name"]  # the same fact, the same name: written once
    assert a["involvedObject"] == {"apiVersion": "nodus.dev/v1", "kind": "Job", "name": "train", "namespace": "team",
                                   "uid": "u-1"}
    other = events.event(job, events.of_job(job)[-1], "x")
    assert other["metadata"]["name"] != a["metadata"]["name"]


def test_the_recorder_writes_each_event_once_across_a_restart_and_drops_it_after_the_ttl(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db", synchronous="OFF")
        clock = ManualClock(T0 + 100)
        try:
            cache = Cache(store)
            cache.apply(job_key("team", "train"), _job(phase="Succeeded", completionTime=rfc3339(T0 + 50)), 1)
            cache.apply(attempt_key("team", "train-0-1"),
                        _attempt(1, phase="Succeeded", provisioningTime=rfc3339(T0), startTime=rfc3339(T0 + 1)), 2)
            recorder = EventRecorder(cache, store, clock, ttl=3600)
            await recorder.reconcile(job_key("team", "train"))
            await recorder.reconcile(job_key("team", "train"))
            stored = (await store.list(PREFIX)).records
            assert sorted(orjson.loads(r.value)["reason"] for r in stored) == ["Placed", "Started", "Succeeded"]

            again = EventRecorder(Cache(store), store, clock, ttl=3600)  # a restarted coordinator
            again.cache.apply(job_key("team", "train"), cache.get(job_key("team", "train")), 1)
            again.cache.apply(attempt_key("team", "train-0-1"), cache.get(attempt_key("team", "train-0-1")), 2)
            await again._load()
            before = store.revision
            await again.reconcile(job_key("team", "train"))
            assert store.revision == before  # nothing written twice, not even refused creates

            clock.advance(3600 - 100 + 10)  # past T0 + 1 h + 10 s: Placed (T0) and Started (T0+1) expire
            assert await again.sweep() == 2
            left = [orjson.loads(r.value)["reason"] for r in (await store.list(PREFIX)).records]
            assert left == ["Succeeded"]
            await again.reconcile(job_key("team", "train"))
            assert len((await store.list(PREFIX)).records) == 1  # an expired fact is not written again
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_job_of_many_attempts_costs_a_change_one_attempts_events(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Attempt change queues its whole Job; the recorder derives Events again only for the Attempts
    that changed since their Events were written (a 500-index Job's change is not 500 Attempts' work), and
    an Attempt's new fact at its new resourceVersion is still written."""
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db", synchronous="OFF")
        clock = ManualClock(T0 + 100)
        derived: list[str] = []
        of_attempt = events.of_attempt

        def counting(attempt: dict[str, Any]) -> list[events.Happened]:
            derived.append(attempt["metadata"]["name"])
            return of_attempt(attempt)

        monkeypatch.setattr(events, "of_attempt", counting)
        try:
            cache = Cache(store)
            cache.apply(job_key("team", "train"), _job(phase="Running"), 1)
            for n in range(1, 51):
                cache.apply(attempt_key("team", f"train-0-{n}"), _attempt(n, phase="Running",
                            provisioningTime=rfc3339(T0), startTime=rfc3339(T0 + 1)), 1 + n)
            recorder = EventRecorder(cache, store, clock, ttl=3600)
            await recorder.reconcile(job_key("team", "train"))
            assert len(derived) == 50
            derived.clear()
            cache.apply(attempt_key("team", "train-0-7"), _attempt(7, phase="Failed", reason="Error", exitCode=3,
                        provisioningTime=rfc3339(T0), startTime=rfc3339(T0 + 1), finishTime=rfc3339(T0 + 2)), 60)

            def every_attempt(*args: Any) -> Any:
                raise AssertionError("a reconcile after one attempt's change read all of the Job's attempts")
            with monkeypatch.context() as m:  # not even their revisions: only the resync walks a Job's attempts
                m.setattr(cache, "attempts_of", every_attempt)
                m.setattr(cache, "attempt_revisions", every_attempt)
                await recorder.reconcile(job_key("team", "train"))
            assert derived == ["train-0-7"]
            recorder.queue = WorkQueue()  # what the applies above queued is done
            recorder.resync()
            assert len(recorder.queue) == 0, "every attempt's Events written at its revision"
            reasons = [orjson.loads(r.value)["reason"] for r in (await store.list(PREFIX)).records]
            assert reasons.count("AttemptFailed") == 1 and reasons.count("Started") == 50
        finally:
            await store.close()

    asyncio.run(scenario())


def test_kubectl_describe_and_get_events_show_a_jobs_story(coordinator: Coordinator, tmp_path: Path) -> None:
    with start_agent(coordinator, tmp_path / "agent"):
        create(coordinator, "story", command=["python3", "-c", "print('hi')"])
        assert ended(coordinator, "story")["status"]["phase"] == "Succeeded"
        story = wait_events(coordinator, "story", {"Placed", "Started", "Succeeded"})
    # Started is stamped by the agent and Succeeded by the coordinator: their order is not asserted.
    assert story[0]["reason"] == "Placed" and sorted(e["reason"] for e in story) == ["Placed", "Started", "Succeeded"]
    described = coordinator.run("kubectl", "describe", "job.nodus.dev", "story").stdout
    events_part = described[described.index("Events:"):]
    for line in ("Placed", "attempt story-0-1 placed on node node-a", "Started", "Succeeded"):
        assert line in events_part, events_part
    table = coordinator.run("kubectl", "get", "events").stdout
    assert "job/story" in table and "LAST SEEN" in table and "REASON" in table, table
    # Read-only to users, as kube-apiserver's are to all but their writers.
    name = story[0]["metadata"]["name"]
    refused = coordinator.run("kubectl", "delete", "event", name, check=False)
    assert refused.returncode != 0 and "read-only" in refused.stderr, refused.stderr
    assert "events are read-only" in refused.stderr and "events." not in refused.stderr, refused.stderr
    missing = coordinator.run("kubectl", "get", "event", "no-such-event", check=False)
    assert 'events "no-such-event" not found' in missing.stderr, "the core group is named as kubectl names it"

    # nodus describe job: status, conditions, attempts and events on one screen.
    screen = coordinator.run("nodus", "describe", "job", "story").stdout
    assert "Phase:        Succeeded" in screen and "Completions:  1/1" in screen, screen
    attempts_part = screen[screen.index("Attempts:"):screen.index("Events:")]
    assert "story-0-1" in attempts_part and "node-a" in attempts_part and "Succeeded" in attempts_part, screen
    assert sorted(line.split()[1] for line in screen[screen.index("Events:"):].splitlines()[2:]) == [
        "Placed", "Started", "Succeeded"], screen
    wrong = coordinator.run("nodus", "describe", "secret", "x", check=False)
    assert wrong.returncode == 1 and "nodus describe shows Jobs" in wrong.stderr, wrong.stderr

    coordinator.stop()
    coordinator.start()
    assert [e["metadata"]["name"] for e in job_events(coordinator, "story")] == [e["metadata"]["name"] for e in story]
