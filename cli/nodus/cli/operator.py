"""Operator verbs over gRPC (ProjectService), authenticated with the kubeconfig's token."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from nodus.v1 import project_pb2, project_pb2_grpc

from .client import CliError, default_kubeconfig


def _token(args: argparse.Namespace) -> str:
    import yaml
    path = Path(args.kubeconfig) if args.kubeconfig else default_kubeconfig()
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CliError(f"cannot read kubeconfig {path}: {e.strerror}",
                       "pass --kubeconfig DATA_DIR/kubeconfig or set NODUS_KUBECONFIG") from None
    ctx: dict[str, Any] = next((c["context"] for c in config.get("contexts", []) if c["name"] == config.get("current-context")), {})
    user: dict[str, Any] = next((u["user"] for u in config.get("users", []) if u["name"] == ctx.get("user")), {})
    token: str = user.get("token", "")
    return token


def call(args: argparse.Namespace, method: str, request: Any,
         stub_class: Any = project_pb2_grpc.ProjectServiceStub) -> dict[str, Any]:
    """One operator RPC with the kubeconfig's token; a failure becomes a CliError with the server's fix."""
    target = args.coordinator or os.environ.get("NODUS_COORDINATOR", "127.0.0.1:7070")
    with grpc.insecure_channel(target) as channel:
        stub = stub_class(channel)
        try:
            reply = getattr(stub, method)(request, metadata=(("authorization", f"Bearer {_token(args)}"),),
                                          timeout=30)
        except grpc.RpcError as e:
            message = e.details() or str(e.code())
            fix = ""
            if "(fix: " in message:
                message, _, rest = message.partition(" (fix: ")
                fix = rest.rsplit("; requestId:", 1)[0]
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                fix = f"start the coordinator or pass --coordinator HOST:PORT (tried {target})"
            raise CliError(message, fix) from None
    return json_format.MessageToDict(reply, preserving_proto_field_name=True)


def create_project(args: argparse.Namespace, name: str) -> dict[str, Any]:
    return call(args, "CreateProject", project_pb2.CreateProjectRequest(name=name))


def create_token(args: argparse.Namespace, project: str, role: str, subject: str, ttl: int) -> dict[str, Any]:
    return call(args, "CreateToken", project_pb2.CreateTokenRequest(project=project, role=role, subject=subject,
                                                                    ttl_seconds=ttl))
