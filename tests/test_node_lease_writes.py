"""How often a heartbeating node's lease is written to the store (ADR 0049), on the injected clock: with
a 15 s lease and a heartbeat every 3 s, one write in three heartbeats (whenever less than half the lease
is left on the stored one), at once when a GPU's health changes; the node stays alive on the replica
that hears it between writes, and its lease runs out a lease after its last heartbeat."""
from __future__ import annotations

import asyncio
from pathlib import Path

from nodus.coordinator.clock import ManualClock, parse
from nodus.coordinator.controllers.cache import LEASES, Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.lease import LeaseController
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.nodes import NodeRegistry
from nodus.coordinator.store import SqliteStore
from nodus.v1 import common_pb2


async def _scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    clock = ManualClock()
    cache = Cache(store)
    await cache.start()
    registry = NodeRegistry(Fleet(cache, clock), Objects(store, cache), clock, lease_duration=15,
                            heartbeat_interval=3)
    inventory = common_pb2.NodeInventory(runtimes=[common_pb2.RUNTIME_PROCESS],
                                         host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33),
                                         gpus=[common_pb2.Gpu(index=0, name="NVIDIA H100")])
    node = await registry.register("n1", inventory)
    leases = LeaseController(registry, registry.objects)

    async def stored_revision() -> int:
        await registry.written()
        found = await registry.objects.read(LEASES + "n1")
        assert found is not None
        return int(found[1])

    revisions = [await stored_revision()]
    for _ in range(20):  # 60 s of heartbeats
        clock.advance(3)
        registry.beat("n1", node["sessionId"], node["epoch"], gpus=[common_pb2.Gpu(index=0)])
        revisions.append(await stored_revision())
        assert await leases.check() == [] and registry.ready("n1")
    writes = sum(1 for a, b in zip(revisions, revisions[1:]) if b != a)
    assert writes == 7, (writes, revisions)  # the first (GPU health now reported) and then every third

    registry.beat("n1", node["sessionId"], node["epoch"], gpus=[common_pb2.Gpu(index=0, unhealthy_reason="Xid")])
    await registry.written()
    stored = cache.get(LEASES + "n1") or {}
    assert stored.get("gpuUnhealthy") == {"0": "Xid: "}, stored

    last = clock.now()
    lease = registry.lease("n1") or {}
    assert parse(lease.get("expireTime")) == last + 15  # as the LeaseRenewal tells the agent
    clock.advance(14.9)
    assert await leases.check() == []
    clock.advance(0.2)
    assert await leases.check() == ["n1"] and not registry.ready("n1")
    await cache.stop()
    await store.close()


def test_heartbeats_write_the_lease_once_in_three_and_at_once_on_gpu_health(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
