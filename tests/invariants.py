"""What a test against real daemons must leave behind it, checked at teardown as dask's `gen_cluster`
checks its cluster: no attempt of an ended (or deleted) Job still active, no capacity held by a node
with nothing active on it, the coordinator's count of a node's active attempts equal to the Attempts
placed there, and no process of an ended attempt left working on an agent.

A test may end with work still running on purpose (reap() kills it); that is not a leftover. Only
nodes whose agent is still alive and Ready are held to the capacity rules: a test that killed an agent
or cut a link has left the lease controller a node it has not finished with.
"""
from __future__ import annotations

import time
from typing import Any, Sequence


from agent_double import AgentProcess
from conftest import Coordinator
from nodus.v1 import node_pb2, node_pb2_grpc

ATTEMPT_ENDED = {"Succeeded", "Failed", "Lost", "Cancelled"}
JOB_ENDED = {"Succeeded", "Failed", "Cancelled"}


def _items(c: Coordinator, plural: str) -> list[dict[str, Any]]:
    r = c.session().get(c.url(f"/apis/nodus.dev/v1/{plural}"), timeout=10)
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def _nodes(c: Coordinator) -> list[node_pb2.Node]:
    with c.channel() as channel:
        return list(node_pb2_grpc.NodeServiceStub(channel).ListNodes(
            node_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10).nodes)


def _alive(a: AgentProcess) -> bool:
    """The agent process still runs (a test may have stopped or killed it: proc is None or exited)."""
    return a.proc is not None and a.proc.poll() is None


def problems(c: Coordinator, agents: Sequence[AgentProcess]) -> list[str]:
    """Each way the fleet breaks the invariants now; [] when it keeps them all."""
    jobs = {(j["metadata"]["namespace"], j["metadata"]["name"]): (j.get("status") or {}).get("phase")
            for j in _items(c, "jobs")}
    active_on: dict[str, int] = {}
    found: list[str] = []
    for a in _items(c, "attempts"):
        phase = (a.get("status") or {}).get("phase") or "Pending"
        if phase in ATTEMPT_ENDED:
            continue
        spec, meta = a.get("spec") or {}, a["metadata"]
        node = spec.get("node") or ""
        if node:
            active_on[node] = active_on.get(node, 0) + 1
        job = jobs.get((meta["namespace"], spec.get("job", "")), "deleted")
        if job in JOB_ENDED or job == "deleted":
            found.append(f"Attempt {meta['namespace']}/{meta['name']} is {phase} on {node or 'no node'} "
                         f"but its Job {spec.get('job')} is {job}")
    live = {a.node for a in agents if _alive(a)}
    for n in _nodes(c):
        if n.name not in live or n.phase != node_pb2.NODE_PHASE_READY:
            continue
        placed = active_on.get(n.name, 0)
        if n.active_attempts != placed:
            found.append(f"node {n.name} counts {n.active_attempts} active attempts, {placed} are placed there")
        if placed == 0 and n.free != n.capacity:
            found.append(f"node {n.name} holds capacity with nothing active: free {n.free} of {n.capacity}")
    for a in agents:
        if _alive(a):
            found += [f"{a.node}: {p}" for p in a.leftovers()]
    return found


def check_fleet(c: Coordinator, agents: Sequence[AgentProcess], timeout: float = 30) -> None:
    """Fails the test with every broken invariant unless the fleet keeps them all within `timeout`
    (stops and the agents' reports of them take a moment). Nothing to ask once the test has stopped
    the coordinator itself."""
    if c.proc is None or c.proc.poll() is not None:
        return
    deadline = time.monotonic() + timeout
    while True:
        found = problems(c, agents)
        if not found:
            return
        if time.monotonic() > deadline:
            raise AssertionError("the test left the fleet inconsistent:\n  " + "\n  ".join(found))
        time.sleep(0.2)
