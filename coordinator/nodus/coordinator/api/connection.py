"""Connection (nodus.dev/v1): how a project reaches an external system, credentials by reference.

A Connection names the place (an S3 bucket, its endpoint, region and prefix) and the Secret in the
same project that holds the keys (`accessKeyId`, `secretAccessKey`, optionally `sessionToken`); it
never holds a credential itself, so `kubectl get connection -o yaml` is safe to share. Jobs name
Connections in `spec.connections`; a Checkpointed Job stores its checkpoints in the first S3
Connection listed (ADR 0014). Nothing is resolved at admission, neither here nor on the Job: the
Secret, and the Connection itself, may be created after the objects that name them, as in
Kubernetes; the coordinator resolves both when it assigns an attempt, and fails that attempt with a
clear reason when either is missing.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from .. import errors
from ..errors import Cause
from .job import DNS_LABEL, DNS_LABEL_MESSAGE
from .limits import AdmissionLimits
from .schema import Int, KindSchema, Obj, Str

TYPES = ("S3", "Postgres", "Git")
"""S3: an S3 bucket, on AWS or any S3-compatible server (MinIO, R2, Ceph …). Postgres: a PostgreSQL
database (Neon and Supabase included) that output sinks load into. Git: private git repositories
under a URL prefix, read for source.git (docs/adr/0050). Other types come with the features
that use them."""
POSTGRES_KEYS = ("user", "password")
"""The keys a Postgres Connection's Secret must hold."""

SECRET_KEYS = ("accessKeyId", "secretAccessKey")
"""The keys an S3 Connection's Secret must hold; `sessionToken` is optional (temporary credentials)."""
SESSION_TOKEN = "sessionToken"

_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_BUCKET_RULES = ("must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' and '-', starting and "
                 "ending with a letter or digit")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_problem(name: str) -> str | None:
    """Why `name` is not a valid S3 bucket name (AWS's general purpose bucket naming rules), or None."""
    if not 3 <= len(name) <= 63 or _BUCKET_CHARS.match(name) is None:
        return _BUCKET_RULES
    if ".." in name:
        return "must not contain two adjacent periods"
    if ".-" in name or "-." in name:
        return "must not have a '-' next to a '.'"
    try:
        ipaddress.IPv4Address(name)
        return "must not be formatted as an IP address"
    except ValueError:
        pass
    for prefix in _RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"must not start with the reserved prefix {prefix!r}"
    for suffix in _RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"must not end with the reserved suffix {suffix!r}"
    return None


def _bucket(value: str, path: str) -> list[Cause]:
    problem = bucket_problem(value)
    return [errors.invalid_value(path, value, problem)] if problem else []


def _endpoint(value: str, path: str) -> list[Cause]:
    if "@" in value.split("://", 1)[-1].split("/", 1)[0]:
        # Anything in the URL is shown by `kubectl get` and may be logged: keys belong in the Secret (and
        # the value is not echoed back in the error either).
        return [errors.forbidden(path, "must not carry credentials (user:password@); put them in the Secret "
                                       "named in spec.s3.secret")]
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as e:
        return [errors.invalid_value(path, value, f"must be an http or https URL ({e})")]
    if url.scheme not in ("http", "https") or not url.hostname:
        return [errors.invalid_value(path, value, "must be an http or https URL with a host, for example "
                                                  "https://s3.eu-central-1.amazonaws.com or http://minio:9000")]
    if url.query or url.fragment:
        return [errors.invalid_value(path, value, "must not have a query or a fragment")]
    if url.path not in ("", "/"):
        return [errors.invalid_value(path, value, "must not have a path; put the bucket in spec.s3.bucket and "
                                                  "key prefixes in spec.s3.prefix")]
    return []


def _prefix(value: str, path: str) -> list[Cause]:
    if value.startswith("/"):
        return [errors.invalid_value(path, value, "must not start with '/' (it is a key prefix in the bucket)")]
    parts = value.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return [errors.invalid_value(path, value, "must be '/'-separated names, without empty, '.' or '..' parts")]
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in value):
        return [errors.invalid_value(path, value, "must not contain control characters")]
    return []


