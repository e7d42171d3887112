"""What a fresh data dir gets on the first start, idempotently: the default and catalog projects, the
admin kubeconfig (with the gRPC address in an extension) and the agents' join token."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from .identity import ALL_PROJECTS, CATALOG_PROJECT, DEFAULT_PROJECT, Identity, Role
from .tls import TlsFiles
from .tls import write_private

GRPC_EXTENSION = "nodus.dev/grpc"
"""The kubeconfig cluster extension naming the coordinator's gRPC address, where the operator verbs
of the `nodus` CLI find it (kubectl and the Kubernetes clients ignore extensions they do not know)."""


def kubeconfig(server: str, ca_pem: bytes | None, token: str, grpc: str = "",
               grpc_insecure: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    if grpc:
        # gRPC is verified with the cluster's CA, as REST is; `insecure` only for --grpc-insecure.
        extension: dict[str, Any] = {"address": grpc, **({"insecure": True} if grpc_insecure else {})}
        cluster["extensions"] = [{"name": GRPC_EXTENSION, "extension": extension}]
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "nodus", "cluster": cluster}],
        "users": [{"name": "nodus-admin", "user": {"token": token}}],
        "contexts": [{"name": "nodus", "context": {"cluster": "nodus", "user": "nodus-admin", "namespace": "default"}}],
        "current-context": "nodus",
    }


async def bootstrap(data_dir: Path, identity: Identity, server: str, tls: TlsFiles, grpc: str = "",
                    grpc_insecure: bool = False) -> None:
    """Idempotent: projects, the admin kubeconfig and the agent join token."""
    await identity.ensure_project(DEFAULT_PROJECT, "Default project")
    await identity.ensure_project(CATALOG_PROJECT, "Managed catalog")
    path = data_dir / "kubeconfig"
    token = ""
    if path.exists():
        try:
            current = yaml.safe_load(path.read_text())
            token = current["users"][0]["user"]["token"]
            await identity.authenticate(f"Bearer {token}")
        except Exception:  # noqa: BLE001 - an unusable file is replaced with a fresh token
            token = ""
    if not token:
        token, _ = await identity.create_token(ALL_PROJECTS, Role.ADMIN, subject="admin")
    ca_pem = tls.ca.read_bytes() if tls.ca is not None else None
    write_private(path, yaml.safe_dump(kubeconfig(server, ca_pem, token, grpc, grpc_insecure),
                                       sort_keys=False).encode())
    join = data_dir / "join-token"
    if not join.exists():
        write_private(join, (await identity.create_join_token()).encode() + b"\n")
