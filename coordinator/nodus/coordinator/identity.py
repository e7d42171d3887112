"""Identity: projects, bearer tokens, subjects and their roles.

A token is `nodus_<id>_<secret>`. The store keeps only the secret's SHA-256 (a stolen database
yields no usable token); the id makes the lookup one `get`. A token grants one role in one project,
or in every project (`*`, the bootstrap admin). Roles nest: admin ⊃ editor ⊃ viewer.
"""
from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from .audit import AuditLog
from .errors import NodusError
from .ratelimit import TokenBuckets
from .store.base import Store

log = logging.getLogger("nodus.identity")

ALL_PROJECTS = "*"
DEFAULT_PROJECT = "default"
CATALOG_PROJECT = "nodus"
"""Managed TrainingRuntimes live here; every subject may read it."""

_PROJECT_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TOKEN_RE = re.compile(r"^nodus_([a-z0-9]{12})_([A-Za-z0-9_-]{20,})$")
_JOIN_RE = re.compile(r"^nodusjoin_([a-z0-9]{12})_([A-Za-z0-9_-]{20,})$")
_CACHE_SECONDS = 5.0
"""How long a verified token stays cached; revocation on this replica clears it at once."""
_TOUCH_SECONDS = 60.0
"""How often a token's stored lastUseTime is written while it is used."""


