"""Identity: projects, bearer tokens, subjects and their roles.

A token is `nodus_<id>_<secret>`. The store keeps only the secret's SHA-256 (a stolen database
yields no usable token); the id makes the lookup one `get`. A token grants one role in one project,
or in every project (`*`, the bootstrap admin). Roles nest: admin ⊃ editor ⊃ viewer.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from .errors import NodusError
from .store.base import Store

ALL_PROJECTS = "*"
DEFAULT_PROJECT = "default"
CATALOG_PROJECT = "nodus"
"""Managed TrainingRuntimes live here; every subject may read it."""

_PROJECT_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TOKEN_RE = re.compile(r"^nodus_([a-z0-9]{12})_([A-Za-z0-9_-]{20,})$")
_JOIN_RE = re.compile(r"^nodusjoin_([a-z0-9]{12})_([A-Za-z0-9_-]{20,})$")
_CACHE_SECONDS = 5.0
"""How long a verified token stays cached; revocation on this replica clears it at once."""


class Role(enum.IntEnum):
    """What a subject may do in a project; a higher role includes the lower ones."""

    VIEWER = 1
    """get, list and watch."""
    EDITOR = 2
    """and create, replace, patch and delete."""
    ADMIN = 3
    """and status writes, tokens and (in `*`) projects."""

    @classmethod
    def parse(cls, text: str) -> "Role":
        try:
            return cls[text.upper()]
        except KeyError:
            raise NodusError("BadRequest", f"unknown role {text!r}", fix="use one of admin, editor, viewer") from None


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated subject of one request."""

    subject: str
    project: str
    """The project the token is for, or `*`."""
    role: Role
    token_id: str = ""

    def role_in(self, project: str) -> Role | None:
        if self.project in (ALL_PROJECTS, project):
            return self.role
        if project == CATALOG_PROJECT:
            return Role.VIEWER
        return None

    def can(self, project: str, needed: Role) -> bool:
        role = self.role_in(project)
        return role is not None and role >= needed


def require_operator(caller: Caller) -> None:
    """Operator services (NodeService, GangService) answer an admin of every project only."""
    if caller.project != ALL_PROJECTS or caller.role < Role.ADMIN:
        raise NodusError("Forbidden", f'User "{caller.subject}" is not a cluster operator',
                         fix="use an admin token for every project (the one in DATA_DIR/kubeconfig)")


SYSTEM = Caller("system:coordinator", ALL_PROJECTS, Role.ADMIN)
"""The coordinator's own controllers."""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def validate_project_name(name: str) -> None:
    if not _PROJECT_RE.match(name or ""):
        raise NodusError("BadRequest", f"invalid project name {name!r}",
                         fix="use 1-63 lower-case letters, digits and '-', starting and ending alphanumeric")


