"""The placement queue (controllers/placement_queue.py, docs/adr/0038): an attempt that fits nowhere is
parked and decided again only on an event that can change its answer (a node joins with room,
capacity comes free, its Job's spec changes, the price book changes) or on the slow retry timer; a
pass with nothing to decide writes nothing.

Run in process on a stepped clock (nothing sleeps): the controller's passes are called directly, and
`PlacementController.tried` counts the decisions they made.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.controllers.placement import PlacementController
from nodus.coordinator.controllers.placement_queue import RETRY_SECONDS, Headroom, PlacementQueue
from nodus.coordinator.nodes import NodeRegistry
from nodus.coordinator.scheduler import PROCESS, Amount, Gpu, NodeView, Request, Reservation
from nodus.coordinator.store import SqliteStore
from nodus.v1 import common_pb2

GI = 1 << 30


def _inventory(gpus: int, name: str = "NVIDIA H100 80GB HBM3") -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(
        runtimes=[common_pb2.RUNTIME_PROCESS], host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33),
        gpus=[common_pb2.Gpu(index=i, name=name, memory_bytes=80 * GI) for i in range(gpus)])


def _job(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"command": ["true"], "resources": {"gpu": {"count": gpus}}}}


async def _scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    clock = ManualClock()
    cache = Cache(store)
    fleet = Fleet(cache, clock)
    objects = Objects(store, cache)
    registry = NodeRegistry(fleet, objects, clock, lease_duration=15, heartbeat_interval=3)
    pc = PlacementController(registry, objects, clock)
    await cache.start()
    full = await registry.register("full", _inventory(0))
    keys = []
    for i in range(5):
        job = _job(f"j{i}")
        await objects.create(job_key("default", job["metadata"]["name"]), job)
        attempt = new_attempt(job, 0, 1, clock.now())
        keys.append(attempt_key("default", attempt["metadata"]["name"]))
        await objects.create(keys[-1], attempt)
        clock.advance(1)

    def explained(key: str) -> str:
        return ((cache.get(key) or {}).get("status") or {}).get("placement", {}).get("explain", "")

    def node_of(key: str) -> str:
        return ((cache.get(key) or {}).get("spec") or {}).get("node", "")

    await pc.place()
    assert pc.tried == 5 and len(pc.queue.parked) == 5
    assert all("full: gpu: wants 1 × any, 0 free" in explained(k) for k in keys), explained(keys[0])
    revisions = [cache.revision(k) for k in keys]
    await pc.place()
    await registry.renew("full", full["sessionId"], full["epoch"])  # a heartbeat changes no answer
    await pc.place()
    assert pc.tried == 5, "parked attempts are not decided again without an event"
    assert [cache.revision(k) for k in keys] == revisions, "a pass that changes nothing writes nothing"

    await registry.register("two", _inventory(2))  # room for two joins: the two oldest wake, not the queue
    await pc.place()
    assert pc.tried == 7
    assert [node_of(k) for k in keys] == ["two", "two", "", "", ""]
    assert len(pc.queue.parked) == 3

    await objects.delete(keys[0])  # capacity comes free on "two": one more wakes and takes it
    await pc.place()
    assert pc.tried == 8 and node_of(keys[2]) == "two" and len(pc.queue.parked) == 2

    def bigger(obj: dict[str, Any]) -> dict[str, Any]:
        obj["spec"]["resources"] = {"gpu": {"count": 2}}
        return obj
    await objects.mutate(job_key("default", "j4"), bigger)  # its Job's spec changed: only it is decided again
    await pc.place()
    assert pc.tried == 9 and len(pc.queue.parked) == 2

    assert pc.queue.due(time.monotonic() + RETRY_SECONDS + 1) == 2, "the slow timer retries every parked attempt"
    await pc.place()
    assert pc.tried == 11
    await cache.stop()
    await store.close()


def test_parked_attempts_wait_for_an_event_that_can_place_them(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


def _node(name: str, gpus: int, family: str = "H100") -> NodeView:
    return NodeView(name, True, False, frozenset({PROCESS}), Amount(8000, 32 * GI, 100 * GI, gpus),
                    tuple(Gpu(i, family, 80 * GI) for i in range(gpus)))


def _gpus(n: int, kind: str = "") -> Request:
    return Request.of({"gpu": {"count": n, **({"type": [kind]} if kind else {})}}, None)


def test_a_freed_node_wakes_only_what_fits_it_oldest_first() -> None:
    q = PlacementQueue()
    for key, request in (("a100", _gpus(1, "A100")), ("eight", _gpus(8)), ("one", _gpus(1)), ("two", _gpus(2)),
                         ("also-one", _gpus(1))):
        q.add(key)
        q.park(key, "p", key, request, 0.0)
    node = _node("n", 4)
    held = [Reservation("n", Amount(gpus=1), (0,)), Reservation("other", Amount(gpus=4), (0, 1, 2, 3))]
    assert q.wake_fitting(node, held) == 2, "three GPUs free: one then two, in parked order"
    assert q.active == {"one", "two"} and set(q.parked) == {"a100", "eight", "also-one"}
    assert q.wake_fitting(NodeView("down", False, False, frozenset({PROCESS}), Amount(gpus=8),
                                   tuple(Gpu(i, "H100") for i in range(8))), []) == 0, "a NotReady node wakes nothing"


def test_a_gang_wakes_whole_and_deadlines_come_in_order() -> None:
    q = PlacementQueue(retry_seconds=60)
    gang = ("p", "uid", 1)
    for rank in range(2):
        q.add(f"r{rank}")
        q.park(f"r{rank}", "p", "g", _gpus(1), 0.0, gang)
    q.add("money")
    q.park("money", "p", "m", _gpus(1), 0.0, retry_in=5)
    assert q.next_due() == 5
    assert q.due(5) == 1 and q.active == {"money"}
    assert q.next_due() == 60
    assert q.wake(["r1"]) == 2 and q.active == {"money", "r0", "r1"}, "one member wakes its gang"
    assert q.next_due() is None


def test_a_timed_retry_that_fits_nowhere_waits_another_period_without_a_pass() -> None:
    """The safety net on a full fleet: a due attempt above the fleet's headroom (the most any ready,
    uncordoned node has free, per dimension) is parked again for RETRY_SECONDS instead of woken for a pass
    over every node; one the headroom admits wakes as before."""
    q = PlacementQueue(retry_seconds=60)
    for key, request in (("two", _gpus(2)), ("one", _gpus(1)), ("cpu", Request.of({"cpu": "16"}, None))):
        q.add(key)
        q.park(key, "p", key, request, 0.0)
    nodes = [_node("a", 4), _node("b", 4),
             NodeView("idle-but-down", False, False, frozenset({PROCESS}), Amount(64000, 256 * GI, 100 * GI, 8),
                      tuple(Gpu(i, "H100") for i in range(8))),
             NodeView("idle-but-cordoned", True, True, frozenset({PROCESS}), Amount(64000, 256 * GI, 100 * GI, 8),
                      tuple(Gpu(i, "H100") for i in range(8)))]
    held = [Reservation("a", Amount(gpus=3), (0, 1, 2)), Reservation("b", Amount(gpus=4), (0, 1, 2, 3))]
    room = Headroom.of(nodes, held)
    assert room == Headroom(gpus=1, cpu_millis=8000, memory_bytes=32 * GI, disk_bytes=100 * GI)
    assert q.due(60, room) == 1 and q.active == {"one"}, "one GPU free on a: only the one-GPU attempt can use it"
    assert set(q.parked) == {"two", "cpu"} and q.next_due() == 120, "the others wait a whole period again"
    sick = NodeView("sick", True, False, frozenset({PROCESS}), Amount(8000, 32 * GI, 100 * GI, 2),
                    (Gpu(0, "H100", unhealthy="Xid 79"), Gpu(1, "H100", unhealthy="Xid 79")))
    assert Headroom.of([sick], []).gpus == 0, "an unhealthy GPU is no room"
    assert q.due(120) == 2 and set(q.active) == {"one", "two", "cpu"}, "without a headroom every due attempt wakes"
