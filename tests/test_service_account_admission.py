"""`spec.serviceAccountName` is refused at admission while no ServiceAccount kind exists (docs/adr/0050).

What must hold: a Job (or a Sweep's template) naming a ServiceAccount is never stored, since nothing can
give its program that account's token and it would run without the identity it asked for (the field
used to be stored and ignored); REST answers 422 Invalid with a FieldValueNotFound cause at
spec.serviceAccountName naming the account and the fix, gRPC INVALID_ARGUMENT with the same field. A
Job without the field is admitted as before."""
from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import Coordinator, job
from e2e import JOBS, NS
from nodus.v1 import resource_pb2, resource_pb2_grpc


def causes(r: Any) -> dict[str, dict[str, str]]:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["reason"] == "Invalid", body
    return {c["field"]: c for c in body["details"]["causes"]}


def test_rest_refuses_a_service_account_and_stores_nothing(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    found = causes(c.session().post(c.url(JOBS), json=job("sa-refused", serviceAccountName="ci-bot")))
    cause = found["spec.serviceAccountName"]
    assert cause["reason"] == "FieldValueNotFound", cause
    assert cause["message"].startswith('Not found: "ci-bot": no ServiceAccount kind exists'), cause
    assert "remove spec.serviceAccountName" in cause["message"], "the fix is named"
    assert c.session().get(c.url(f"{JOBS}/sa-refused")).status_code == 404, "nothing was stored"
    assert c.session().post(c.url(JOBS), json=job("sa-none")).status_code == 201, "without it a Job is admitted"


def test_a_sweep_template_is_refused_the_same_way(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    sweep = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "sa-sweep"},
             "spec": {"matrix": {"params": {"lr": ["0.1", "0.2"]}},
                      "template": {"spec": job("x", serviceAccountName="ci-bot")["spec"]}}}
    found = causes(c.session().post(c.url(f"{NS}/sweeps"), json=sweep))
    assert "no ServiceAccount kind exists" in found["spec.template.spec.serviceAccountName"]["message"]


def test_grpc_refuses_with_the_same_reason_and_field(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    body = struct_pb2.Struct()
    body.update(job("grpc-sa", serviceAccountName="ci-bot"))
    with c.channel() as channel:
        stub = resource_pb2_grpc.ResourceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=body),
                        metadata=(("authorization", f"Bearer {c.token}"),), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(e.value)  # type: ignore[arg-type]
    assert status is not None
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR))
    assert any(d.Unpack(bad) for d in status.details if d.Is(bad.DESCRIPTOR))
    assert info.reason == "Invalid"
    assert [v.field for v in bad.field_violations] == ["spec.serviceAccountName"]
