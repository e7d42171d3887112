"""Prepaid credits through the real coordinator: an operator grants with `nodus credits grant` and
grpcurl, a customer reads them with `nodus credits` and grpcurl, only operators grant, a bad amount
names the field, and a grant retried after a kill -9 of the coordinator with the same request id is
booked once, also when the kill lands in the middle of a burst of grants."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
from pathlib import Path
from typing import Any

import grpc

from agent_double import wait_for
from conftest import Coordinator
from nodus.coordinator.money.ledger import fold
from nodus.coordinator.money.ledger_store import Ledger
from nodus.coordinator.store import SqliteStore
from nodus.v1 import project_pb2, project_pb2_grpc
from test_grpcurl import grpcurl

PS = "nodus.v1.ProjectService"
INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED = 3, 5, 6, 7


def ok(c: Coordinator, method: str, body: dict[str, Any], token: str | None = None) -> Any:
    return json.loads(grpcurl(c, f"{PS}/{method}", body, token=c.token if token is None else token).stdout)


def refused(c: Coordinator, method: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    result = grpcurl(c, f"{PS}/{method}", body, token=c.token if token is None else token, check=False)
    assert result.returncode != 0, result.stdout
    error: dict[str, Any] = json.loads(result.stderr)
    return error


def test_an_operator_grants_and_the_customer_reads_them(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start() as c:
        out = c.run("nodus", "credits", "grant", "--project", "default", "100.00", "--note", "PO-1").stdout
        assert out.startswith("granted 100.00 USD to project default (request cli-")
        granted = ok(c, "GrantCredits", {"project": "default", "amount_usd": "25.50", "request_id": "inv-7"})
        assert granted["granted"] is True and granted["seq"] == "2"
        assert granted["credits"]["available_usd"] == "125.50"

        viewer = c.grpc_token("default", "viewer")
        credits = ok(c, "GetCredits", {"project": "default"}, token=viewer)
        assert (credits["available_usd"], credits["held_usd"], credits["granted_usd"]) == ("125.50", "0.00", "125.50")
        assert ok(c, "GetCredits", {}, token=viewer)["project"] == "default"  # the token's own project
        shown = c.run("nodus", "credits").stdout.splitlines()
        assert shown[0].split()[:4] == ["PROJECT", "AVAILABLE", "HELD", "SPENT"]
        assert shown[1].split() == ["default", "125.50", "USD", "0.00", "USD", "0.00", "USD", "125.50", "USD"]

        # credits are money: a customer's token reads them and cannot grant them, not even a project admin's
        admin = c.grpc_token("default", "admin")
        error = refused(c, "GrantCredits", {"project": "default", "amount_usd": "1.00", "request_id": "x"}, admin)
        assert error["code"] == PERMISSION_DENIED and "not a cluster operator" in error["message"]
        c.run("nodus", "project", "create", "other")
        other = c.grpc_token("other", "viewer")
        assert refused(c, "GetCredits", {"project": "default"}, other)["code"] == PERMISSION_DENIED

        error = refused(c, "GrantCredits", {"project": "default", "amount_usd": "2.505", "request_id": "y"})
        assert error["code"] == INVALID_ARGUMENT
        violations = [v for d in error["details"] for v in d.get("field_violations", [])]
        assert violations[0]["field"] == "amountUSD" and "whole cents" in violations[0]["description"]
        assert refused(c, "GrantCredits", {"project": "nope", "amount_usd": "1.00", "request_id": "z"})["code"] == \
            NOT_FOUND
        failed = c.run("nodus", "credits", "grant", "--project", "default", "-3", check=False)
        assert failed.returncode == 1 and "amountUSD" in failed.stderr and "must be more than 0" in failed.stderr
        assert ok(c, "GetCredits", {"project": "default"})["available_usd"] == "125.50"  # refusals booked nothing


def test_a_grant_retried_after_a_kill_9_is_booked_once(tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data").start()
    try:
        first = c.run("nodus", "credits", "grant", "--project", "default", "40.00", "--request-id", "wire-9").stdout
        assert first.startswith("granted 40.00 USD")
        c.kill()  # as if the answer was lost: the operator cannot tell whether the grant happened
        c.start()
        again = c.run("nodus", "credits", "grant", "--project", "default", "40.00", "--request-id", "wire-9").stdout
        assert again.strip() == "request wire-9 was granted before; nothing added now"
        error = refused(c, "GrantCredits", {"project": "default", "amount_usd": "41.00", "request_id": "wire-9"})
        assert error["code"] == ALREADY_EXISTS and "new request id" in error["message"] + json.dumps(error)
        credits = ok(c, "GetCredits", {"project": "default"})
        assert (credits["available_usd"], credits["granted_usd"]) == ("40.00", "40.00")
        assert json.loads(c.run("nodus", "credits", "-o", "json").stdout)["available_usd"] == "40.00"
    finally:
        c.stop()


def test_a_kill_9_in_the_middle_of_granting_books_each_request_once(tmp_path: Path) -> None:
    """Grants stream in from several clients while the coordinator is killed; every request is sent
    again to the restarted one. The store then holds each request once, and the balance is their sum."""
    c = Coordinator(tmp_path / "data").start()
    ids = [f"burst-{n}" for n in range(200)]
    acknowledged: set[str] = set()

    def grant(request_id: str) -> None:
        with c.channel() as channel:
            try:
                project_pb2_grpc.ProjectServiceStub(channel).GrantCredits(
                    project_pb2.GrantCreditsRequest(project="default", amount_usd="0.10", request_id=request_id),
                    metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)
                acknowledged.add(request_id)
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                    grpc.StatusCode.DEADLINE_EXCEEDED), e

    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(grant, i) for i in ids]
            wait_for(lambda: len(acknowledged) >= 10, timeout=30)
            c.kill()  # mid-burst: some grants are booked, some half-appended, some never arrived
            for f in futures:
                f.result()
        assert 10 <= len(acknowledged) < len(ids)
        c.start()
        for request_id in ids:
            grant(request_id)
        assert acknowledged == set(ids)
        credits = ok(c, "GetCredits", {"project": "default"})
        assert (credits["available_usd"], credits["granted_usd"]) == ("20.00", "20.00")
    finally:
        c.stop()

    async def stored() -> None:
        store = await SqliteStore.open(tmp_path / "data" / "store.db")
        try:
            ledger = Ledger(store)
            postings = await ledger.postings("default")
            assert sorted(p.key for p in postings) == sorted(f"grant/{i}" for i in ids)  # each once
            assert fold("default", postings) == await ledger.accounts("default")
        finally:
            await store.close()

    asyncio.run(stored())
