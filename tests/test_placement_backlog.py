"""Placement before admission (controllers/placement_backlog.py, ADR 0075): a Job create waits while
`limit` Jobs admitted before it have no attempt decided, and goes on as soon as one is decided (bound,
or parked with its explain), ends or goes away; a Job that stays undecided counts for `patience` at
most; Jobs loaded at start, dry runs, other kinds and a coordinator without controllers never wait."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.placement_backlog import PlacementBacklog
from nodus.coordinator.store import SqliteStore


def job(name: str, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "p", "uid": f"u-{name}"}, "spec": {}, "status": {"phase": phase}}


def attempt(job_name: str, node: str = "", explain: str = "", phase: str = "Pending") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if explain:
        status["placement"] = {"explain": explain}
    return {"metadata": {"name": f"{job_name}-0-1", "namespace": "p"},
            "spec": {"job": job_name, "node": node, "id": f"att-{job_name}"}, "status": status}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def _spins(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    revision = iter(range(1, 10_000))
    cache.apply("jobs/p/old", job("old"), next(revision))  # loaded at start: not in flight
    clock = Clock()
    backlog = PlacementBacklog(cache, limit=2, patience=5.0, now=clock)
    await cache.start()
    assert len(backlog) == 0, "Jobs loaded before the cache synced are not counted"

    async def create(name: str) -> None:
        async with backlog.admitting():
            await asyncio.sleep(0)
            cache.apply(f"jobs/p/{name}", job(name), next(revision))  # its commit reaches the cache

    await create("a")
    await create("b")
    assert len(backlog) == 2
    third = asyncio.create_task(create("c"))
    await _spins()
    assert not third.done() and backlog.waited == 1, "two Jobs in flight: the third create waits"
    cache.apply("attempts/p/a-0-1", attempt("a"), next(revision))
    await _spins()
    assert not third.done(), "an attempt created but not decided yet is still on its way"
    cache.apply("attempts/p/a-0-1", attempt("a", node="n1"), next(revision))
    await asyncio.wait_for(third, 5)
    assert len(backlog) == 2, "a left (bound to n1), c came in"

    fourth = asyncio.create_task(create("d"))
    await _spins()
    assert not fourth.done()
    cache.apply("attempts/p/b-0-1", attempt("b", explain="no node fits: ..."), next(revision))
    await asyncio.wait_for(fourth, 5)  # parked with its explain: it waits for capacity, not for the pipeline

    fifth = asyncio.create_task(create("e"))
    await _spins()
    assert not fifth.done()
    cache.apply("jobs/p/c", None, next(revision))  # deleted
    await asyncio.wait_for(fifth, 5)

    sixth = asyncio.create_task(create("f"))
    await _spins()
    assert not sixth.done()
    clock.t += 6.0  # d and e got no attempt decided for longer than patience (suspended, say)
    await asyncio.wait_for(sixth, 5)
    assert len(backlog) == 1, "only f is in flight"

    cache.apply("jobs/p/f", job("f", "Succeeded"), next(revision))
    assert len(backlog) == 0, "a finished Job is not in flight"
    await cache.stop()
    await store.close()


def test_a_create_waits_for_the_jobs_before_it_to_be_decided(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


async def _not_gated(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    fleet = Fleet(Cache(store), ManualClock())
    fleet.backlog.limit = 1
    await fleet.cache.start()
    fleet.cache.apply("jobs/p/a", job("a"), 1)
    assert len(fleet.backlog) == 1
    for kind, dry_run in (("Job", True), ("Sweep", False)):
        async with Fleet.admitting(fleet, kind, dry_run):
            pass  # would wait for patience if it were gated
    assert fleet.backlog.waited == 0
    async with Fleet.admitting(None, "Job", False):
        pass
    fleet.backlog.limit = 0  # what --controllers off sets: nothing would ever decide
    async with Fleet.admitting(fleet, "Job", False):
        pass
    assert fleet.backlog.waited == 0
    await fleet.cache.stop()
    await store.close()


def test_dry_runs_other_kinds_and_no_controllers_never_wait(tmp_path: Path) -> None:
    asyncio.run(_not_gated(tmp_path))


async def _one_per_leave(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    backlog = PlacementBacklog(cache, limit=1, patience=5.0, now=Clock())
    await cache.start()
    cache.apply("jobs/p/a", job("a"), 1)
    cache.apply("jobs/p/b", job("b"), 2)  # over the limit (created elsewhere): two leaves to wait for
    entered: list[str] = []

    async def create(name: str, hold: asyncio.Event) -> None:
        async with backlog.admitting():
            entered.append(name)
            await hold.wait()

    holds = {n: asyncio.Event() for n in "xyz"}
    waiting = {n: asyncio.create_task(create(n, holds[n])) for n in "xyz"}
    await _spins()
    assert not entered and backlog.waited == 3
    cache.apply("attempts/p/a-0-1", attempt("a", node="n1"), 3)
    await _spins()
    assert entered == [], "one Job left but one is still in flight: the first waiter looks and waits again"
    cache.apply("attempts/p/b-0-1", attempt("b", explain="no node fits"), 4)
    await _spins()
    assert entered == ["x"], "a leave wakes the first waiter only"
    waiting["y"].cancel()  # y was next (its client went away): the next wake goes to z
    await _spins()
    cache.apply("jobs/p/x", job("x"), 5)
    cache.apply("attempts/p/x-0-1", attempt("x", node="n1"), 6)
    holds["x"].set()
    await _spins()
    assert entered == ["x", "z"]
    holds["z"].set()
    await asyncio.gather(waiting["x"], waiting["z"])
    await cache.stop()
    await store.close()


def test_a_decided_job_wakes_one_waiting_create_first_come_first_served(tmp_path: Path) -> None:
    asyncio.run(_one_per_leave(tmp_path))


async def _attempt_first(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    backlog = PlacementBacklog(cache, limit=1, patience=5.0, now=Clock())
    await cache.start()
    # Another replica's Job created with its first attempt in one commit (ADR 0108, 0118): this replica's watch
    # of attempts applied the attempt, parked with its explain, before its watch of Jobs applied the Job.
    cache.apply("attempts/p/a-0-1", attempt("a", explain="no node fits: ..."), 2)
    cache.apply("jobs/p/a", job("a"), 1)
    assert len(backlog) == 0, "a Job whose attempt was decided before it appeared is not in flight"
    cache.apply("attempts/p/b-0-1", attempt("b"), 4)  # created, not decided yet: b is on its way
    cache.apply("jobs/p/b", job("b"), 3)
    assert len(backlog) == 1
    async with asyncio.timeout(5):
        creates = asyncio.create_task(_enter(backlog))
        await _spins()
        assert not creates.done(), "b holds the one slot"
        cache.apply("attempts/p/b-0-1", attempt("b", node="n1"), 5)
        await creates
    assert backlog.waited == 1
    await cache.stop()
    await store.close()


async def _enter(backlog: PlacementBacklog) -> None:
    async with backlog.admitting():
        pass


def test_a_job_whose_attempt_reached_the_cache_first_is_not_in_flight(tmp_path: Path) -> None:
    asyncio.run(_attempt_first(tmp_path))


async def _patience(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    clock = Clock()
    backlog = PlacementBacklog(cache, limit=1, patience=5.0, now=clock)
    await cache.start()
    held, entered = asyncio.Event(), []

    async def create(name: str) -> None:
        async with backlog.admitting():
            entered.append(name)
            await held.wait()

    first = asyncio.create_task(create("slow"))  # admitted, never answered: it holds the one slot
    await _spins()
    waiters = [asyncio.create_task(create(f"w{i}")) for i in range(3)]
    await _spins()
    assert entered == ["slow"] and backlog.waited == 3
    clock.t += 6.0  # past their patience: they go in at the next look, though the slot is still held
    async with asyncio.timeout(5):
        while len(entered) < 4:
            await asyncio.sleep(0.05)
    assert entered == ["slow", "w0", "w1", "w2"], "in the order they came"
    held.set()
    await asyncio.gather(first, *waiters)
    await cache.stop()
    await store.close()


def test_a_create_waits_no_longer_than_its_patience(tmp_path: Path) -> None:
    asyncio.run(_patience(tmp_path))