class Role(enum.IntEnum):
    """What a subject may do in a project; a higher role includes the lower ones (but none includes
    `metrics`, and `metrics` includes nothing: it reads /metrics only)."""

    METRICS = 0
    """/metrics only (a Prometheus scraper's token, in project `*`)."""
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
            raise NodusError("BadRequest", f"unknown role {text!r}",
                             fix="use one of admin, editor, viewer, metrics") from None


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated subject of one request."""

    subject: str
    project: str
    """The project the token is for, or `*`."""
    role: Role
    token_id: str = ""

    @property
    def is_operator(self) -> bool:
        """An admin of every project (the bootstrap token in DATA_DIR/kubeconfig is one)."""
        return self.project == ALL_PROJECTS and self.role >= Role.ADMIN

    def role_in(self, project: str) -> Role | None:
        if self.role == Role.METRICS:
            return None
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

    def __init__(self, store: Store, clock: Callable[[], float] = time.time, limiter: TokenBuckets | None = None,
                 audit: AuditLog | None = None) -> None:
        self._store = store
        self._clock = clock
        self._cache: dict[str, tuple[float, Caller]] = {}
        self.limiter = limiter
        """Per-token rate limits (ratelimit.py); None: none."""
        self.audit = audit
        """Where the transports record every write (audit.py); None: nowhere."""
        self._used: dict[str, float] = {}
        self._flushed: dict[str, float] = {}
        self._writes: set[asyncio.Task[None]] = set()
        self._follower: asyncio.Task[None] | None = None
        self._projects: set[str] = set()
        """Projects seen to exist: a project is never deleted, so a create need not read it again."""

    def now(self) -> float:
        """The clock tokens expire by (unix seconds)."""
        return self._clock()

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
        if name in self._projects:
            return
        if await self.get_project(name) is not None:
            self._projects.add(name)  # no verb deletes a project (a deleting one must discard it here)
        else:
            raise NodusError("NotFound", f'project "{name}" not found', name=name, kind="projects",
                             fix=f"create it with `nodus project create {name}` or use an existing project")

    # -- tokens -----------------------------------------------------------------------------------
    async def create_token(self, project: str, role: Role, subject: str = "", ttl_seconds: int = 0,
                           workload: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
        """Returns the token (shown once) and its stored record (without the secret). `workload` names the
        attempt and ServiceAccount of a workload's token (ADR 0055), shown by `nodus token ls`."""
        if project != ALL_PROJECTS:
            await self.require_project(project)
        if role == Role.METRICS and project != ALL_PROJECTS:
            raise NodusError("BadRequest", f"the metrics role is for every project, not {project!r}",
                             fix="create it with --project '*' --role metrics")
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        record = {
            "id": token_id,
            "subject": subject or f"token:{token_id}",
            "project": project,
            "role": role.name.lower(),
            "digest": hashlib.sha256(secret.encode()).hexdigest(),
            "createTime": _now(),
            "expireTime": _stamp(self._clock() + ttl_seconds) if ttl_seconds > 0 else "",
            "expireUnix": self._clock() + ttl_seconds if ttl_seconds > 0 else 0,
            **({"workload": dict(workload)} if workload else {}),
        }
        await self._store.create(f"_identity/tokens/{token_id}", orjson.dumps(record))
        return f"nodus_{token_id}_{secret}", _public(record)

    async def list_tokens(self, project: str | None = None, revoked: bool = False) -> list[dict[str, Any]]:
        """The tokens of `project` (every project's for None), oldest first; revoked ones only when asked.
        `lastUseTime` is the later of the stored one and this replica's unflushed one."""
        result = await self._store.list("_identity/tokens/")
        records = [orjson.loads(r.value) for r in result.records]
        records = [r for r in records if project in (None, "", r["project"]) and (revoked or not r.get("revokeTime"))]
        for r in records:
            used = self._used.get(r["id"])
            if used is not None and _stamp(used) > r.get("lastUseTime", ""):
                r["lastUseTime"] = _stamp(used)
        return [_public(r) for r in sorted(records, key=lambda r: (r["createTime"], r["id"]))]

    async def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Marks the token revoked (kept, so a request presenting it is told so by id); at once on this
        replica, and on others as soon as their watch of the store delivers the write."""
        while True:
            rec = await self._store.get(f"_identity/tokens/{token_id}")
            if rec is None:
                raise NodusError("NotFound", f'token "{token_id}" not found', name=token_id, kind="tokens",
                                 fix="`nodus token ls` lists the token ids")
            record = orjson.loads(rec.value)
            if record.get("revokeTime"):
                break
            record["revokeTime"] = _now()
            try:
                await self._store.update(rec.key, orjson.dumps(record), rec.revision)
                break
            except NodusError as e:
                if e.reason != "Conflict":
                    raise
        self._cache = {k: v for k, v in self._cache.items() if v[1].token_id != token_id}
        return _public(record)

    async def extend_token(self, token_id: str, ttl_seconds: float) -> float | None:
        """Moves an unrevoked token's expiry to `ttl_seconds` from now (a workload token renewed while its
        attempt runs, ADR 0055); returns the new expiry (unix), or None when it is gone or revoked."""
        while True:
            rec = await self._store.get(f"_identity/tokens/{token_id}")
            if rec is None:
                return None
            record = orjson.loads(rec.value)
            if record.get("revokeTime"):
                return None
            until = self._clock() + ttl_seconds
            record["expireUnix"], record["expireTime"] = until, _stamp(until)
            try:
                await self._store.update(rec.key, orjson.dumps(record), rec.revision)
                return until
            except NodusError as e:
                if e.reason != "Conflict":
                    raise

    async def get_token(self, token_id: str) -> dict[str, Any] | None:
        rec = await self._store.get(f"_identity/tokens/{token_id}")
        return None if rec is None else _public(orjson.loads(rec.value))

    async def authenticate(self, authorization: str | None) -> Caller:
        """Maps an `Authorization: Bearer …` value to a Caller, or raises Unauthorized (an expired or
        revoked token named by its id) or TooManyRequests (over its rate limit)."""
        if not authorization:
            raise NodusError("Unauthorized", "no bearer token was sent")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise NodusError("Unauthorized", "expected 'Authorization: Bearer <token>'")
        token = token.strip()
        if self._follower is None:  # on the loop that serves, from the first request on
            self._follower = asyncio.get_running_loop().create_task(self._follow_tokens())
        now = self._clock()
        cached = self._cache.get(token)
        caller = cached[1] if cached is not None and cached[0] > now else await self._verify(token, now)
        if self.limiter is not None and (self.limiter.settings.operators or not caller.is_operator):
            self.limiter.take(caller.token_id, caller.subject)
        self._touch(caller.token_id, now)
        return caller

    async def _verify(self, token: str, now: float) -> Caller:
        match = _TOKEN_RE.match(token)
        rec = await self._store.get(f"_identity/tokens/{match.group(1)}") if match else None
        if rec is None or match is None:
            raise NodusError("Unauthorized", "the bearer token is not valid")
        record = orjson.loads(rec.value)
        digest = hashlib.sha256(match.group(2).encode()).hexdigest()
        if not hmac.compare_digest(digest, record["digest"]):
            raise NodusError("Unauthorized", "the bearer token is not valid")
        renew = (f"ask an operator for a new token (`nodus token create --project {record['project']} "
                 f"--role {record['role']} --ttl 24h`) and use it instead")
        if record.get("revokeTime"):
            raise NodusError("Unauthorized", f'token "{record["id"]}" was revoked at {record["revokeTime"]}',
                             fix=renew, name=record["id"], kind="tokens")
        if record.get("expireUnix") and record["expireUnix"] <= now:
            raise NodusError("Unauthorized", f'token "{record["id"]}" expired at {record["expireTime"]}',
                             fix=renew, name=record["id"], kind="tokens")
        caller = Caller(record["subject"], record["project"], Role.parse(record["role"]), record["id"])
        if record.get("lastUseTime") and record["id"] not in self._flushed:
            # A stored use within the minute counts as flushed: a restarted coordinator does not write
            # every token's lastUseTime again at its first use of it.
            try:
                self._flushed[record["id"]] = datetime.strptime(record["lastUseTime"], _STAMP).replace(
                    tzinfo=timezone.utc).timestamp()
            except ValueError:
                pass
        if len(self._cache) > 10_000:
            self._cache.clear()
        until = now + _CACHE_SECONDS
        self._cache[token] = (min(until, record["expireUnix"]) if record.get("expireUnix") else until, caller)
        return caller

    async def _follow_tokens(self) -> None:
        """Drops a token from the cache when its record changes in the store, so a revocation through
        another replica (a shared PostgreSQL store) is refused here as soon as its write is seen."""
        while True:
            try:
                async for event in self._store.watch("_identity/tokens/", self._store.revision):
                    token_id = event.key.rsplit("/", 1)[-1]
                    self._cache = {k: v for k, v in self._cache.items() if v[1].token_id != token_id}
                return  # the store closed
            except NodusError as e:  # compacted under a slow watch: follow again from now
                self._cache.clear()
                log.warning("token cache: following the store again (%s)", e.message)

    def _touch(self, token_id: str, now: float) -> None:
        """Notes a use; the stored lastUseTime is written at most once a minute per token."""
        self._used[token_id] = now
        if now - self._flushed.get(token_id, -_TOUCH_SECONDS) < _TOUCH_SECONDS:
            return
        self._flushed[token_id] = now
        if len(self._flushed) > 10_000:
            self._flushed = {token_id: now}
        task = asyncio.get_running_loop().create_task(self._write_last_use(token_id, now))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_last_use(self, token_id: str, now: float) -> None:
        rec = await self._store.get(f"_identity/tokens/{token_id}")
        if rec is None:
            return
        record = orjson.loads(rec.value)
        record["lastUseTime"] = _stamp(now)
        try:
            await self._store.update(rec.key, orjson.dumps(record), rec.revision)
        except NodusError as e:  # a revocation won the race; the next use writes it
            if e.reason != "Conflict":
                log.warning("token %s: cannot record its last use: %s", token_id, e.message)

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


_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def _stamp(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).strftime(_STAMP)
