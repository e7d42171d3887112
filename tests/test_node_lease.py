"""A connected, heartbeating node keeps its lease however late the store's writes land (ADR 0049).

The coordinator runs on a real PostgreSQL with a 3 s node lease and 0.5 s heartbeats, and a real agent
runs a long attempt. The test then takes `LOCK TABLE kv IN SHARE MODE` on its own connection: reads go
on, but no write of the coordinator can land (heartbeat renewals and the lease controller's writes
alike) until it lets go. It holds the lock for two whole leases, then lets go: the attempt was
never Lost or replaced, it still runs, the stored lease is renewed and not expired, and while the lock
held NodeService.ListNodes already showed heartbeats newer than the stored lease. Before ADR 0049 every heartbeat waited for its own durable write, the
lease controller saw the stored lease run out, and the attempt was replaced while it ran.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from agent_double import wait_for
from conftest import Coordinator
from e2e import attempts_of, create, start_agent, status
from nodus.v1 import node_pb2, node_pb2_grpc
from postgres import postgres_cluster  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow

LEASE_SECONDS = 3.0
ARGS = ("--lease-duration", "3s", "--heartbeat-interval", "0.5s",
        "--leader-lease", "3s", "--leader-renew-interval", "1s")


def last_heartbeat(c: Coordinator, node: str) -> float:
    with c.channel() as channel:
        nodes = node_pb2_grpc.NodeServiceStub(channel).ListNodes(
            node_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10).nodes
    return next(n.last_heartbeat_time.ToNanoseconds() / 1e9 for n in nodes if n.name == node)


def stored_lease(url: str, node: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT value FROM kv WHERE key = %s", (f"_leases/{node}",)).fetchone()
    assert row is not None
    return dict(orjson.loads(row[0]))


def test_a_heartbeating_node_keeps_its_lease_while_the_stores_writes_are_blocked(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    monkeypatch.setenv("NODUS_STORE_URL", url)
    c = Coordinator(tmp_path / "c").start(extra_args=ARGS)
    try:
        with start_agent(c, tmp_path / "agent", "lease-a"):
            create(c, "steady", command=["python3", "-c", "import time; time.sleep(600)"])
            wait_for(lambda: status(c, "steady").get("phase") == "Running", 60, interval=0.2, what="steady running")
            [running] = attempts_of(c, "steady")

            with psycopg.connect(url, autocommit=False) as blocker:
                blocker.execute("LOCK TABLE kv IN SHARE MODE")  # held until the transaction ends
                locked = time.time()
                # Two whole leases with no write landing (a hold on the wall clock the coordinator runs
                # on, not an assertion): the lease controller ticks many times meanwhile.
                wait_for(lambda: time.time() >= locked + 2 * LEASE_SECONDS, 30, interval=0.1, what="two leases")
                heard = last_heartbeat(c, "lease-a")
                assert _seconds(stored_lease(url, "lease-a")["renewTime"]) < locked + LEASE_SECONDS  # none landed
                blocker.rollback()
            released = time.time()

            # The writes queued behind the lock land; the newest beat reaches the store.
            wait_for(lambda: _seconds(stored_lease(url, "lease-a")["renewTime"]) >= released, 30, interval=0.2,
                     what="the stored lease to be renewed once writes land again")
            attempts = attempts_of(c, "steady")
            assert [a["metadata"]["uid"] for a in attempts] == [running["metadata"]["uid"]], \
                [(a["metadata"]["name"], a.get("status")) for a in attempts]
            assert attempts[0]["status"]["phase"] == "Running", attempts[0]["status"]
            assert status(c, "steady").get("phase") == "Running"
            lease = stored_lease(url, "lease-a")
            assert lease["expired"] is False, lease
            # While no write could land, the coordinator still heard the node (NodeService reads it so).
            assert heard >= locked + LEASE_SECONDS, (heard, locked)
    finally:
        c.kill()


def _seconds(text: str) -> float:
    from nodus.coordinator.clock import parse
    value = parse(text)
    assert value is not None
    return value
