"""Node-scoped access (issue 15, item 3; docs/adr/0045) for Secret values and gang facts, with a real
coordinator and a real agent: an Attempt's Secret values reach the node it is placed on (node A, a real
agent, runs it with them) and no other: node B, enrolled and connected with a certificate of its own, is
told nothing of A's attempt and receives none of its Secret's bytes. Neither B's certificate nor the join
token reads any gang's facts through GangService: a member learns its gang's only from its own node's
stream."""
from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from agent_double import AgentProcess
from conftest import Coordinator, job
from e2e import agent_md, attempts_of, ended, start_agent, wait_status

from nodus.agent.x509 import new_key
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2, gang_pb2, gang_pb2_grpc

VALUE = "NODUS-TEST-SECRET-node-scope-41d2"
"""The suite's marker (tests/secret_scan.py): it must show up in no log or status."""
SECRETS = "/apis/nodus.dev/v1/namespaces/default/secrets"
JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"

# Checks it was given the Secret (as a file and in its environment) by its digest, the value itself
# being nothing a Job's spec may hold, then waits for the go file.
PROGRAM = r"""
import hashlib, os, sys, time
from pathlib import Path
given = Path(os.environ["NODUS_SECRETS_DIR"], "scope-db", "password").read_text()
assert given == os.environ["DB_PASSWORD"], "the same value as a file and in the environment"
assert hashlib.sha256(given.encode()).hexdigest() == sys.argv[2], "the Secret reached the attempt"
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("scope-secrets") / "data").start() as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def a(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(c, tmp_path_factory.mktemp("node-a") / "work", "secrets-a") as agent:
        yield agent


def full_state_of(c: Coordinator, node: str) -> agent_pb2.FullState:
    """What the coordinator tells a freshly enrolled node that registers and opens its stream."""
    with c.node_channel(node, new_key()) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        inventory = common_pb2.NodeInventory(hostname=node, runtimes=[common_pb2.RUNTIME_PROCESS],
                                             host=common_pb2.HostInventory(cpus=2, memory_bytes=1 << 30))
        registered = stub.Register(agent_pb2.RegisterRequest(node_name=node, inventory=inventory), timeout=10)
        done = threading.Event()

        def messages() -> Iterator[agent_pb2.AgentMessage]:
            yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id=registered.node_id,
                                                               session_id=registered.session_id,
                                                               epoch=registered.epoch))
            done.wait(30)

        stream = stub.Connect(messages(), timeout=30)
        try:
            first = next(stream)
        finally:
            done.set()
            stream.cancel()
        assert first.WhichOneof("message") == "full_state", first
        return first.full_state


def test_secret_values_reach_only_the_node_the_attempt_is_placed_on(c: Coordinator, a: AgentProcess,
                                                                     tmp_path: Path) -> None:
    s = c.session()
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "scope-db"},
              "stringData": {"password": VALUE}}
    assert s.post(c.url(SECRETS), json=secret).status_code == 201
    go = tmp_path / "go"
    body = job("holder", command=[sys.executable, "-c", PROGRAM, str(go), hashlib.sha256(VALUE.encode()).hexdigest()], secrets=[{"name": "scope-db"}],
               env=[{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "scope-db", "key": "password"}}}])
    assert s.post(c.url(JOBS), json=body).status_code == 201, body
    wait_status(c, "holder", lambda st: st.get("phase") == "Running", what="the holder to run on node A")
    [attempt] = attempts_of(c, "holder")
    assert attempt["spec"]["node"] == "secrets-a"

    told = full_state_of(c, "secrets-b")
    assert attempt["spec"]["id"] not in {x.attempt_id for x in told.assignments}
    assert VALUE.encode() not in told.SerializeToString(), "node B received A's attempt's Secret value"

    go.touch()
    assert ended(c, "holder")["status"]["phase"] == "Succeeded", "node A ran it with the Secret"


def test_no_node_reads_a_gangs_facts(c: Coordinator) -> None:
    request = gang_pb2.ListGangsRequest()
    with c.node_channel("secrets-c", new_key()) as channel:
        with pytest.raises(grpc.RpcError) as certified:
            gang_pb2_grpc.GangServiceStub(channel).ListGangs(request, timeout=10)
    assert certified.value.code() == grpc.StatusCode.UNAUTHENTICATED, certified.value
    with c.channel() as channel:
        with pytest.raises(grpc.RpcError) as joined:
            gang_pb2_grpc.GangServiceStub(channel).GetGang(gang_pb2.GetGangRequest(project="default", job="holder"),
                                                           metadata=agent_md(c), timeout=10)
    assert joined.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), joined.value
