"""The controllers' keyed work queue (controllers/workqueue.py): a key is queued once however often it is
added, keys come out in order, and an urgent add (a new Job, ADR 0075) comes out before every key queued
the ordinary way; a key added while a worker has it runs again after."""
from __future__ import annotations

import asyncio

import pytest

from nodus.coordinator.controllers.workqueue import WorkQueue


async def _order() -> list[str]:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "c"):
        q.add(key)
    q.add("new-1", urgent=True)
    q.add("b", urgent=True)  # already queued: it keeps its place, once
    q.add("new-2", urgent=True)
    assert len(q) == 5
    out = []
    for _ in range(5):
        key = await q.get()
        out.append(key)
        q.done(key)
    assert len(q) == 0
    return out


def test_urgent_keys_come_first_and_every_key_once() -> None:
    assert asyncio.run(_order()) == ["new-1", "new-2", "a", "b", "c"]


async def _again() -> list[str]:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a", urgent=True)  # changed while being reconciled: once more, after
    q.add("b")
    q.done(key)
    return [await q.get(), await q.get()]


def test_a_key_added_while_active_runs_again_after() -> None:
    assert asyncio.run(_again()) == ["b", "a"]


async def _claimed() -> list[str]:
    q: WorkQueue[str] = WorkQueue()
    q.add("queued")
    assert not q.claim("queued"), "a queued key is the workers'"
    assert q.claim("mine")
    assert not q.claim("mine"), "held once"
    q.add("mine")  # changed while claimed: a worker runs it after, not before
    assert await q.get() == "queued"
    q.done("queued")
    assert len(q) == 0
    q.done("mine")
    return [await q.get()]


def test_a_claimed_key_is_not_taken_by_a_worker_and_an_add_meanwhile_runs_it_after() -> None:
    """`claim` (ADR 0127: an agent's report decides its Job itself when no worker has the Job)."""
    assert asyncio.run(_claimed()) == ["mine"]


async def _spinning_key_lets_the_loop_run() -> int:
    """A reconcile that never suspends and queues its own key again until another task (the cache's watch,
    in the coordinator) has run: the workers must let that task run."""
    import logging

    from nodus.coordinator.controllers.workqueue import run_workers

    q: WorkQueue[str] = WorkQueue()
    seen = asyncio.Event()
    rounds = 0

    async def reconcile(key: str) -> None:
        nonlocal rounds
        rounds += 1
        if not seen.is_set():
            q.add(key)  # as a TTL delete that meets NotFound before the cache has the delete

    async def watch() -> None:
        seen.set()

    q.add("job")
    loop = asyncio.create_task(run_workers(q, reconcile, workers=1, resync=lambda: None, resync_seconds=3600,
                                           log=logging.getLogger("test"), name="spin"))
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(watch()))
    try:
        await seen.wait()  # without the workers' yield this never returns
        await asyncio.sleep(0.01)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return rounds


@pytest.mark.timeout(30)  # starved, the loop runs no timer: the hang is what pytest-timeout ends
def test_a_key_that_queues_itself_without_suspending_does_not_starve_the_loop() -> None:
    assert 1 <= asyncio.run(_spinning_key_lets_the_loop_run()) <= 3  # the watch ran within a few rounds
