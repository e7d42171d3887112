"""Tokens through the real daemons: `nodus token create --ttl`, `ls` (never the secret, with last use),
`revoke`; an expired or revoked token refused at once on REST (401 naming the token and the fix) and
on gRPC (UNAUTHENTICATED, the same words), across a restart; /metrics for a metrics or an operator
token only (docs/adr/0046-tokens-rate-limits-audit.md)."""
from __future__ import annotations

import json
import time
from typing import Any

import grpc
import pytest
import requests

from conftest import Coordinator
from nodus.v1 import resource_pb2, resource_pb2_grpc

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"


def create(c: Coordinator, *args: str) -> tuple[str, str]:
    """`nodus token create ARGS`: the secret (stdout) and the id (stderr's line)."""
    out = c.run("nodus", "token", "create", *args)
    secret = out.stdout.strip()
    assert secret.startswith("nodus_"), out.stdout
    token_id = secret.split("_")[1]
    assert f"token {token_id} " in out.stderr
    return secret, token_id


def listed(c: Coordinator, *args: str) -> list[dict[str, Any]]:
    out = c.run("nodus", "token", "ls", "-o", "json", *args)
    tokens: list[dict[str, Any]] = json.loads(out.stdout)
    return tokens


def grpc_list(c: Coordinator, token: str) -> grpc.RpcError | None:
    with c.channel() as channel:
        try:
            resource_pb2_grpc.ResourceServiceStub(channel).List(
                resource_pb2.ListRequest(kind="Job", project="default"),
                metadata=(("authorization", f"Bearer {token}"),), timeout=10)
        except grpc.RpcError as e:
            return e
    return None


def assert_refused(c: Coordinator, secret: str, token_id: str, why: str) -> None:
    r = c.session(secret).get(c.url(JOBS))
    assert r.status_code == 401, r.text
    status = r.json()
    assert status["kind"] == "Status" and status["reason"] == "Unauthorized"
    assert status["message"].startswith(f'token "{token_id}" {why} at '), status
    assert status["details"] == {"name": token_id, "kind": "tokens"}
    assert "nodus token create --project default --role viewer" in status["fix"]
    e = grpc_list(c, secret)
    assert e is not None and e.code() == grpc.StatusCode.UNAUTHENTICATED
    assert f'token "{token_id}" {why} at ' in (e.details() or "")
    assert "nodus token create" in (e.details() or "")


@pytest.fixture
def c(coordinator: Coordinator) -> Coordinator:
    return coordinator


def test_create_ls_revoke_through_the_cli_and_after_a_restart(c: Coordinator) -> None:
    secret, token_id = create(c, "--project", "default", "--role", "viewer", "--ttl", "24h", "--subject", "ci")
    [row] = [t for t in listed(c) if t["id"] == token_id]
    assert row["project"] == "default" and row["role"] == "viewer" and row["subject"] == "ci"
    assert "last_use_time" not in row and "secret" not in row
    created = time.strptime(row["create_time"], "%Y-%m-%dT%H:%M:%SZ")
    expires = time.strptime(row["expire_time"], "%Y-%m-%dT%H:%M:%SZ")
    assert time.mktime(expires) - time.mktime(created) == pytest.approx(24 * 3600, abs=2)

    assert c.session(secret).get(c.url(JOBS)).status_code == 200
    assert grpc_list(c, secret) is None
    [row] = [t for t in listed(c) if t["id"] == token_id]
    assert row["last_use_time"] >= row["create_time"]
    table = c.run("nodus", "token", "ls").stdout
    header = table.splitlines()[0].split()
    assert header[:6] == ["ID", "PROJECT", "ROLE", "SUBJECT", "CREATED", "EXPIRES"] and "USED" in header
    assert token_id in table and secret.split("_", 2)[2] not in table  # the secret is never listed

    # grpcurl reaches the same service (ProjectService.ListTokens); it prints the proto field names.
    answer = json.loads(c.run("grpcurl", *c.grpcurl_tls(), "-H", f"authorization: Bearer {c.token}", "-d",
                              '{"project": "default"}', c.grpc, "nodus.v1.ProjectService/ListTokens").stdout)
    [entry] = [t for t in answer["tokens"] if t["id"] == token_id]
    assert entry["last_use_time"] and entry["expire_time"] and "secret" not in entry

    out = c.run("nodus", "token", "revoke", token_id)
    assert f"token {token_id} (ci, viewer in project default) revoked" in out.stdout
    assert_refused(c, secret, token_id, "was revoked")
    assert token_id not in [t["id"] for t in listed(c)]
    [row] = [t for t in listed(c, "--all") if t["id"] == token_id]
    assert row["revoke_time"] >= row["create_time"]
    again = c.run("nodus", "token", "revoke", secret, check=False)
    assert again.returncode == 1 and "pass the ID column" in again.stderr

    # Tokens made before the restart (the admin's in the kubeconfig included) keep working; the
    # revoked one stays refused.
    other, _ = create(c, "--project", "default", "--role", "editor")
    c.stop()
    c.start()
    assert c.session().get(c.url(JOBS)).status_code == 200
    assert c.session(other).get(c.url(JOBS)).status_code == 200
    assert_refused(c, secret, token_id, "was revoked")


def test_an_expired_token_is_refused_naming_it(c: Coordinator) -> None:
    secret, token_id = create(c, "--project", "default", "--role", "viewer", "--ttl", "1s")
    deadline = time.monotonic() + 30
    while c.session(secret).get(c.url(JOBS)).status_code == 200:  # until its second is up
        assert time.monotonic() < deadline, "the 1s token still works after 30s"
        time.sleep(0.2)
    assert_refused(c, secret, token_id, "expired")
    bad = c.run("nodus", "token", "create", "--project", "default", "--role", "viewer", "--ttl", "soon", check=False)
    assert bad.returncode == 2 and "is not a duration" in bad.stderr


def test_metrics_need_a_metrics_or_an_operator_token(c: Coordinator) -> None:
    url = c.url("/metrics")
    anonymous = requests.get(url, verify=str(c.ca), timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["reason"] == "Unauthorized"
    viewer, _ = create(c, "--project", "default", "--role", "viewer")
    refused = c.session(viewer).get(url)
    assert refused.status_code == 403 and "--role metrics" in refused.json()["fix"]
    scraper, _ = create(c, "--project", "*", "--role", "metrics")
    ok = c.session(scraper).get(url)
    assert ok.status_code == 200 and "nodus_api_requests_total" in ok.text
    assert c.session().get(url).status_code == 200  # the operator's
    # A metrics token reads nothing else.
    assert c.session(scraper).get(c.url(JOBS)).status_code == 403
    wrong = c.run("nodus", "token", "create", "--project", "default", "--role", "metrics", check=False)
    assert wrong.returncode == 1 and "--project '*' --role metrics" in wrong.stderr
