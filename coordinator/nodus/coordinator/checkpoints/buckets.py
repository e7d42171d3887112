"""A bucket input's object and the keys that read it: the S3 Connection it names, with its Secret's
latest keys, read when the attempt is assigned (as a checkpoint store's are, ADR 0014), so rotated
keys reach the next attempt and nothing of them is stored on the Job or the Attempt."""
from __future__ import annotations

from nodus.v1 import agent_pb2

from ..errors import NodusError
from ..vault import Vault
from .locations import Read, connection_fields


async def bucket_location(read: Read, vault: Vault, project: str, connection: str, uri: str,
                          at: str) -> agent_pb2.Location:
    """The Location of `uri` (s3://bucket/key) with the keys, endpoint and region of Connection
    `connection` (named at `at`, spec.inputs[i].bucket.connection). Raises NodusError, which fails the
    attempt's assignment, when the Connection is missing or not S3, or its Secret or a key is missing."""
    conn = await read("connections", project, connection)
    if conn is None:
        raise NodusError("NotFound", f'Connection "{connection}" ({at}) does not exist in project "{project}"',
                         name=connection, kind="connections",
                         fix=f"create the Connection {connection} (kubectl apply -f connection.yaml); the next "
                             "attempt uses it")
    spec = conn.get("spec") or {}
    if spec.get("type") != "S3":
        raise NodusError("BadRequest", f'Connection "{connection}" ({at}) is of type {spec.get("type")!r}, and a '
                         "bucket input is read through an S3 Connection", name=connection, kind="connections",
                         fix="name an S3 Connection that can read the object")
    credentials = await connection_fields(read, vault, project, connection, spec.get("s3") or {})
    return agent_pb2.Location(uri=uri, credentials=credentials)
