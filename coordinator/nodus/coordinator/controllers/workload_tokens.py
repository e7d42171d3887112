"""Workload identity (ADR 0055): each attempt of a Job with `spec.serviceAccountName` gets a token of
that ServiceAccount, which lives as long as the attempt does.

`attach` mints the token when the attempt's Assignment is built (subject
`system:serviceaccount:<project>:<name>`, the account's role in its project, a short expiry) and adds it
to that Assignment as one more SecretMount, `nodus.serviceaccount` (`token`, `namespace`, and the
coordinator's `ca.crt` when it made its own certificate), so it travels only to the attempt's node, as
Secret values do (ADR 0045), and never into a stored object, a log or the audit log. The agent writes it
beside the attempt's Secrets and names the file in `NODUS_TOKEN_FILE`.

Every live workload token has an index record under `_identity/workload-tokens/<token id>`, so the
controller reads only live ones. `decide` (pure) says per record: keep it, renew it (its expiry is moved,
so the token the program holds stays the same and no file is rewritten), or revoke it: its attempt ended
(Succeeded, Failed, Lost, Cancelled: a replaced attempt ends so) or was deleted, its ServiceAccount was
deleted (or replaced by another of the same name), or the account's role was lowered. Level-triggered: an
attempt's change queues it, and a resync every quarter of the lifetime renews and revokes the rest.

The resync also forgets dead tokens (ADR 0067): a workload token's record under `_identity/tokens/` (kept
when revoked, so a request presenting it is told "revoked at T") is deleted once its expiry is `grace`
past (`collectable`, pure). A live token's expiry keeps moving, so only a revoked token, or one whose
renewals stopped, ever gets there; each attempt built leaves a record for at most TTL + grace.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import orjson

from nodus.v1 import agent_pb2

from ..api.serviceaccount import subject
from ..errors import NodusError
from ..identity import Identity, Role
from ..store.base import Store
from .attempt_machine import phase_of
from .cache import ATTEMPTS, Cache, attempt_key, owner_of
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.workload_tokens")

TOKEN_MOUNT = "nodus.serviceaccount"
"""The SecretMount carrying the token. A Secret's name is a DNS label, so no customer Secret can take it;
the agent keeps the same name (nodus.agent.runtime.process.TOKEN_MOUNT) to set NODUS_TOKEN_FILE."""
INDEX = "_identity/workload-tokens/"
"""Live workload tokens, keyed `<project>/<attempt>/<token id>`: an ended attempt's are one prefix list."""
TTL_SECONDS = 3600.0
"""A workload token's lifetime; renewed while its attempt lives once less than half of it is left, so a
token outlives its attempt by at most this long if every revocation failed."""
API_SERVER_ENV = "NODUS_API_SERVER"
TOKENS = "_identity/tokens/"
GRACE_SECONDS = 3600.0
"""How long a dead workload token's record outlives its expiry (a request presenting it is told it was
revoked or expired, rather than that it is not valid); then the resync deletes it."""


@dataclass(frozen=True, slots=True)
class ApiEndpoint:
    """How an attempt reaches the REST API: the URL (--attempt-api-server, else the one the admin
    kubeconfig names), and the CA (PEM) that signed the coordinator's certificate when the coordinator
    made it (empty: a public one)."""

    url: str = ""
    ca_pem: bytes = b""
    configured: bool = False
    """The operator named `url` (--attempt-api-server): every attempt is told it as it is."""


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def url_for(api: ApiEndpoint, same_host: bool, own_netns: bool) -> str:
    """The URL an attempt is told in NODUS_API_SERVER (ADR 0065); "" where the default, the kubeconfig's
    server, is a loopback address the attempt cannot reach: its agent is on another host (it connected
    from a non-loopback address), or the attempt runs in a pod, whose network namespace has its own
    loopback."""
    if api.configured or not api.url:
        return api.url
    host = urlsplit(api.url).hostname or ""
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        return api.url
    return api.url if same_host and not own_netns else ""