class Identity:
    """Projects and tokens, kept in the store under `_identity/`."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._cache: dict[str, tuple[float, Caller]] = {}

    # -- projects ---------------------------------------------------------------------------------
    async def ensure_project(self, name: str, display_name: str = "") -> dict[str, Any]:
        existing = await self.get_project(name)
        if existing is not None:
            return existing
        return await self.create_project(name, display_name)

    async def create_project(self, name: str, display_name: str = "") -> dict[str, Any]:
        validate_project_name(name)
        if name == ALL_PROJECTS:
            raise NodusError("BadRequest", "'*' is reserved")
        doc = {"name": name, "displayName": display_name or name, "createTime": _now()}
        try:
            await self._store.create(f"_identity/projects/{name}", orjson.dumps(doc))
        except NodusError as e:
            if e.reason == "AlreadyExists":
                raise NodusError("AlreadyExists", f'project "{name}" already exists', name=name, kind="projects") from None
            raise
        return doc

    async def get_project(self, name: str) -> dict[str, Any] | None:
        rec = await self._store.get(f"_identity/projects/{name}")
        return None if rec is None else orjson.loads(rec.value)

    async def list_projects(self) -> list[dict[str, Any]]:
        result = await self._store.list("_identity/projects/")
        return [orjson.loads(r.value) for r in result.records]

    async def require_project(self, name: str) -> None:
        if await self.get_project(name) is None:
            raise NodusError("NotFound", f'project "{name}" not found', name=name, kind="projects",
                             fix=f"create it with `nodus project create {name}` or use an existing project")

    # -- tokens -----------------------------------------------------------------------------------
    async def create_token(self, project: str, role: Role, subject: str = "", ttl_seconds: int = 0) -> tuple[str, dict[str, Any]]:
        """Returns the token (shown once) and its stored record (without the secret)."""
        if project != ALL_PROJECTS:
            await self.require_project(project)
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        record = {
            "id": token_id,
            "subject": subject or f"token:{token_id}",
            "project": project,
            "role": role.name.lower(),
            "digest": hashlib.sha256(secret.encode()).hexdigest(),
            "createTime": _now(),
            "expireTime": (datetime.fromtimestamp(self._clock() + ttl_seconds, timezone.utc)
                           .strftime("%Y-%m-%dT%H:%M:%SZ") if ttl_seconds > 0 else ""),
            "expireUnix": self._clock() + ttl_seconds if ttl_seconds > 0 else 0,
        }
        await self._store.create(f"_identity/tokens/{token_id}", orjson.dumps(record))
        return f"nodus_{token_id}_{secret}", _public(record)

    async def list_tokens(self, project: str | None = None) -> list[dict[str, Any]]:
        result = await self._store.list("_identity/tokens/")
        records = [orjson.loads(r.value) for r in result.records]
        return [_public(r) for r in records if project in (None, "", r["project"])]

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        rec = await self._store.get(f"_identity/tokens/{token_id}")
        if rec is None:
            raise NodusError("NotFound", f'token "{token_id}" not found', name=token_id, kind="tokens")
        await self._store.delete(rec.key)
        self._cache = {k: v for k, v in self._cache.items() if v[1].token_id != token_id}
        return _public(orjson.loads(rec.value))

    async def get_token(self, token_id: str) -> dict[str, Any] | None:
        rec = await self._store.get(f"_identity/tokens/{token_id}")
        return None if rec is None else _public(orjson.loads(rec.value))

    async def authenticate(self, authorization: str | None) -> Caller:
        """Maps an `Authorization: Bearer …` value to a Caller, or raises Unauthorized."""
        if not authorization:
            raise NodusError("Unauthorized", "no bearer token was sent")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise NodusError("Unauthorized", "expected 'Authorization: Bearer <token>'")
        token = token.strip()
        now = self._clock()
        cached = self._cache.get(token)
        if cached is not None and cached[0] > now:
            return cached[1]
        match = _TOKEN_RE.match(token)
        rec = await self._store.get(f"_identity/tokens/{match.group(1)}") if match else None
        if rec is None or match is None:
            raise NodusError("Unauthorized", "the bearer token is not valid")
        record = orjson.loads(rec.value)
        digest = hashlib.sha256(match.group(2).encode()).hexdigest()
        if not hmac.compare_digest(digest, record["digest"]):
            raise NodusError("Unauthorized", "the bearer token is not valid")
        if record.get("expireUnix") and record["expireUnix"] <= now:
            raise NodusError("Unauthorized", "the bearer token has expired",
                             fix="create a new token with `nodus token create`")
        caller = Caller(record["subject"], record["project"], Role.parse(record["role"]), record["id"])
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[token] = (now + _CACHE_SECONDS, caller)
        return caller

    # -- agent join tokens ------------------------------------------------------------------------
    async def create_join_token(self) -> str:
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        record = {"id": token_id, "digest": hashlib.sha256(secret.encode()).hexdigest(), "createTime": _now()}
        await self._store.create(f"_identity/join-tokens/{token_id}", orjson.dumps(record))
        return f"nodusjoin_{token_id}_{secret}"

    async def rotate_join_token(self) -> tuple[str, int]:
        """A new join token; every older one is deleted, so it no longer enrols anyone (enrolled nodes
        hold certificates and do not need it). Returns the token and how many were retired."""
        old = await self._store.list("_identity/join-tokens/")
        token = await self.create_join_token()
        for rec in old.records:
            await self._store.delete(rec.key)
        return token, len(old.records)

    async def verify_join_token(self, authorization: str | None) -> str:
        """Checks an agent's `Bearer nodusjoin_…` value; returns the join token's id, or raises Unauthorized."""
        if not authorization:
            raise NodusError("Unauthorized", "no join token was sent",
                             fix="send the agent join token (DATA_DIR/join-token) as 'authorization: Bearer …'")
        scheme, _, token = authorization.strip().partition(" ")
        match = _JOIN_RE.match(token.strip()) if scheme.lower() == "bearer" else None
        rec = await self._store.get(f"_identity/join-tokens/{match.group(1)}") if match else None
        if rec is None or match is None or not hmac.compare_digest(
                hashlib.sha256(match.group(2).encode()).hexdigest(), orjson.loads(rec.value)["digest"]):
            raise NodusError("Unauthorized", "the join token is not valid",
                             fix="use the join token in the coordinator's DATA_DIR/join-token")
        return match.group(1)


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("digest", "expireUnix")}
