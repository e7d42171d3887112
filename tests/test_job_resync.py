"""The Job controller's resync costs nothing for a Job whose inputs did not change (ADR 0086), on the
controller-level harness (tests/job_harness.py: a real store, the cache, the controller, a manual clock):
a settled Job that ran is not decided again by a resync; a Job whose attempt changed behind the queue's back
(a lost trigger) is; a wake-up that came is; and the event recorder passes over Jobs written out."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from job_harness import PROJECT, JobHarness
from nodus.coordinator.agent_wire import to_diff
from nodus.coordinator.controllers.desired import ASSIGNED
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.cache import job_key
from nodus.coordinator.controllers.event_recorder import EventRecorder
from nodus.coordinator.controllers.workqueue import WorkQueue

P = AttemptPhase
SPEC = {"backoffLimit": 6, "state": "Running", "recovery": {"maxAttempts": 3},
        "placement": {"queueTimeout": "24h0m0s"}}


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: Callable[[JobHarness], Awaitable[None]]) -> None:
    async def main() -> None:
        h = await JobHarness.open(tmp_path)
        h.count_decisions(monkeypatch)
        try:
            await body(h)
        finally:
            await h.close()
    asyncio.run(main())


async def _finished(h: JobHarness, name: str, **spec: Any) -> None:
    """A Job that ran: created, decided, its attempt placed, Running and Succeeded, and the Job Succeeded."""
    await h.create_job(name, **{**SPEC, **spec})
    await h.drain()
    [attempt] = h.attempts(name)
    await h.run_to(attempt, P.RUNNING)
    await h.drain()
    await h.run_to(attempt, P.SUCCEEDED, exit_code=0)
    await h.drain()
    job = h.job(name)
    assert job is not None and job["status"]["phase"] == "Succeeded"


def test_a_resync_does_not_decide_a_settled_job_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: JobHarness) -> None:
        for name in ("a", "b", "c"):
            await _finished(h, name)
        await h.create_job("queued", **SPEC)  # waits for a node that never comes: settled, not finished
        await h.drain()
        before = h.decisions
        for _ in range(3):
            h.clock.advance(30.0)
            h.controller.resync()
            assert h.queued() == 0, "a resync queued a Job none of whose inputs changed"
            await h.drain()
        assert h.decisions == before, f"a resync decided settled Jobs again ({h.decisions - before} decisions)"
    _run(tmp_path, monkeypatch, body)


def test_a_changed_job_is_decided_again_by_the_resync_even_when_its_trigger_was_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: JobHarness) -> None:
        await h.create_job("j", **SPEC)
        await h.drain()
        [attempt] = h.attempts("j")
        await h.run_to(attempt, P.RUNNING)
        await h.drain()
        job = h.job("j")
        assert job is not None and job["status"]["phase"] == "Running"
        # The attempt ends, and its event's trigger is lost: the cache has the change, the queue does not.
        await h.run_to(attempt, P.SUCCEEDED, exit_code=0)
        await h.caught_up()
        h.controller.queue = WorkQueue()
        before = h.decisions
        h.controller.resync()
        assert h.queued() == 1
        await h.drain()
        assert h.decisions > before
        job = h.job("j")
        assert job is not None and job["status"]["phase"] == "Succeeded", "the resync repaired the lost trigger"
    _run(tmp_path, monkeypatch, body)


def test_a_settled_job_is_decided_again_once_its_wake_up_came(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: JobHarness) -> None:
        await _finished(h, "ttl", ttlSecondsAfterFinished=60)
        h.controller.queue.close()  # the wake-up's timer is lost too: only the resync is left
        h.controller.queue = WorkQueue()
        h.clock.advance(30.0)
        h.controller.resync()
        assert h.queued() == 0, "before its TTL a finished Job's decision changes nothing"
        h.clock.advance(31.0)
        h.controller.resync()
        assert h.queued() == 1
        await h.drain()
        assert h.job("ttl") is None, "the TTL deleted the Job"
        assert h.attempts("ttl") == [], "and its attempt, as an orphan"
    _run(tmp_path, monkeypatch, body)


def test_the_event_recorder_resync_passes_over_jobs_written_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: JobHarness) -> None:
        recorder = EventRecorder(h.cache, h.store, h.clock)
        await _finished(h, "a")

        async def drain_events() -> int:
            n = 0
            while len(recorder.queue):
                key = await recorder.queue.get()
                try:
                    await recorder.reconcile(key)
                finally:
                    recorder.queue.done(key)
                n += 1
            return n
        assert await drain_events() >= 1
        written = len((await h.store.list("events/")).records)
        assert written >= 2, "the Job's and its attempt's Events"
        recorder.resync()
        assert len(recorder.queue) == 0, "every Event of the Job was written at its current revisions"
        # A change behind the queue's back (a lost trigger) is found by the next resync.
        await h.create_job("b", **SPEC)
        await h.drain()  # Queued, with an attempt
        await drain_events()
        written = len((await h.store.list("events/")).records)
        recorder.queue = WorkQueue()
        [attempt] = h.attempts("b")
        await h.run_to(attempt, P.RUNNING)  # placed and started: Events to write
        await h.caught_up()
        recorder.queue = WorkQueue()
        recorder.resync()
        assert len(recorder.queue) == 1
        await drain_events()
        assert len((await h.store.list("events/")).records) > written
        assert job_key(PROJECT, "b") in recorder._done
    _run(tmp_path, monkeypatch, body)


def test_a_nodes_live_attempts_leave_out_its_finished_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an agent's stream diffs and its checkpoint cadence walks on every change and tick: the node's
    unfinished attempts, not every attempt it ever ran (`Cache.live_attempts_on`)."""
    async def body(h: JobHarness) -> None:
        await _finished(h, "done")
        await h.create_job("running", **SPEC)
        await h.drain()
        [attempt] = h.attempts("running")
        await h.run_to(attempt, P.RUNNING)
        await h.caught_up()
        assert sorted(a["metadata"]["name"] for a in h.cache.attempts_on("n1")) == sorted(h.attempts("done") + [attempt])
        assert [a["metadata"]["name"] for a in h.cache.live_attempts_on("n1")] == [attempt]
        await h.run_to(attempt, P.SUCCEEDED, exit_code=0)
        await h.caught_up()
        assert h.cache.live_attempts_on("n1") == []
    _run(tmp_path, monkeypatch, body)


def test_a_stream_diffs_the_live_attempts_and_the_ended_ones_it_still_owes_a_cancel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(h: JobHarness) -> None:
        await _finished(h, "done")
        [attempt] = h.cache.attempts_on("n1")
        attempt_id = attempt["spec"]["id"]
        assert to_diff(h.cache, "n1", {}, set()) == {}, "a finished attempt the stream said nothing of"
        # Told to run it, and it ended in the store without the agent saying so: a Cancel is still due.
        assert list(to_diff(h.cache, "n1", {attempt_id: ASSIGNED}, set())) == [attempt_id]
        assert to_diff(h.cache, "n1", {attempt_id: ASSIGNED}, {attempt_id}) == {}, "the agent said it ended"
        assert to_diff(h.cache, "n2", {attempt_id: ASSIGNED}, set()) == {}, "not on this node"
    _run(tmp_path, monkeypatch, body)