S3_SPEC = Obj(description="S3Connection is a bucket on AWS S3 or an S3-compatible server.",
              required=("bucket", "secret"), fields={
    "bucket": Str(description="Bucket is the bucket's name (S3 bucket naming rules: 3-63 lowercase letters, "
                              "digits, '.' and '-').", checks=(_bucket,)),
    "endpoint": Str(description="Endpoint is the server's URL, for S3-compatible servers (http or https, no path, "
                                "no credentials); empty for AWS S3.", max_length=2048, checks=(_endpoint,)),
    "region": Str(description="Region is the bucket's region (us-east-1 when empty).", max_length=63,
                  pattern=r"^[a-z0-9][-a-z0-9]*$",
                  pattern_message="must be a region name: lowercase letters, digits and '-' (for example "
                                  "eu-central-1)"),
    "prefix": Str(description="Prefix is where under the bucket Nodus writes (checkpoints go to "
                              "PREFIX/PROJECT/JOB/).", max_length=512, checks=(_prefix,)),
    "secret": Str(description="Secret names the Secret in the same project that holds the keys accessKeyId and "
                              "secretAccessKey, and optionally sessionToken. It is read when an attempt starts, so "
                              "rotating its keys needs no change here.",
                  pattern=DNS_LABEL, pattern_message=DNS_LABEL_MESSAGE, max_length=63),
})

POSTGRES_SPEC = Obj(description="PostgresConnection is a PostgreSQL database (Neon and Supabase too).",
                    required=("host", "database", "secret"), fields={
    "host": Str(description="Host is the server's name or address.", max_length=253,
                pattern=r"^[A-Za-z0-9._:-]+$", pattern_message="must be a host name or an IP address"),
    "port": Int(description="Port is the server's port (5432 by default).", minimum=1, maximum=65535, default=5432),
    "database": Str(description="Database is the database's name.", max_length=63),
    "sslMode": Str(description="SSLMode is libpq's sslmode: disable, prefer (the default), require, verify-ca or "
                               "verify-full.", enum=("disable", "prefer", "require", "verify-ca", "verify-full"),
                   default="prefer"),
    "secret": Str(description="Secret names the Secret in the same project that holds the keys user and password.",
                  pattern=DNS_LABEL, pattern_message=DNS_LABEL_MESSAGE, max_length=63),
})

GIT_KEYS = ("username", "password")
"""The keys a Git Connection's Secret must hold (password: a personal access token, as git hosts take)."""

GIT_SPEC = Obj(description="GitConnection is the repositories under a URL prefix that need credentials.",
               required=("urlPrefix", "secret"), fields={
    "urlPrefix": Str(description="URLPrefix is where the repositories are (https:// or http://, no credentials); a "
                                 "Job's source.git.repo under it is read with this Connection's Secret when the Job "
                                 "lists the Connection in spec.connections (the longest prefix wins).",
                     max_length=2048, pattern=r"^https?://[^@\s]+$",
                     pattern_message="must be an http:// or https:// URL without credentials (put them in the "
                                     "Secret)"),
    "secret": Str(description="Secret names the Secret in the same project that holds the keys username and "
                              "password (a token), sent as HTTP basic auth.",
                  pattern=DNS_LABEL, pattern_message=DNS_LABEL_MESSAGE, max_length=63),
})

CONNECTION_SPEC = Obj(description="ConnectionSpec says what the Connection reaches.", required=("type",), fields={
    "type": Str(description="Type is the kind of system: S3, Postgres or Git.", enum=TYPES),
    "s3": S3_SPEC,
    "postgres": POSTGRES_SPEC,
    "git": GIT_SPEC,
})

CONNECTION_STATUS = Obj(description="ConnectionStatus is empty: a Connection is checked when it is used (the "
                                    "attempt that uses it fails with the reason).")


def rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return [errors.required("spec")] if "spec" not in body else []
    if spec.get("type") == "S3" and "s3" not in spec:
        return [errors.required("spec.s3", "spec.type is S3: set spec.s3.bucket and spec.s3.secret")]
    if spec.get("type") == "Postgres" and "postgres" not in spec:
        return [errors.required("spec.postgres", "spec.type is Postgres: set spec.postgres.host, database and "
                                                 "secret")]
    if spec.get("type") == "Git" and "git" not in spec:
        return [errors.required("spec.git", "spec.type is Git: set spec.git.urlPrefix and spec.git.secret")]
    return []


CONNECTION = KindSchema(
    kind="Connection",
    description="Connection is how a project reaches an external system: for type S3, a bucket (and its endpoint, "
                "region and prefix) and the Secret holding its keys. A Job lists the Connections it may use in "
                "spec.connections; a Checkpointed Job stores its checkpoints in the first S3 Connection listed.",
    body=Obj(fields={"spec": CONNECTION_SPEC}),
    status=CONNECTION_STATUS,
    rules=rules,
    mutable=("spec.s3", "spec.postgres", "spec.git"),
)

__all__ = ["CONNECTION", "GIT_KEYS", "POSTGRES_KEYS", "SECRET_KEYS", "SESSION_TOKEN", "TYPES", "bucket_problem"]
