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


GRPC_EXTENSION = "nodus.dev/grpc"
"""The kubeconfig cluster extension in which the coordinator writes its gRPC address."""
DEFAULT_TARGET = "127.0.0.1:7070"


def _kubeconfig(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    import yaml
    path = Path(args.kubeconfig) if args.kubeconfig else default_kubeconfig()
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CliError(f"cannot read kubeconfig {path}: {e.strerror}",
                       "pass --kubeconfig DATA_DIR/kubeconfig or set NODUS_KUBECONFIG") from None
    return path, config if isinstance(config, dict) else {}


def _current(config: dict[str, Any], section: str, key: str) -> dict[str, Any]:
    ctx: dict[str, Any] = next((c["context"] for c in config.get("contexts") or []
                                if c.get("name") == config.get("current-context")), {})
    entry: dict[str, Any] = next((e.get(section[:-1]) or {} for e in config.get(section) or []
                                  if e.get("name") == ctx.get(key)), {})
    return entry


def _token(args: argparse.Namespace) -> str:
    token: str = _current(_kubeconfig(args)[1], "users", "user").get("token", "")
    return token


def _grpc_extension(config: dict[str, Any]) -> dict[str, Any]:
    for ext in _current(config, "clusters", "cluster").get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == GRPC_EXTENSION and isinstance(ext.get("extension"), dict):
            found: dict[str, Any] = ext["extension"]
            return found
    return {}


def credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """How the gRPC port is reached: TLS verified with the kubeconfig cluster's CA (the coordinator's
    DATA_DIR/tls/ca.crt, as REST is verified), the system's roots when it names none; None
    (plaintext) only where the coordinator wrote that it runs with --grpc-insecure."""
    import base64
    try:
        path, config = _kubeconfig(args)
    except CliError:
        return grpc.ssl_channel_credentials()
    if _grpc_extension(config).get("insecure") is True:
        return None
    cluster = _current(config, "clusters", "cluster")
    if cluster.get("certificate-authority-data"):
        return grpc.ssl_channel_credentials(base64.b64decode(cluster["certificate-authority-data"]))
    if cluster.get("certificate-authority"):
        ca = Path(str(cluster["certificate-authority"]))
        try:
            return grpc.ssl_channel_credentials((ca if ca.is_absolute() else path.parent / ca).read_bytes())
        except OSError as e:
            raise CliError(f"cannot read the kubeconfig's certificate-authority {ca}: {e.strerror}") from None
    return grpc.ssl_channel_credentials()


def target(args: argparse.Namespace) -> str:
    """The coordinator's gRPC address: --coordinator, else $NODUS_COORDINATOR, else the kubeconfig's
    nodus.dev/grpc cluster extension (the coordinator writes it), else endpoints.json beside the
    kubeconfig (a coordinator's data dir), else 127.0.0.1:7070."""
    if args.coordinator:
        return str(args.coordinator)
    if os.environ.get("NODUS_COORDINATOR"):
        return os.environ["NODUS_COORDINATOR"]
    try:
        path, config = _kubeconfig(args)
    except CliError:
        return DEFAULT_TARGET  # the token lookup says what is wrong with the kubeconfig
    address = _grpc_extension(config).get("address")
    if address:
        return str(address)
    try:
        import orjson
        return str(orjson.loads((path.parent / "endpoints.json").read_bytes())["grpc"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_TARGET


def call(args: argparse.Namespace, method: str, request: Any,
         stub_class: Any = project_pb2_grpc.ProjectServiceStub) -> dict[str, Any]:
    """One operator RPC with the kubeconfig's token; a failure becomes a CliError with the server's fix."""
    address = target(args)
    creds = credentials(args)
    with (grpc.insecure_channel(address) if creds is None else grpc.secure_channel(address, creds)) as channel:
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
                fix = f"start the coordinator or pass --coordinator HOST:PORT (tried {address})"
                if "certificate" in message.lower() or "handshake" in message.lower():
                    fix = (f"the TLS handshake with {address} failed: use the kubeconfig the coordinator wrote "
                           "(DATA_DIR/kubeconfig carries its CA)")
            raise CliError(message, fix) from None
    return json_format.MessageToDict(reply, preserving_proto_field_name=True)


def create_project(args: argparse.Namespace, name: str) -> dict[str, Any]:
    return call(args, "CreateProject", project_pb2.CreateProjectRequest(name=name))
