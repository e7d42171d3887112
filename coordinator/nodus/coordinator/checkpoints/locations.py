"""Where a Job's checkpoints go and the keys that reach them: the embedded blob store, or the first S3
Connection of spec.connections with its Secret's latest keys (read when asked, so rotated keys reach
what asks next: an assignment, a checkpoint request, a retention sweep)."""
from __future__ import annotations

import base64
import binascii
from typing import Any, Awaitable, Callable

from nodus.v1 import agent_pb2

from ..api.connection import SECRET_KEYS, SESSION_TOKEN
from ..controllers import checkpoints as rules
from ..controllers.objects import Objects
from ..errors import NodusError
from ..vault import Vault

BLOB_URI = "blob://sha256/"

Read = Callable[[str, str, str], Awaitable["dict[str, Any] | None"]]
"""(plural, project, name) → the stored object or None: how `checkpoint_store` reads Connections and Secrets."""


async def connection_of(read: Read, job: dict[str, Any] | None, uri: str) -> str:
    """The Connection of the Job's spec.connections that an s3:// checkpoint went to (its bucket)."""
    if job is None or not uri.startswith(rules.S3_URI):
        return ""
    bucket = uri[len(rules.S3_URI):].partition("/")[0]
    project = job["metadata"]["namespace"]
    for name in (job.get("spec") or {}).get("connections") or []:
        conn = await read("connections", project, name)
        cspec = (conn or {}).get("spec") or {}
        if cspec.get("type") == "S3" and (cspec.get("s3") or {}).get("bucket") == bucket:
            return str(name)
    return ""


def reader(objects: Objects) -> Read:
    """`Read` over the stored objects (Connections and Secrets are not in the cache)."""
    async def read(plural: str, project: str, name: str) -> dict[str, Any] | None:
        found = await objects.read(f"{plural}/{project}/{name}")
        return found[0] if found is not None else None
    return read


async def checkpoint_store(read: Read, vault: Vault, job: dict[str, Any]) -> agent_pb2.Location | None:
    """Where a Checkpointed Job's checkpoints go: the first S3 Connection in spec.connections, with the
    keys of its Secret's latest version (read now, at assignment, so rotated keys reach new attempts);
    None for the embedded blob store (no Connection listed, or the Job does not checkpoint).

    Raises NodusError, which fails the attempt's assignment, when a listed Connection or its Secret
    does not exist or the Secret lacks a key: they may be created after the Job (ADR 0014)."""
    spec = job.get("spec") or {}
    if rules.continuity(spec) != "Checkpointed":
        return None
    project, name = job["metadata"]["namespace"], job["metadata"]["name"]
    for conn_name in spec.get("connections") or []:
        conn = await read("connections", project, conn_name)
        if conn is None:
            raise NodusError("NotFound", f'Connection "{conn_name}" (named in spec.connections of Job "{name}") '
                             f'does not exist in project "{project}"', name=conn_name, kind="connections",
                             fix=f"create the Connection {conn_name} (kubectl apply -f connection.yaml); the next "
                                 "attempt uses it")
        cspec = conn.get("spec") or {}
        if cspec.get("type") != "S3":
            continue
        s3 = cspec.get("s3") or {}
        prefix = "/".join(p for p in (str(s3.get("prefix") or "").strip("/"), project, name) if p)
        credentials = await connection_fields(read, vault, project, conn_name, s3)
        return agent_pb2.Location(uri=f"s3://{s3['bucket']}/{prefix}/", credentials=credentials)
    return None


async def connection_fields(read: Read, vault: Vault, project: str, conn_name: str, s3: dict[str, Any]) -> dict[str, str]:
    """Location.credentials of an s3:// store: accessKeyId, secretAccessKey, sessionToken (its Secret's
    latest version), endpoint and region (S3Store.at reads the same names). Raises NodusError."""
    values = await _connection_keys(read, vault, project, conn_name, str(s3.get("secret") or ""))
    return {k: v for k, v in (("endpoint", s3.get("endpoint") or ""), ("region", s3.get("region") or ""),
                              *values.items()) if v}


async def _connection_keys(read: Read, vault: Vault, project: str, conn: str, secret_name: str) -> dict[str, str]:
    """accessKeyId, secretAccessKey and sessionToken (when present) of the Secret's latest version."""
    where = f'Secret "{secret_name}" (spec.s3.secret of Connection "{conn}")'
    needs = f"a Secret with the keys {' and '.join(SECRET_KEYS)} (and optionally {SESSION_TOKEN})"
    secret = await read("secrets", project, secret_name)
    version = int(((secret or {}).get("status") or {}).get("version") or 0)
    if secret is None or not version:
        raise NodusError("NotFound", f'{where} does not exist in project "{project}"', name=secret_name,
                         kind="secrets", fix=f"create {needs} named {secret_name}; the next attempt uses it")
    stored = await vault.get(project, secret_name, version)
    out: dict[str, str] = {}
    for key in (*SECRET_KEYS, SESSION_TOKEN):
        if key not in stored:
            if key == SESSION_TOKEN:
                continue
            raise NodusError("NotFound", f'{where} has no key "{key}"', name=secret_name, kind="secrets",
                             fix=f"give it {needs}")
        try:
            out[key] = base64.b64decode(stored[key], validate=True).decode().strip()
        except (binascii.Error, ValueError):
            raise NodusError("BadRequest", f'{where}: the value of "{key}" is not UTF-8 text', name=secret_name,
                             kind="secrets", fix=f"write {key} as plain text (stringData)") from None
    return out