class Verdict(enum.Enum):
    KEEP = "Keep"
    """Its attempt lives and the expiry is far enough."""
    RENEW = "Renew"
    """Its attempt lives and less than half its lifetime is left: move the expiry."""
    REVOKE = "Revoke"
    """Its attempt or its account is gone, or the account's role was lowered."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    why: str = ""


def decide(entry: dict[str, Any], attempt: dict[str, Any] | None, account: dict[str, Any] | None, now: float,
           ttl: float) -> Decision:
    """What to do with one live workload token (its index record `entry`), given its attempt and its
    ServiceAccount as they are now (None: deleted)."""
    if attempt is None or (attempt.get("spec") or {}).get("id") != entry.get("attemptId"):
        return Decision(Verdict.REVOKE, "its attempt was deleted")
    phase = phase_of(attempt)
    if phase.terminal:
        return Decision(Verdict.REVOKE, f"its attempt ended ({phase.value})")
    if account is None or account["metadata"].get("uid") != entry.get("serviceAccountUID"):
        return Decision(Verdict.REVOKE, f'ServiceAccount "{entry.get("serviceAccount")}" was deleted')
    role = role_of(account)
    if role < Role.parse(str(entry.get("role") or "viewer")):
        return Decision(Verdict.REVOKE, f"the ServiceAccount's role was lowered to {role.name.lower()}")
    if float(entry.get("expireUnix") or 0) - now < ttl / 2:
        return Decision(Verdict.RENEW)
    return Decision(Verdict.KEEP)


def collectable(record: dict[str, Any], now: float, grace: float) -> bool:
    """Whether a token record is a workload token's whose expiry is at least `grace` past: nothing can
    use it any more (a renewal moves only an unexpired, unrevoked token's expiry)."""
    return bool(record.get("workload")) and float(record.get("expireUnix") or 0) + grace <= now


def role_of(account: dict[str, Any]) -> Role:
    """The role a stored ServiceAccount grants (admission defaults it to viewer)."""
    return Role.parse(str((account.get("spec") or {}).get("role") or "viewer"))


def account_key(project: str, name: str) -> str:
    return f"serviceaccounts/{project}/{name}"


async def read_account(store: Store, project: str, name: str) -> dict[str, Any] | None:
    rec = await store.get(account_key(project, name))
    return None if rec is None else dict(orjson.loads(rec.value))


async def attach(built: agent_pb2.Assignment, attempt: dict[str, Any], job: dict[str, Any], identity: Identity,
                 store: Store, api: ApiEndpoint, same_host: bool = True, ttl: float = TTL_SECONDS) -> None:
    """Adds the token of the Job's ServiceAccount to `built` (nothing when the Job names none), and the
    API's address where the attempt can reach it (`url_for`; `same_host`: its agent connected from the
    coordinator's host). An account deleted since admission fails the attempt (NodusError), naming it:
    the program would run without the identity its Job asks for."""
    name = (job.get("spec") or {}).get("serviceAccountName")
    if not name:
        return
    project = attempt["metadata"]["namespace"]
    account = await read_account(store, project, name)
    if account is None:
        raise NodusError("NotFound", f'ServiceAccount "{name}" (spec.serviceAccountName) no longer exists in project '
                         f'"{project}"', name=name, kind="serviceaccounts",
                         fix=f"create the ServiceAccount {name} again; the Job's next attempt gets its token")
    role = role_of(account)
    token, record = await identity.create_token(
        project, role, subject(project, name), ttl_seconds=int(ttl),
        workload={"attempt": attempt["metadata"]["name"], "serviceAccount": name})
    entry = {"tokenId": record["id"], "project": project, "attempt": attempt["metadata"]["name"],
             "attemptId": attempt["spec"]["id"], "serviceAccount": name,
             "serviceAccountUID": account["metadata"].get("uid"), "role": role.name.lower(),
             "expireUnix": identity.now() + int(ttl)}
    await store.create(f"{INDEX}{project}/{attempt['metadata']['name']}/{record['id']}", orjson.dumps(entry))
    data = {"token": token.encode(), "namespace": project.encode()}
    if api.ca_pem:
        data["ca.crt"] = api.ca_pem
    built.secrets.append(agent_pb2.SecretMount(name=TOKEN_MOUNT, data=data, mount_path=f"/nodus/secrets/{TOKEN_MOUNT}"))
    told = url_for(api, same_host, own_netns=bool(built.image))
    if told:
        built.env[API_SERVER_ENV] = told
    elif api.url:
        log.warning("attempt %s gets no %s: the REST API's address %s is loopback, which it cannot reach (%s); "
                    "start the coordinator with --attempt-api-server URL naming an address it reaches",
                    attempt["metadata"]["name"], API_SERVER_ENV, api.url,
                    "it runs in a pod" if built.image else "its node is another host")


async def entries(store: Store, under: str = "") -> list[tuple[str, int, dict[str, Any]]]:
    """The live workload tokens' index records (key, revision, record): every one, or those `under` a
    project ("P/") or an attempt ("P/ATTEMPT/")."""
    found = await store.list(INDEX + under)
    return [(r.key, r.revision, dict(orjson.loads(r.value))) for r in found.records]


async def revoke(identity: Identity, store: Store, key: str, entry: dict[str, Any], why: str) -> None:
    """Revokes the token, then forgets its index record (a crash between leaves the record: revoked again)."""
    try:
        await identity.revoke_token(str(entry["tokenId"]))
    except NodusError as e:
        if e.reason != "NotFound":
            raise
    try:
        await store.delete(key)
    except NodusError as e:
        if e.reason != "NotFound":
            raise
    log.info("workload token %s of ServiceAccount %s/%s (attempt %s) revoked: %s", entry.get("tokenId"),
             entry.get("project"), entry.get("serviceAccount"), entry.get("attempt"), why)


async def revoke_account(identity: Identity, store: Store, project: str, name: str,
                         why: str = "it was deleted") -> int:
    """Revokes every live token of ServiceAccount `project/name`; returns how many."""
    n = 0
    for key, _, entry in await entries(store, f"{project}/"):
        if entry.get("serviceAccount") == name:
            await revoke(identity, store, key, entry, f'ServiceAccount "{name}": {why}')
            n += 1
    return n


class WorkloadTokens:
    """Renews the live workload tokens and revokes those whose attempt or account is gone."""

    def __init__(self, cache: Cache, store: Store, identity: Identity, ttl: float = TTL_SECONDS,
                 now: Callable[[], float] | None = None, grace: float = GRACE_SECONDS) -> None:
        self.cache, self.store, self.identity, self.ttl, self.grace = cache, store, identity, ttl, grace
        self.now: Callable[[], float] = now or identity.now
        self.queue: WorkQueue[str] = WorkQueue()
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and not phase_of(new).terminal:
            return
        attempt = new if new is not None else old
        if attempt is not None:
            job = self.cache.job(*owner_of(attempt))
            if job is not None and not (job.get("spec") or {}).get("serviceAccountName"):
                return  # its Job runs as no account: it holds no token, so no store read per ended attempt
        self.queue.add(key)

    def resync(self) -> None:
        self.queue.add("")  # "": every live token

    async def run(self) -> None:
        await self.cache.synced.wait()
        self.resync()
        await run_workers(self.queue, self.reconcile, workers=1, resync=self.resync,
                          resync_seconds=max(1.0, self.ttl / 4), log=log, name="workload-tokens")

    async def reconcile(self, key: str) -> None:
        """The tokens of the attempt at `key` ("": of every attempt), each decided and acted on."""
        accounts: dict[tuple[str, str], dict[str, Any] | None] = {}
        under = key[len(ATTEMPTS):] + "/" if key else ""  # attempts/P/NAME -> P/NAME/
        for index_key, revision, entry in await entries(self.store, under):
            attempt_at = attempt_key(str(entry.get("project")), str(entry.get("attempt")))
            which = (str(entry.get("project")), str(entry.get("serviceAccount")))
            if which not in accounts:
                accounts[which] = await read_account(self.store, *which)
            decision = decide(entry, self.cache.get(attempt_at), accounts[which], self.now(), self.ttl)
            await self._act(index_key, revision, entry, decision)
        if not key:
            await self.forget_dead()

    async def forget_dead(self) -> int:
        """Deletes the records of workload tokens `grace` past their expiry; returns how many."""
        now, n = self.now(), 0
        for rec in (await self.store.list(TOKENS)).records:
            record = orjson.loads(rec.value)
            if not collectable(record, now, self.grace):
                continue
            try:
                await self.store.delete(rec.key, rec.revision)  # a renewal meanwhile (Conflict) keeps it
                n += 1
            except NodusError as e:
                if e.reason not in ("Conflict", "NotFound"):
                    raise
        if n:
            log.info("forgot %d workload token record(s) more than %.0f s past their expiry", n, self.grace)
        return n

    async def _act(self, key: str, revision: int, entry: dict[str, Any], decision: Decision) -> None:
        if decision.verdict is Verdict.REVOKE:
            await revoke(self.identity, self.store, key, entry, decision.why)
        elif decision.verdict is Verdict.RENEW:
            until = await self.identity.extend_token(str(entry["tokenId"]), self.ttl)
            if until is None:  # revoked or removed behind our back: nothing left to renew
                await self.store.delete(key)
                return
            try:
                await self.store.update(key, orjson.dumps({**entry, "expireUnix": until}), revision)
            except NodusError as e:
                if e.reason not in ("Conflict", "NotFound"):
                    raise

__all__ = ["API_SERVER_ENV", "ApiEndpoint", "GRACE_SECONDS", "collectable", "url_for", "Decision", "INDEX", "TOKEN_MOUNT", "TTL_SECONDS", "Verdict",
           "WorkloadTokens", "attach", "decide", "revoke_account", "role_of"]
