"""A restarted coordinator's lease grace starts when the agents can reconnect, and a reconnect counts as
alive (ADR 0088), on the injected clock with the real registry, store and lease controller.

Before: the grace ran from the moment the controllers started, while the cache was still loading and
before the gRPC server accepted anything; on a large store under a reconnect storm it elapsed while the
agents were still being refused, and nodes that reconnected late in it, before their first heartbeat,
had their attempts marked Lost and replaced while they ran.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.attempts import phase_of
from nodus.coordinator.controllers.cache import LEASES, Cache, attempt_key
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.lease import LeaseController
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.nodes import NodeRegistry
from nodus.coordinator.scheduler import Placement
from nodus.coordinator.store import SqliteStore
from nodus.v1 import common_pb2, node_pb2, node_pb2_grpc
from agent_double import wait_for
from conftest import Coordinator
from e2e import attempts_of, create
from test_agent_service import CANCELLED, RUNNING, FakeAgent, agent_pb2, phase_is, ts, wait_job

LEASE = 15.0


def _inventory() -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(runtimes=[common_pb2.RUNTIME_PROCESS],
                                    host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33),
                                    gpus=[common_pb2.Gpu(index=0, name="NVIDIA H100")])


async def _restarted(path: Path) -> tuple[SqliteStore, Cache, ManualClock, NodeRegistry, dict[str, str], str]:
    """A node with a running attempt, as a coordinator that has just been restarted finds it: its stored
    lease ran out while the coordinator was down, no heartbeat heard since."""
    store = await SqliteStore.open(path / "store.db")
    clock = ManualClock()
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    before = NodeRegistry(Fleet(cache, clock), objects, clock, lease_duration=LEASE, heartbeat_interval=3)
    node = await before.register("n1", _inventory())
    before.beat("n1", node["sessionId"], node["epoch"], gpus=[common_pb2.Gpu(index=0, unhealthy_reason="Xid")])
    await before.written()
    job = {"metadata": {"name": "j", "namespace": "default", "uid": "u1"}, "spec": {"command": ["true"]}}
    attempt = new_attempt(job, 0, 1, clock.now())
    key = attempt_key("default", attempt["metadata"]["name"])
    await objects.create(key, attempt)
    await objects.mutate(key, bind(Placement("n1"), clock.now()))
    clock.advance(120)  # the coordinator was down for eight leases
    registry = NodeRegistry(Fleet(cache, clock), objects, clock, lease_duration=LEASE, heartbeat_interval=3)
    registry.leases.hold()  # what ControlPlane does at construction
    return store, cache, clock, registry, {"sessionId": node["sessionId"], "epoch": node["epoch"]}, key


async def _grace_from_serving(path: Path) -> None:
    store, cache, clock, registry, _, key = await _restarted(path)
    leases = LeaseController(registry, registry.objects)
    # Loading the cache and starting the servers takes longer than a lease: nothing runs out meanwhile.
    clock.advance(3 * LEASE)
    assert await leases.check() == [] and registry.ready("n1")
    registry.leases.grace()  # the gRPC server accepts reconnects from now
    clock.advance(LEASE - 0.1)
    assert await leases.check() == [] and registry.ready("n1"), "a whole lease of grace from serving"
    clock.advance(0.2)
    assert await leases.check() == ["n1"] and not registry.ready("n1")
    lost = cache.get(key)
    assert lost is not None and phase_of(lost).value == "Lost"
    await cache.stop()
    await store.close()


def test_the_restart_grace_starts_when_the_coordinator_serves(tmp_path: Path) -> None:
    asyncio.run(_grace_from_serving(tmp_path))


async def _reconnect_is_alive(path: Path) -> None:
    store, cache, clock, registry, session, key = await _restarted(path)
    leases = LeaseController(registry, registry.objects)
    registry.leases.grace()
    clock.advance(LEASE - 1)
    registry.hello("n1", session["sessionId"], int(session["epoch"]))  # late in the grace; no heartbeat yet
    await registry.written()
    stored = cache.get(LEASES + "n1") or {}
    assert stored.get("gpuUnhealthy") == {"0": "Xid: "}, "a reconnect keeps what the last heartbeat said"
    clock.advance(LEASE - 0.1)  # the grace is long over; the reconnect's own lease is not
    assert await leases.check() == [] and registry.ready("n1")
    assert phase_of(cache.get(key) or {}).value != "Lost"
    clock.advance(0.2)  # silent since: the node is lost after all
    assert await leases.check() == ["n1"]
    await cache.stop()
    await store.close()


def test_a_reconnect_keeps_the_node_alive_until_its_first_heartbeat(tmp_path: Path) -> None:
    asyncio.run(_reconnect_is_alive(tmp_path))



# -- through the real coordinator: a node back only after its lease ran out across a restart -------------

def test_a_node_back_after_its_lease_ran_out_across_a_restart_is_resynchronised_and_nothing_runs_twice(
        tmp_path: Path) -> None:
    """node-a runs an attempt; the coordinator restarts; node-b reconnects at once, node-a only after its
    lease and the grace ran out, so its attempt is Lost and replaced on node-b. node-a then reconnects with
    the same session (no Register), its Hello still reporting the attempt running: FullState tells it to
    stop it (NodeLost), it is re-synchronised, and one attempt runs, node-b's."""
    c = Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "1s", "--heartbeat-interval", "0.2s"))
    a = b = None
    try:
        a = FakeAgent(c, "node-a")
        a.register()
        a.connect()
        a.expect("full_state")
        a.start_heartbeats()
        create(c, "late", backoffLimit=0, recovery={"maxAttempts": 1})
        first = a.expect("assignment")
        a.update(first.attempt_id, RUNNING)
        wait_job(c, "late", phase_is("Running"))
        b = FakeAgent(c, "node-b")  # joins once node-a holds the attempt
        b.register()
        b.connect()
        b.expect("full_state")

        c.stop()
        c.start()
        b.reconnect_to(c)
        b.connect()
        assert not b.expect("full_state").assignments
        b.start_heartbeats()
        second = b.expect("assignment", timeout=30)  # node-a's lease ran out: its attempt is replaced here
        assert second.index == 0 and second.attempt_id != first.attempt_id
        b.update(second.attempt_id, RUNNING)

        a.reconnect_to(c)
        a.connect([agent_pb2.AttemptObservation(status=agent_pb2.AttemptUpdate(
            attempt_id=first.attempt_id, phase=RUNNING, time=ts()))])  # the same session: no Register
        full = a.expect("full_state")
        assert not full.assignments
        assert [(x.attempt_id, x.reason) for x in full.cancels] == [(first.attempt_id, "NodeLost")]
        a.start_heartbeats()
        a.finish(first.attempt_id, CANCELLED, reason="NodeLost")
        attempts = {x["metadata"]["name"]: x for x in attempts_of(c, "late")}
        live = [x for x in attempts.values() if x["status"]["phase"] not in ("Lost", "Cancelled", "Failed")]
        assert [x["spec"]["node"] for x in live] == ["node-b"], [(x["spec"].get("node"), x["status"]) for x in
                                                                 attempts.values()]
        wait_for(lambda: _node_ready(c, "node-a"), 15, interval=0.1, what="node-a Ready again")
    finally:
        for agent in (a, b):
            if agent is not None:
                agent.close()
        c.stop()


def _node_ready(c: Coordinator, name: str) -> bool:
    with c.channel() as channel:
        node = node_pb2_grpc.NodeServiceStub(channel).GetNode(
            node_pb2.GetNodeRequest(name=name), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)
    return bool(node.phase == node_pb2.NODE_PHASE_READY)
