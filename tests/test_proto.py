"""The gRPC contract: committed code matches the .proto files, and every service is where callers expect."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format, struct_pb2

from nodus.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    common_pb2,
    gang_pb2,
    gang_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    project_pb2,
    project_pb2_grpc,
    resource_pb2,
    resource_pb2_grpc,
)

ROOT = Path(__file__).resolve().parent.parent

SERVICES = {
    (resource_pb2, resource_pb2_grpc, "ResourceService"): {
        "Get": (False, False),
        "List": (False, False),
        "Watch": (False, True),
        "Create": (False, False),
        "Update": (False, False),
        "Patch": (False, False),
        "Delete": (False, False),
    },
    (project_pb2, project_pb2_grpc, "ProjectService"): {
        "CreateProject": (False, False),
        "ListProjects": (False, False),
        "CreateToken": (False, False),
        "ListTokens": (False, False),
        "RevokeToken": (False, False),
        "GrantCredits": (False, False),
        "GetCredits": (False, False),
        "SetBudget": (False, False),
        "DeleteBudget": (False, False),
        "ListBudgets": (False, False),
    },
    (agent_pb2, agent_pb2_grpc, "AgentService"): {
        "Enrol": (False, False),
        "Renew": (False, False),
        "Register": (False, False),
        "Connect": (True, True),
    },
    (node_pb2, node_pb2_grpc, "NodeService"): {
        "ListNodes": (False, False),
        "GetNode": (False, False),
        "Cordon": (False, False),
        "Uncordon": (False, False),
        "Drain": (False, False),
        "Reclaim": (False, False),
        "ListAttempts": (False, False),
        "RevokeNode": (False, False),
        "ReadmitNode": (False, False),
        "RotateJoinToken": (False, False),
    },
    (gang_pb2, gang_pb2_grpc, "GangService"): {
        "GetGang": (False, False),
        "ListGangs": (False, False),
    },
}


def test_regeneration_reproduces_committed_code() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-proto"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("modules", "methods"), SERVICES.items(), ids=[k[2] for k in SERVICES])
def test_service_has_every_rpc(modules: tuple, methods: dict[str, tuple[bool, bool]]) -> None:
    pb2, pb2_grpc, name = modules
    service = pb2.DESCRIPTOR.services_by_name[name]
    assert service.full_name == f"nodus.v1.{name}"
    streaming = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert streaming == methods
    # The generated stub and servicer exist under the names the servers will register.
    assert hasattr(pb2_grpc, f"{name}Stub")
    assert hasattr(pb2_grpc, f"add_{name}Servicer_to_server")


def test_resource_service_returns_objects_as_struct() -> None:
    service = resource_pb2.DESCRIPTOR.services_by_name["ResourceService"]
    for verb in ("Get", "Create", "Update", "Patch", "Delete"):
        assert service.methods_by_name[verb].output_type.full_name == "google.protobuf.Struct"


def test_create_request_round_trips_a_json_object() -> None:
    job = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "demo", "labels": {"team": "ml"}},
        "spec": {"command": ["python", "train.py"], "completions": 4, "maxCostUSD": "12.50"},
    }
    obj = struct_pb2.Struct()
    obj.update(job)
    request = resource_pb2.CreateRequest(kind="jobs", project="demo", object=obj, dry_run=True)

    wire = resource_pb2.CreateRequest.FromString(request.SerializeToString())
    assert json_format.MessageToDict(wire.object) == job
    assert json_format.MessageToDict(wire)["dryRun"] is True

    parsed = json_format.ParseDict({"kind": "Job", "project": "demo", "object": job}, resource_pb2.CreateRequest())
    assert json_format.MessageToDict(parsed.object) == job


def test_continue_token_is_continue_in_json() -> None:
    request = json_format.ParseDict({"kind": "jobs", "limit": 10, "continue": "abc"}, resource_pb2.ListRequest())
    assert request.continue_token == "abc"
    response = resource_pb2.ListResponse(continue_token="next")
    assert json_format.MessageToDict(response) == {"continue": "next"}


def test_messages_name_their_real_module() -> None:
    # protoc names the modules nodus.v1.*, the package proto/ holds, so messages pickle (multiprocessing, caches).
    assignment = agent_pb2.Assignment(attempt_id="a1", job=common_pb2.JobRef(project="p", name="j"))
    assert type(assignment).__module__ == "nodus.v1.agent_pb2"
    assert pickle.loads(pickle.dumps(assignment)) == assignment


def test_every_enum_starts_unspecified() -> None:
    for pb2 in (common_pb2, agent_pb2, node_pb2, gang_pb2):
        for enum in pb2.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values[0].number == 0
            assert enum.values[0].name.endswith("_UNSPECIFIED"), enum.full_name
