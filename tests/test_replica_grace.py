"""A replica that restarts holds its nodes' leases on the leader until it serves them again, and a lease
more (docs/adr/0098-a-replicas-restart-holds-the-leases.md).

Two replicas on one PostgreSQL database, each with its own store, cache and NodeRegistry, on one injected
clock: the leader runs the lease controller; the follower restarts while one of its nodes runs an attempt.
The node's agent knows only the follower, so nothing renews its lease until the follower serves again, and
then the follower's renewal write is held back (a busy store's queue). Before ADR 0098 the leader gave only
its own restart grace: it expired the lease 15 s after it served and marked the running attempt Lost, while
the follower was starting — and, as `bench/fleet.py --postgres --replicas 3` showed for 38 of 500 nodes,
while the agent was already connected to the follower and beating.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nodus.coordinator.clock import ManualClock, rfc3339
from nodus.coordinator.controllers import replicas
from nodus.coordinator.controllers.cache import LEASES, Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.lease import LeaseController
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.nodes import NodeRegistry
from nodus.coordinator.store.postgres import PostgresStore
from nodus.v1 import common_pb2
from postgres import postgres_cluster  # noqa: F401 - the session fixture

ATTEMPT = "attempts/p/j-0-1"
INVENTORY = common_pb2.NodeInventory(runtimes=[common_pb2.RUNTIME_PROCESS],
                                     host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33),
                                     gpus=[common_pb2.Gpu(index=0, name="NVIDIA H100")])


class _HeldLeaseWrites(Objects):
    """The follower's lease writes wait for `gate`: its store's queue is long."""

    def __init__(self, store: PostgresStore, cache: Cache) -> None:
        super().__init__(store, cache)
        self.gate = asyncio.Event()

    async def upsert(self, key: str, mutation: Any) -> dict[str, Any]:
        if key.startswith(LEASES):
            await self.gate.wait()
        return await super().upsert(key, mutation)


async def _scenario(url: str) -> None:
    clock = ManualClock()
    t0 = clock.now()
    lstore, fstore = await PostgresStore.open(url), await PostgresStore.open(url)
    lcache, fcache = Cache(lstore), Cache(fstore)
    await lcache.start()
    leader = NodeRegistry(Fleet(lcache, clock), Objects(lstore, lcache), clock, lease_duration=15, heartbeat_interval=3)
    leases = LeaseController(leader, leader.objects)
    try:
        # Before the restart: the node registered through the follower, which stored its lease (until t0 + 15).
        node = await NodeRegistry(Fleet(Cache(fstore), clock), Objects(fstore, Cache(fstore)), clock, 15, 3).register(
            "n1", INVENTORY)
        await leader.objects.create(ATTEMPT, {
            "apiVersion": "nodus.dev/v1", "kind": "Attempt", "metadata": {"name": "j-0-1", "namespace": "p"},
            "spec": {"id": "att-1", "job": "j", "jobUID": "u", "index": 0, "number": 1, "node": "n1"},
            "status": {"phase": "Running", "startTime": rfc3339(t0)}})
        await _until(lambda: leader.node("n1") is not None and lcache.get(LEASES + "n1") is not None)

        # The follower restarts: it records its start, then loads for a long while.
        clock.advance(5)
        await replicas.announce(fstore, "follower-2", clock.now())
        clock.advance(15)  # t0 + 20: the stored lease and the leader's own grace both ran out
        assert await leases.check() == [], "the leader expired a node whose replica was still starting"
        assert _phase(lcache) == "Running"

        # It serves (t0 + 22): the agent reconnects and beats there, but the renewal does not land yet.
        clock.advance(2)
        await fcache.start()
        fobjects = _HeldLeaseWrites(fstore, fcache)
        follower = NodeRegistry(Fleet(fcache, clock), fobjects, clock, lease_duration=15, heartbeat_interval=3)
        await replicas.announce(fstore, "follower-2", t0 + 5, clock.now())
        follower.hello("n1", node["sessionId"], node["epoch"])
        for _ in range(3):  # beats every 3 s until t0 + 31
            clock.advance(3)
            follower.beat("n1", node["sessionId"], node["epoch"])
            assert await leases.check() == [], \
                "the leader expired a node heard by a replica that served it less than a lease ago"
        assert _phase(lcache) == "Running"

        fobjects.gate.set()  # the renewal lands: the node is alive in the store again
        await follower.written()
        clock.advance(3)  # t0 + 34
        follower.beat("n1", node["sessionId"], node["epoch"])
        await follower.written()
        clock.advance(9)  # t0 + 43: the follower's grace is over; the stored lease holds (until t0 + 49)
        assert await leases.check() == []
        assert _phase(lcache) == "Running"
        lease = (await leader.objects.read(LEASES + "n1") or ({}, 0))[0]
        assert lease.get("expired") is False, lease

        # The node falls silent: one lease after its last heartbeat it is expired and its attempt Lost.
        follower.forget("n1", node["sessionId"])
        clock.advance(7)  # t0 + 50
        assert await leases.check() == ["n1"]
        assert _phase(lcache) == "Lost"
        assert await replicas.read(lstore) == [], "a record whose grace is over was kept"
        await fcache.stop()
    finally:
        await lcache.stop()
        await lstore.close()
        await fstore.close()


def _phase(cache: Cache) -> str:
    return str(((cache.get(ATTEMPT) or {}).get("status") or {}).get("phase"))


async def _until(check: Any) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the leader's cache never caught up")


def test_a_restarting_replicas_node_keeps_its_lease_until_the_replica_serves_it_again(
        postgres_cluster: Any) -> None:  # noqa: F811
    asyncio.run(_scenario(postgres_cluster.database()))


def test_a_replica_that_never_serves_holds_the_leases_only_a_few_leases() -> None:
    start = 1000.0
    records = [("_replicas/a", {"startTime": rfc3339(start)})]
    assert replicas.grace(records, 15, start + 59).hold
    late = replicas.grace(records, 15, start + 60)
    assert not late.hold and late.stale == ("_replicas/a",)
    served = [("_replicas/a", {"startTime": rfc3339(start), "servingTime": rfc3339(start + 10)})]
    assert replicas.grace(served, 15, start + 20) == replicas.ReplicaGrace(False, start + 10, ())
    assert replicas.grace(served, 15, start + 25).stale == ("_replicas/a",)
