"""Inputs this release cannot provide are refused at admission, naming the field (docs/adr/0037).

What must hold: a Job (or a Sweep's template) with a `fromWorkspace` or `fromStage` input is never
stored, since no Workspace or Pipeline kind exists to provide it and its program would start without
its data; REST answers 422 Invalid with the cause at spec.inputs[i].<kind>, gRPC INVALID_ARGUMENT
with the same reason and field."""
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

WORKSPACE = {"name": "home", "fromWorkspace": {"name": "alice", "path": "data"}}
STAGE = {"name": "feats", "fromStage": {"stage": "prep", "output": "features"}}
URL = {"name": "data", "url": {"url": "https://example.com/data.csv"}}


def causes(r: Any) -> dict[str, dict[str, str]]:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["reason"] == "Invalid", body
    return {c["field"]: c for c in body["details"]["causes"]}


@pytest.mark.parametrize("item, kind, missing", [(WORKSPACE, "fromWorkspace", "Workspace"),
                                                 (STAGE, "fromStage", "Pipeline")])
def test_rest_refuses_an_input_no_kind_can_provide(shared_coordinator: Coordinator, item: dict[str, Any],
                                                   kind: str, missing: str) -> None:
    c = shared_coordinator
    name = f"refused-{kind.lower()}"
    found = causes(c.session().post(c.url(JOBS), json=job(name, inputs=[URL, item])))
    cause = found[f"spec.inputs[1].{kind}"]
    assert cause["reason"] == "FieldValueForbidden"
    assert f"no {missing} kind exists in this release" in cause["message"]
    assert "url, bucket, output or volume" in cause["message"]
    assert "spec.inputs[0].url" not in " ".join(found), "the url input beside it is fine"
    assert c.session().get(c.url(f"{JOBS}/{name}")).status_code == 404, "nothing was stored"


def test_dry_run_and_a_sweep_template_are_refused_the_same_way(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    dry = c.session().post(c.url(JOBS), params={"dryRun": "All"}, json=job("dry-stage", inputs=[STAGE]))
    assert "spec.inputs[0].fromStage" in causes(dry)
    sweep = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "ws-sweep"},
             "spec": {"matrix": {"params": {"lr": ["0.1", "0.2"]}},
                      "template": {"spec": job("x", inputs=[WORKSPACE])["spec"]}}}
    found = causes(c.session().post(c.url(f"{NS}/sweeps"), json=sweep))
    assert "no Workspace kind exists" in found["spec.template.spec.inputs[0].fromWorkspace"]["message"]


def test_grpc_refuses_with_the_same_reason_and_field(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    body = struct_pb2.Struct()
    body.update(job("grpc-workspace", inputs=[WORKSPACE]))
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
    assert [v.field for v in bad.field_violations] == ["spec.inputs[0].fromWorkspace"]
    assert "no Workspace kind exists in this release" in bad.field_violations[0].description


def test_a_bucket_input_must_name_its_connection(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    bare = {"name": "data", "bucket": {"uri": "s3://datasets/train.csv"}}
    found = causes(c.session().post(c.url(JOBS), json=job("bucket-bare", inputs=[bare])))
    cause = found["spec.inputs[0].bucket.connection"]
    assert cause["reason"] == "FieldValueRequired" and "S3 Connection" in cause["message"]
    named = {"name": "data", "bucket": {"uri": "s3://datasets/train.csv", "connection": "datasets"}}
    assert c.session().post(c.url(JOBS), json=job("bucket-named", inputs=[named])).status_code == 201
