"""The fleet's indexes (controllers/fleet.py) follow the store through the cache: what a live placed
attempt holds, the start times per offering and the run history per project and command or image are
what a scan of the store would say, after creates, changes and deletes, and after a restart."""
from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from nodus.coordinator.clock import ManualClock, rfc3339
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.scheduler import Amount, Reservation
from nodus.coordinator.store import SqliteStore


def _attempt(name: str, node: str, phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "p"},
            "spec": {"job": "j", "node": node, "offering": "cpu-x1", "resources": {"cpu": "2"}},
            "status": {"phase": phase, **status}}


def _job(name: str, command: list[str], phase: str, start: str, end: str, digest: str = "",
         expected: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "startTime": start, "completionTime": end}
    if digest:
        status["image"] = {"digest": digest}
    spec: dict[str, Any] = {"command": command}
    if expected:
        spec["expectedDuration"] = expected
    return {"metadata": {"name": name, "namespace": "p"}, "spec": spec, "status": status}


async def _put(store: SqliteStore, key: str, obj: dict[str, Any]) -> None:
    rec = await store.get(key)
    if rec is None:
        await store.create(key, orjson.dumps(obj))
    else:
        await store.update(key, orjson.dumps(obj), rec.revision)


async def _settle(fleet: Fleet, check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    assert check()


async def _scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    fleet = Fleet(cache, ManualClock())
    await cache.start()
    await _put(store, "attempts/p/a1", _attempt("a1", "n1", "Running", provisioningTime="2026-01-01T00:00:00Z",
                                                  startTime="2026-01-01T00:00:04.5Z"))
    await _put(store, "attempts/p/a2", _attempt("a2", "n1", "Provisioning"))
    await _put(store, "jobs/p/ok", _job("ok", ["python", "t.py"], "Succeeded", "2026-01-01T00:00:00Z",
                                        "2026-01-01T00:10:00Z", digest="sha256:aa", expected="5m"))
    await _put(store, "jobs/p/bad", _job("bad", ["python", "t.py"], "Failed", "2026-01-01T00:00:00Z",
                                         "2026-01-01T00:01:00Z"))
    await _settle(fleet, lambda: len(fleet.reservations()) == 2 and fleet.history("p", None, ["python", "t.py"]))
    assert sorted(fleet.reservations(), key=lambda r: r.amount.cpu_millis) == [
        Reservation("n1", Amount(2000, 0, 0, 0)), Reservation("n1", Amount(2000, 0, 0, 0))]
    assert fleet.start_seconds("cpu-x1") == (Decimal("4.5"),), "one attempt started on the offering"
    assert fleet.history("p", None, ["python", "t.py"]) == [Decimal("600.0")], "only the Job that succeeded"
    assert fleet.history("p", "sha256:aa", ["python", "t.py"]) == [Decimal("600.0")], "a Job matching twice counts once"
    assert fleet.history("p", "sha256:aa", None) == [Decimal("600.0")]
    assert fleet.history("other", None, ["python", "t.py"]) == [], "another project's history is not this one's"
    assert fleet.overruns("p") == [Decimal("2.000")], "it ran 10 minutes of the 5 it declared"

    # A finished attempt frees what it held; a deleted Job leaves the history; a Job that now succeeds joins it.
    await _put(store, "attempts/p/a2", _attempt("a2", "n1", "Succeeded"))
    await store.delete("jobs/p/ok")
    await _put(store, "jobs/p/bad", _job("bad", ["python", "t.py"], "Succeeded", "2026-01-01T00:00:00Z",
                                         "2026-01-01T00:02:00Z"))
    await _settle(fleet, lambda: len(fleet.reservations()) == 1
                  and fleet.history("p", None, ["python", "t.py"]) == [Decimal("120.0")])
    assert fleet.history("p", "sha256:aa", None) == []
    assert fleet.overruns("p") == [], "the deleted Job's record goes with it; the other declared nothing"
    await cache.stop()

    # A restart rebuilds the same indexes from the store.
    again = Fleet(Cache(store), ManualClock())
    await again.cache.start()
    assert again.reservations() == fleet.reservations()
    assert again.history("p", None, ["python", "t.py"]) == [Decimal("120.0")]
    assert again.start_seconds("cpu-x1") == (Decimal("4.5"),)
    await again.cache.stop()
    await store.close()


def test_fleet_indexes_follow_the_store(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


async def _nodes_scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    clock = ManualClock()
    fleet = Fleet(cache, clock)
    await cache.start()
    t0 = clock.now()

    def lease(expire: float) -> dict[str, Any]:
        return {"node": "n1", "sessionId": "s", "expireTime": rfc3339(expire)}
    await _put(store, "_nodes/n1", {"name": "n1", "runtimes": ["process"], "capacity": {"cpuMillis": 4000}})
    await _put(store, "_leases/n1", lease(t0 + 15))
    await _put(store, "_nodes/n2", {"name": "n2", "runtimes": ["process"], "capacity": {"cpuMillis": 4000}})
    await _settle(fleet, lambda: [(v.name, v.ready) for v in fleet.nodes()] == [("n1", True), ("n2", False)])
    assert fleet.nodes() == fleet.nodes(), "nothing changed: the same answer (kept, not rebuilt)"
    clock.advance(15)
    assert [v.ready for v in fleet.nodes()] == [False, False], "the lease ran out with no event: NotReady"
    await _put(store, "_leases/n1", lease(clock.now() + 15))
    await _settle(fleet, lambda: [v.ready for v in fleet.nodes()] == [True, False])
    await _put(store, "_nodes/n2", {"name": "n2", "runtimes": ["process"], "cordoned": True,
                                    "capacity": {"cpuMillis": 4000}})
    await _settle(fleet, lambda: fleet.nodes()[1].cordoned)
    await store.delete("_nodes/n2")
    await _settle(fleet, lambda: [v.name for v in fleet.nodes()] == ["n1"])

    # Renewals leave a node's view as it was: the answer and the classes every create reads are kept (ADR 0116);
    # a node whose lease is not renewed still turns NotReady when it runs out, though the first lease to run out
    # was renewed meanwhile; a heartbeat's GPU health still reaches the view.
    t1 = clock.now()
    await _put(store, "_nodes/n3", {"name": "n3", "runtimes": ["process"], "capacity": {"cpuMillis": 4000},
                                    "gpus": [{"index": 0, "name": "A100"}, {"index": 1, "name": "A100"}]})
    await _put(store, "_leases/n3", {**lease(t1 + 20), "node": "n3"})
    await _put(store, "_leases/n1", lease(t1 + 10))
    await _settle(fleet, lambda: (cache.get("_leases/n1") or {}).get("expireTime") == rfc3339(t1 + 10)
                  and [(v.name, v.ready) for v in fleet.nodes()] == [("n1", True), ("n3", True)])
    classes = fleet.rooms()[1]
    await _put(store, "_leases/n1", lease(t1 + 40))
    await _settle(fleet, lambda: (cache.get("_leases/n1") or {}).get("expireTime") == rfc3339(t1 + 40))
    assert fleet.rooms()[1] is classes, "a renewal changes no view: the classes are kept, not made again"
    clock.advance(21)
    assert [(v.name, v.ready) for v in fleet.nodes()] == [("n1", True), ("n3", False)], "n3's lease ran out"
    await _put(store, "_leases/n3", {**lease(clock.now() + 15), "node": "n3", "gpuUnhealthy": {"1": "Xid: 79"}})
    await _settle(fleet, lambda: [v.ready for v in fleet.nodes()] == [True, True])
    assert fleet.nodes()[1].healthy == (0,), "the heartbeat's GPU health is in the view"
    await cache.stop()
    await store.close()


def test_node_views_follow_their_objects_and_readiness_follows_the_clock(tmp_path: Path) -> None:
    """`Fleet.nodes` keeps its answer between changes (it runs on every create and pass) and still sees a node
    or lease change at once, and a lease running out with no event at all."""
    asyncio.run(_nodes_scenario(tmp_path))
