"""Nodes: NodeService for operators over the wire, and leases (expiry on a stepped clock, and for real).

Lease expiry runs twice: once as a unit (a ManualClock steps past the lease; nothing sleeps), and
once end to end with a one-second lease, where a node that stops heartbeating loses its attempt to
another node, counted against recovery.maxAttempts, and is told to stop it when it comes back.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Coordinator
from e2e import attempts_of, create
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.attempts import phase_of
from nodus.coordinator.controllers.cache import Cache, attempt_key
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.lease import LeaseController
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.nodes import Leases, NodeRegistry
from nodus.coordinator.scheduler import Placement
from nodus.coordinator.store import SqliteStore
from nodus.v1 import common_pb2, node_pb2, node_pb2_grpc
from test_agent_service import CANCELLED, RUNNING, FakeAgent, agent_pb2, phase_is, ts, wait_job


class Operator:
    def __init__(self, c: Coordinator, token: str | None = None) -> None:
        self.channel = c.channel()
        self.stub = node_pb2_grpc.NodeServiceStub(self.channel)
        self.md = (("authorization", f"Bearer {token or c.token}"),)

    def __getattr__(self, method: str) -> Any:
        rpc = getattr(self.stub, method)
        return lambda request: rpc(request, metadata=self.md, timeout=10)


@pytest.fixture
def two_nodes(coordinator: Coordinator) -> Iterator[tuple[FakeAgent, FakeAgent]]:
    agents = []
    for name in ("node-a", "node-b"):
        a = FakeAgent(coordinator, name, cpus=8)
        a.register()
        a.connect()
        a.expect("full_state")
        agents.append(a)
    yield agents[0], agents[1]
    for a in agents:
        a.close()


def test_agent_and_node_services_are_serving(coordinator: Coordinator) -> None:
    with coordinator.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("nodus.v1.AgentService", "nodus.v1.NodeService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


def test_list_get_and_attempts(coordinator: Coordinator, two_nodes: tuple[FakeAgent, FakeAgent]) -> None:
    c, (a, _) = coordinator, two_nodes
    op = Operator(c)
    nodes = op.ListNodes(node_pb2.ListNodesRequest()).nodes
    assert [n.name for n in nodes] == ["node-a", "node-b"]
    assert all(n.phase == node_pb2.NODE_PHASE_READY and n.capacity.cpu_millis == 8000 and n.epoch == 1 for n in nodes)
    assert nodes[0].inventory.hostname == "node-a" and list(nodes[0].inventory.runtimes) == [common_pb2.RUNTIME_PROCESS]
    create(c, "ls", resources={"cpu": "2"})
    assignment = a.expect("assignment")
    got = op.GetNode(node_pb2.GetNodeRequest(name="node-a"))
    assert got.free.cpu_millis == 6000 and got.active_attempts == 1 and got.lease_expire_time.seconds
    listed = op.ListAttempts(node_pb2.ListAttemptsRequest(project="default", job="ls")).attempts
    assert [(x.id, x.index, x.number, x.node) for x in listed] == [(assignment.attempt_id, 0, 1, "node-a")]
    assert listed[0].phase == common_pb2.ATTEMPT_PHASE_PROVISIONING and listed[0].job.uid
    assert len(op.ListAttempts(node_pb2.ListAttemptsRequest(node="node-b")).attempts) == 0
    a.finish(assignment.attempt_id, exit_code=0)
    wait_job(c, "ls", phase_is("Succeeded"))
    assert not op.ListAttempts(node_pb2.ListAttemptsRequest(node="node-a")).attempts
    finished = op.ListAttempts(node_pb2.ListAttemptsRequest(node="node-a", include_finished=True)).attempts
    assert finished[0].phase == common_pb2.ATTEMPT_PHASE_SUCCEEDED and finished[0].exit_code == 0
    only_b = op.ListNodes(node_pb2.ListNodesRequest(phase=node_pb2.NODE_PHASE_CORDONED)).nodes
    assert not only_b


def test_cordon_keeps_new_attempts_away(coordinator: Coordinator, two_nodes: tuple[FakeAgent, FakeAgent]) -> None:
    c, (a, b) = coordinator, two_nodes
    op = Operator(c)
    cordoned = op.Cordon(node_pb2.CordonRequest(name="node-a", message="disk check"))
    assert cordoned.phase == node_pb2.NODE_PHASE_CORDONED and cordoned.message == "disk check"
    create(c, "cd", completions=2, parallelism=2)
    got = [b.expect("assignment"), b.expect("assignment")]
    assert sorted(x.index for x in got) == [0, 1] and not a.pending("assignment")
    assert op.Uncordon(node_pb2.UncordonRequest(name="node-a")).phase == node_pb2.NODE_PHASE_READY


def test_drain_moves_attempts_elsewhere_without_counting_a_failure(coordinator: Coordinator,
                                                                   two_nodes: tuple[FakeAgent, FakeAgent]) -> None:
    c, (a, b) = coordinator, two_nodes
    op = Operator(c)
    op.Cordon(node_pb2.CordonRequest(name="node-b"))
    create(c, "dr", backoffLimit=0)
    first = a.expect("assignment")
    a.update(first.attempt_id, RUNNING)
    op.Uncordon(node_pb2.UncordonRequest(name="node-b"))
    draining = op.Drain(node_pb2.DrainRequest(name="node-a", grace_seconds=5, message="kernel update"))
    assert draining.phase == node_pb2.NODE_PHASE_DRAINING
    cancel = a.expect("cancel")
    assert cancel.attempt_id == first.attempt_id and cancel.reason == "Drained" and cancel.grace_seconds == 5
    a.finish(first.attempt_id, CANCELLED, reason="Drained")
    second = b.expect("assignment")
    assert second.index == 0 and second.attempt_number == 2
    b.finish(second.attempt_id, exit_code=0)
    s = wait_job(c, "dr", phase_is("Succeeded"))["status"]
    assert s["failed"] == 0 and s["attempts"]["total"] == 2
    lost = attempts_of(c, "dr")[0]["status"]
    assert lost["phase"] == "Lost" and lost["reason"] == "Drained"
    assert op.GetNode(node_pb2.GetNodeRequest(name="node-a")).phase == node_pb2.NODE_PHASE_DRAINED


def test_operators_only(coordinator: Coordinator) -> None:
    c = coordinator
    project_admin = c.grpc_token("default", "admin")  # an admin of one project is not a cluster operator
    with pytest.raises(grpc.RpcError) as e:
        Operator(c, project_admin).ListNodes(node_pb2.ListNodesRequest())
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        Operator(c).GetNode(node_pb2.GetNodeRequest(name="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        Operator(c).Reclaim(node_pb2.ReclaimRequest(name="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # Reclaim works now (issue 4): an unknown node is named


def test_lease_expiry_replaces_the_attempt_and_the_returning_node_is_told_to_stop_it(tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "1s", "--heartbeat-interval", "0.2s"))
    a = b = None
    try:
        a = FakeAgent(c, "node-a")
        session = a.register()
        assert session.lease_duration.seconds == 1 and session.heartbeat_interval.nanos == 200_000_000
        a.connect()
        a.expect("full_state")
        a.start_heartbeats()
        create(c, "le", backoffLimit=0, recovery={"maxAttempts": 1})
        first = a.expect("assignment")
        a.update(first.attempt_id, RUNNING)
        wait_job(c, "le", phase_is("Running"))
        b = FakeAgent(c, "node-b")
        b.register()
        b.connect()
        b.expect("full_state")
        b.start_heartbeats()
        a.stop_heartbeats()  # node-a goes silent: its lease runs out
        lost_cancel = a.expect("cancel", timeout=10)
        assert lost_cancel.attempt_id == first.attempt_id and lost_cancel.reason == "NodeLost"
        second = b.expect("assignment", timeout=10)
        assert second.index == 0 and second.attempt_number == 2
        op = Operator(c)
        assert op.GetNode(node_pb2.GetNodeRequest(name="node-a")).phase == node_pb2.NODE_PHASE_NOT_READY
        b.update(second.attempt_id, RUNNING)
        b.finish(second.attempt_id, exit_code=0)
        s = wait_job(c, "le", phase_is("Succeeded"))["status"]
        assert s["failed"] == 0 and s["attempts"] == {"current": 2, "max": 1, "total": 2}
        assert attempts_of(c, "le")[0]["status"]["reason"] == "NodeLost"

        # node-a comes back: a new registration, whose Hello still reports the replaced attempt.
        old = a.session
        a.close()
        a = FakeAgent(c, "node-a")
        again = a.register()
        assert again.epoch == 2 and again.node_id == old.node_id and again.session_id != old.session_id
        still = agent_pb2.AttemptObservation(status=agent_pb2.AttemptUpdate(attempt_id=first.attempt_id,
                                                                            phase=RUNNING, time=ts()))
        a.connect([still])
        full = a.expect("full_state")
        assert not full.assignments
        assert [(x.attempt_id, x.reason) for x in full.cancels] == [(first.attempt_id, "NodeLost")]
        a.finish(first.attempt_id, CANCELLED, reason="NodeLost")
        assert attempts_of(c, "le")[0]["status"]["phase"] == "Lost", "a terminal attempt stays as it was"
        # The superseded session cannot act any more.
        stale = FakeAgent(c, "node-a")
        stale.connect(session=old)
        assert stale.ended().code() == grpc.StatusCode.FAILED_PRECONDITION
        stale.close()
    finally:
        for agent in (a, b):
            if agent is not None:
                agent.close()
        c.stop()


def test_a_newer_registration_closes_the_older_stream(coordinator: Coordinator) -> None:
    first = FakeAgent(coordinator, "node-a")
    first.register()
    first.connect()
    first.expect("full_state")
    second = FakeAgent(coordinator, "node-a")
    second.register()
    assert first.ended().code() == grpc.StatusCode.FAILED_PRECONDITION
    first.close()
    second.close()


# -- leases on a stepped clock ----------------------------------------------------------------------------

def _inventory() -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(runtimes=[common_pb2.RUNTIME_PROCESS],
                                    host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33))


async def _lease_scenario(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    clock = ManualClock()
    cache = Cache(store)
    fleet = Fleet(cache, clock)
    await cache.start()
    objects = Objects(store, cache)
    registry = NodeRegistry(fleet, objects, clock, lease_duration=15, heartbeat_interval=3)
    node = await registry.register("n1", _inventory())
    job = {"metadata": {"name": "j", "namespace": "default", "uid": "u1"}, "spec": {"command": ["true"]}}
    attempt = new_attempt(job, 0, 1, clock.now())
    key = attempt_key("default", attempt["metadata"]["name"])
    await objects.create(key, attempt)
    await objects.mutate(key, bind(Placement("n1"), clock.now()))
    leases = LeaseController(registry, objects)
    clock.advance(14.9)
    assert await leases.check() == [] and registry.ready("n1")
    await registry.renew("n1", node["sessionId"], node["epoch"])  # a heartbeat moves the expiry
    clock.advance(14.9)
    assert await leases.check() == []
    clock.advance(0.2)
    assert await leases.check() == ["n1"] and not registry.ready("n1")
    lost = cache.get(key)
    assert lost is not None and phase_of(lost).value == "Lost" and lost["status"]["reason"] == "NodeLost"
    assert await leases.check() == [], "level-triggered: nothing more to do"
    await registry.renew("n1", node["sessionId"], node["epoch"])
    assert registry.ready("n1"), "a heartbeat brings the node back"
    # A restarted coordinator gives leases it did not see expire one lease duration of grace.
    lease = registry.lease("n1")
    clock.advance(100)
    restarted = Leases(clock, 15)
    assert restarted.ready(lease) and not registry.leases.ready(lease)
    assert not restarted.fresh(lease), "but the grace places nothing new on the node"
    clock.advance(15)
    assert not restarted.ready(lease)
    await cache.stop()
    await store.close()


def test_leases_expire_on_the_injected_clock(tmp_path: Path) -> None:
    asyncio.run(_lease_scenario(tmp_path))


def test_lease_flags_are_checked(tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data")
    with pytest.raises(RuntimeError) as e:
        c.start(extra_args=("--lease-duration", "1s", "--heartbeat-interval", "2s"), timeout=20)
    assert "at most half of --lease-duration" in str(e.value)
