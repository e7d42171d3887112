"""ServiceAccounts in the resource API, and `spec.serviceAccountName` at admission (docs/adr/0055).

What must hold: a ServiceAccount is a namespaced nodus.dev/v1 kind that kubectl and gRPC create, get,
list and delete like the others, with its role in the table kubectl prints; a role other than viewer
or editor is refused naming spec.role and the fix. A Job (or a Sweep's template) naming an account
that does not exist in its project is never stored: REST answers 422 Invalid with a FieldValueNotFound
cause at spec.serviceAccountName naming the account and the fix, gRPC INVALID_ARGUMENT with the same
field; once the account exists the same Job is admitted, and a Job without the field as before."""
from __future__ import annotations

from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import Coordinator, job
from e2e import JOBS, NS
from nodus.v1 import resource_pb2, resource_pb2_grpc

ACCOUNTS = f"{NS}/serviceaccounts"


def account(name: str, role: str | None = "editor") -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "ServiceAccount", "metadata": {"name": name},
            "spec": {} if role is None else {"role": role}}


def causes(r: Any) -> dict[str, dict[str, str]]:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["reason"] == "Invalid", body
    return {c["field"]: c for c in body["details"]["causes"]}


def test_a_missing_account_is_refused_and_an_existing_one_admitted(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    found = causes(c.session().post(c.url(JOBS), json=job("sa-refused", serviceAccountName="ci-bot")))
    cause = found["spec.serviceAccountName"]
    assert cause["reason"] == "FieldValueNotFound", cause
    assert cause["message"].startswith('Not found: "ci-bot": no ServiceAccount "ci-bot" in project "default"'), cause
    assert "create it first" in cause["message"] and "remove spec.serviceAccountName" in cause["message"], cause
    assert c.session().get(c.url(f"{JOBS}/sa-refused")).status_code == 404, "nothing was stored"
    assert c.session().post(c.url(ACCOUNTS), json=account("ci-bot")).status_code == 201
    admitted = c.session().post(c.url(JOBS), json=job("sa-refused", serviceAccountName="ci-bot"))
    assert admitted.status_code == 201, admitted.text
    assert admitted.json()["spec"]["serviceAccountName"] == "ci-bot"
    assert c.session().post(c.url(JOBS), json=job("sa-none")).status_code == 201, "without it a Job is admitted"


def test_an_account_in_another_project_does_not_count(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    c.session().post(c.url("/apis/nodus.dev/v1/namespaces/other/serviceaccounts"), json=account("elsewhere"))
    found = causes(c.session().post(c.url(JOBS), json=job("sa-other", serviceAccountName="elsewhere")))
    assert 'in project "default"' in found["spec.serviceAccountName"]["message"]


def test_a_sweep_template_is_checked_the_same_way(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    sweep = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "sa-sweep"},
             "spec": {"matrix": {"params": {"lr": ["0.1", "0.2"]}},
                      "template": {"spec": job("x", serviceAccountName="sweep-bot")["spec"]}}}
    found = causes(c.session().post(c.url(f"{NS}/sweeps"), json=sweep))
    assert 'no ServiceAccount "sweep-bot"' in found["spec.template.spec.serviceAccountName"]["message"]


def test_grpc_refuses_with_the_same_reason_and_field(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    body = struct_pb2.Struct()
    body.update(job("grpc-sa", serviceAccountName="grpc-bot"))
    metadata = (("authorization", f"Bearer {c.token}"),)
    with c.channel() as channel:
        stub = resource_pb2_grpc.ResourceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=body),
                        metadata=metadata, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(e.value)  # type: ignore[arg-type]
        assert status is not None
        info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
        assert any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR))
        assert any(d.Unpack(bad) for d in status.details if d.Is(bad.DESCRIPTOR))
        assert info.reason == "Invalid"
        assert [v.field for v in bad.field_violations] == ["spec.serviceAccountName"]
        # the kind itself over gRPC: created, read back with its defaulted role, then the Job is admitted
        sa = struct_pb2.Struct()
        sa.update(account("grpc-bot", role=None))
        stub.Create(resource_pb2.CreateRequest(kind="serviceaccounts", project="default", object=sa),
                    metadata=metadata, timeout=30)
        got = stub.Get(resource_pb2.GetRequest(kind="sa", project="default", name="grpc-bot"),
                       metadata=metadata, timeout=30)
        assert got["spec"]["role"] == "viewer", "the default role is the least one"
        stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=body), metadata=metadata,
                    timeout=30)


@pytest.mark.parametrize(("role", "words"), [
    ("admin", 'spec.role: Forbidden: a ServiceAccount may not hold the admin role'),
    ("metrics", 'spec.role: Forbidden: a ServiceAccount may not hold the metrics role'),
    ("Editor", 'spec.role: Invalid value: "Editor": role names are lowercase: use "editor"'),
    ("owner", 'spec.role: Unsupported value: "owner": supported values: "viewer", "editor"'),
])
def test_a_bad_role_is_refused_naming_the_field_and_the_fix(shared_coordinator: Coordinator, role: str,
                                                             words: str) -> None:
    c = shared_coordinator
    r = c.session().post(c.url(ACCOUNTS), json=account(f"bad-{role.lower()}", role))
    assert r.status_code == 422, r.text
    assert words in r.json()["message"], r.json()["message"]
    if role in ("admin", "metrics"):
        assert 'use "editor"' in r.json()["message"], "the fix is named"


def test_kubectl_and_nodus_create_list_and_delete_accounts(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    manifest = {**account("kc-bot"), "spec": {"role": "editor", "description": "creates evaluation Jobs"}}
    out = c.run("kubectl", "create", "-f", "-", input=yaml.safe_dump(manifest)).stdout
    assert "serviceaccount.nodus.dev/kc-bot created" in out, out
    header, *rows = c.run("kubectl", "get", "serviceaccounts.nodus.dev").stdout.splitlines()
    assert header.split() == ["NAME", "ROLE", "AGE"], header
    assert [r.split()[:2] for r in rows if r.startswith("kc-bot ")] == [["kc-bot", "editor"]]
    wide = c.run("kubectl", "get", "sa", "kc-bot", "-o", "wide").stdout
    assert "creates evaluation Jobs" in wide, wide
    assert "kc-bot" in c.run("kubectl", "get", "serviceaccounts", "-o", "name").stdout
    shown = c.run("nodus", "get", "serviceaccounts").stdout.splitlines()
    assert shown[0].split()[:3] == ["NAME", "ROLE", "AGE"] and any(r.split()[:2] == ["kc-bot", "editor"]
                                                                    for r in shown[1:]), shown
    assert "kc-bot" in c.run("nodus", "get", "sa", "kc-bot", "-o", "yaml").stdout
    assert "deleted" in c.run("kubectl", "delete", "sa", "kc-bot").stdout
    assert c.session().get(c.url(f"{ACCOUNTS}/kc-bot")).status_code == 404
