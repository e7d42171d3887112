"""The gRPC transport: ResourceService and ProjectService over the same resource service as REST.

Tokens arrive as `authorization: Bearer …` metadata. Errors become gRPC status codes from the one
error registry, with a google.rpc.Status in the trailers carrying ErrorInfo (reason, fix, docs,
requestId) and BadRequest field violations, so grpcurl prints the reason and the fix.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
import functools
import logging
import time
from datetime import datetime
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import grpc
from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from nodus.v1 import (agent_pb2, blob_pb2, blob_pb2_grpc, gang_pb2, node_pb2, pricebook_pb2, project_pb2,
                                  project_pb2_grpc, resource_pb2, resource_pb2_grpc)

from .api.kinds import resolve
from .audit import AuditEntry, AuditLog, is_write
from .blobs import Blobs
from .clock import Clock, SystemClock, rfc3339
from .errors import NodusError, new_request_id
from .identity import ALL_PROJECTS, Caller, Identity, Role, require_operator
from .metrics import REQUESTS, WATCHERS, observe_request
from .money.books import PriceBooks
from .money.budget_store import Budgets
from .money.budgets import Room
from .money.ledger import ZERO
from .money.credits import Balance, Credits
from .money.ledger_store import Ledger
from .resources import ResourceService
from .selectors import parse_field_selector, parse_label_selector

log = logging.getLogger("nodus.grpc")

SERVICE_NAMES = tuple(
    f.services_by_name[name].full_name
    for f, name in ((resource_pb2.DESCRIPTOR, "ResourceService"), (project_pb2.DESCRIPTOR, "ProjectService"),
                    (agent_pb2.DESCRIPTOR, "AgentService"), (node_pb2.DESCRIPTOR, "NodeService"),
                    (gang_pb2.DESCRIPTOR, "GangService"), (blob_pb2.DESCRIPTOR, "BlobService"),
                    (pricebook_pb2.DESCRIPTOR, "PriceBookService"))
)
BLOB_SERVICE = blob_pb2.DESCRIPTOR.services_by_name["BlobService"].full_name
PRICEBOOK_SERVICE = pricebook_pb2.DESCRIPTOR.services_by_name["PriceBookService"].full_name


def to_struct(obj: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(obj)
    return s


def _ints(value: Any) -> Any:
    """Struct numbers are doubles: give integral ones back their integer type."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def from_struct(s: struct_pb2.Struct) -> dict[str, Any]:
    return _ints(json_format.MessageToDict(s))


def status_for(err: NodusError, rid: str) -> grpc.Status:
    """The gRPC status of an error: its code, an ErrorInfo (reason, fix, docs, request id) and the
    field violations."""
    code = getattr(grpc.StatusCode, err.code.grpc)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain="nodus.dev",
                                       metadata={**{k: str(v) for k, v in err.extra.items()},
                                                 "fix": err.effective_fix, "docs": err.code.docs, "requestId": rid})
    details: list[Any] = [info]
    if err.retry_after:
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=err.retry_after)))
    if err.causes:
        details.append(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=c.field, description=c.message) for c in err.causes]))
    packed = []
    for d in details:
        any_msg = status_pb2.Status().details.add()
        any_msg.Pack(d)
        packed.append(any_msg)
    message = f"{err.reason}: {err.message} (fix: {err.effective_fix}; requestId: {rid})"
    return rpc_status.to_status(status_pb2.Status(code=getattr(code_pb2, code.name), message=message,
                                                  details=packed))


def authorization(context: grpc.aio.ServicerContext) -> str | None:
    """The call's authorization header (the last one sent, as dict() kept it). gRPC gives bytes only
    for `-bin` keys, and a call may carry no metadata at all."""
    value = dict(context.invocation_metadata() or ()).get("authorization")
    return value if isinstance(value, str) else None


async def boundary(verb: str, kind: str, context: grpc.aio.ServicerContext,
                   authenticate: Callable[[], Awaitable[Any]], work: Callable[[Any], Awaitable[Any]],
                   to_status: Callable[[NodusError, str], grpc.Status] = status_for,
                   audit: Callable[[Any, str, str], None] | None = None) -> Any:
    """The server side of every RPC: a request id in the initial metadata, `authenticate()` (its
    result is the caller `work` gets), NodusError → a status with details (`to_status`), anything
    else → INTERNAL and logged; counted and timed per verb, and `audit(caller or None, code, request
    id)` at the end."""
    rid = new_request_id()
    started = time.perf_counter()
    code = "OK"
    caller: Any = None
    try:
        await context.send_initial_metadata((("x-request-id", rid),))
        caller = await authenticate()
        return await work(caller)
    except NodusError as e:
        code = e.code.grpc
        await context.abort_with_status(to_status(e, rid))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the boundary
        if isinstance(e, grpc.aio.AbortError):
            raise
        log.exception("gRPC %s failed (%s)", verb, rid)
        code = "INTERNAL"
        await context.abort_with_status(to_status(NodusError("InternalError", "an internal error occurred"), rid))
    finally:
        observe_request("grpc", verb, kind, code, time.perf_counter() - started)
        if audit is not None:
            audit(caller, code, rid)


def _auditor(log: AuditLog | None, verb: str, request: Any) -> Callable[[Any, str, str], None] | None:
    """What `boundary` records of a write (its names, never its values) in the audit log."""
    if log is None or not is_write(verb):
        return None

    def record(caller: Any, code: str, rid: str) -> None:
        log.record(AuditEntry(rid, "grpc", verb, getattr(request, "kind", "") or type(request).__name__,
                              getattr(request, "project", ""),
                              getattr(request, "name", "") or getattr(request, "id", ""), code,
                              getattr(caller, "token_id", ""), getattr(caller, "subject", "")))
    return record


def rpc(verb: str) -> Callable[..., Any]:
    """A method `fn(self, caller, request, context)` as a handler behind `boundary`, authenticated by
    `self.identity` (a user's or an operator's token); every write is audited (audit.py)."""
    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await boundary(
                verb, getattr(request, "kind", ""), context,
                lambda: self.identity.authenticate(authorization(context)),
                lambda caller: fn(self, caller, request, context),
                audit=_auditor(self.identity.audit, verb, request))
        return handler
    return wrap


class ResourceServicer(resource_pb2_grpc.ResourceServiceServicer):
    def __init__(self, service: ResourceService) -> None:
        self.service = service
        self.identity = service.identity

    @staticmethod
    def _project(request: Any) -> str:
        if not request.project:
            raise NodusError("BadRequest", "project is required", fix='set "project" (for example "default")')
        return request.project

    @rpc("get")
    async def Get(self, caller: Caller, request: Any, context: Any) -> struct_pb2.Struct:
        return to_struct(await self.service.get(caller, resolve(request.kind), self._project(request), request.name))

    @rpc("list")
    async def List(self, caller: Caller, request: Any, context: Any) -> Any:
        page = await self.service.list(
            caller, resolve(request.kind), request.project or None,
            labels=parse_label_selector(request.label_selector), fields=parse_field_selector(request.field_selector),
            limit=int(request.limit), continue_token=request.continue_token, resource_version=request.resource_version)
        return resource_pb2.ListResponse(items=[to_struct(o) for o in page.items],
                                         resource_version=page.resource_version,
                                         continue_token=page.continue_token)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        rid = new_request_id()
        try:
            caller = await self.identity.authenticate(authorization(context))
            info = resolve(request.kind)
            stream = await self.service.watch(
                caller, info, request.project or None, labels=parse_label_selector(request.label_selector),
                fields=parse_field_selector(request.field_selector), resource_version=request.resource_version,
                send_initial_events=request.send_initial_events, allow_bookmarks=request.allow_bookmarks)
        except NodusError as e:
            await context.abort_with_status(status_for(e, rid))
            return
        REQUESTS.labels("grpc", "watch", request.kind, "OK").inc()
        WATCHERS.labels("grpc").inc()
        try:
            async with asyncio.timeout(request.timeout_seconds or None):
                async for ev in stream:
                    yield resource_pb2.WatchEvent(type=ev.type, object=to_struct(ev.object))
        except TimeoutError:
            pass
        except NodusError as e:
            yield resource_pb2.WatchEvent(type="ERROR", object=to_struct(e.to_status(rid)))
        finally:
            WATCHERS.labels("grpc").dec()
            await stream.aclose()

    @rpc("create")
    async def Create(self, caller: Caller, request: Any, context: Any) -> struct_pb2.Struct:
        obj, warnings = await self.service.create(caller, resolve(request.kind), self._project(request),
                                                  from_struct(request.object), dry_run=request.dry_run,
                                                  field_validation=request.field_validation or "Strict")
        self._warn(context, warnings)
        return to_struct(obj)

    @rpc("update")
    async def Update(self, caller: Caller, request: Any, context: Any) -> struct_pb2.Struct:
        obj, warnings = await self.service.replace(caller, resolve(request.kind), self._project(request), request.name,
                                                   from_struct(request.object), subresource=request.subresource,
                                                   dry_run=request.dry_run,
                                                   field_validation=request.field_validation or "Strict")
        self._warn(context, warnings)
        return to_struct(obj)

    @rpc("patch")
    async def Patch(self, caller: Caller, request: Any, context: Any) -> struct_pb2.Struct:
        patch_type = request.patch_type or "merge"
        if patch_type not in ("merge", "json"):
            raise NodusError("BadRequest", f"patch_type {patch_type!r} is not supported", fix='use "merge" or "json"')
        obj, warnings = await self.service.patch(caller, resolve(request.kind), self._project(request), request.name,
                                                 patch_type, request.patch.encode(), subresource=request.subresource,
                                                 dry_run=request.dry_run,
                                                 field_validation=request.field_validation or "Strict")
        self._warn(context, warnings)
        return to_struct(obj)

    @rpc("delete")
    async def Delete(self, caller: Caller, request: Any, context: Any) -> struct_pb2.Struct:
        return to_struct(await self.service.delete(caller, resolve(request.kind), self._project(request), request.name,
                                                   dry_run=request.dry_run, precondition=request.resource_version))

    @staticmethod
    def _warn(context: Any, warnings: tuple[str, ...]) -> None:
        if warnings:
            context.set_trailing_metadata(tuple(("warning", w) for w in warnings))


def _timestamp(text: str) -> timestamp_pb2.Timestamp | None:
    if not text:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(datetime.fromisoformat(text.replace("Z", "+00:00")))
    return ts


def _token(record: dict[str, Any], secret: str = "") -> Any:
    return project_pb2.Token(id=record["id"], subject=record["subject"], project=record["project"],
                             role=record["role"], secret=secret, create_time=_timestamp(record["createTime"]),
                             expire_time=_timestamp(record.get("expireTime", "")),
                             last_use_time=_timestamp(record.get("lastUseTime", "")),
                             revoke_time=_timestamp(record.get("revokeTime", "")))


def _project(doc: dict[str, Any]) -> Any:
    return project_pb2.Project(name=doc["name"], display_name=doc.get("displayName", ""),
                               create_time=_timestamp(doc["createTime"]))


def _credits(balance: Balance) -> Any:
    return project_pb2.Credits(project=balance.project, available_usd=str(balance.available),
                               held_usd=str(balance.held), spent_this_month_usd=str(balance.spent_this_month),
                               month=balance.month, granted_usd=str(balance.granted))


def _budget(room: Room, month: str) -> Any:
    b = room.budget
    return project_pb2.Budget(project=b.project, name=b.name, amount_usd=str(b.amount), selector=dict(b.selector),
                              month=month, used_usd=str(room.used), left_usd=str(room.left))


class ProjectServicer(project_pb2_grpc.ProjectServiceServicer):
    def __init__(self, identity: Identity, credits: Credits, clock: Clock) -> None:
        self.identity, self.credits, self.clock = identity, credits, clock
        self.budgets = Budgets(credits.ledger.store, credits.ledger)

    @staticmethod
    def _require(caller: Caller, project: str, what: str) -> None:
        if not (caller.project == ALL_PROJECTS and caller.role >= Role.ADMIN) and not (
                project != ALL_PROJECTS and caller.can(project, Role.ADMIN)):
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot {what} in project "{project}"',
                             fix="use an admin token (the one in DATA_DIR/kubeconfig administers every project)")

    @rpc("createproject")
    async def CreateProject(self, caller: Caller, request: Any, context: Any) -> Any:
        self._require(caller, ALL_PROJECTS, "create projects")
        return _project(await self.identity.create_project(request.name, request.display_name))

    @rpc("listprojects")
    async def ListProjects(self, caller: Caller, request: Any, context: Any) -> Any:
        projects = [p for p in await self.identity.list_projects() if caller.can(p["name"], Role.VIEWER)]
        return project_pb2.ListProjectsResponse(projects=[_project(p) for p in projects])

    @rpc("createtoken")
    async def CreateToken(self, caller: Caller, request: Any, context: Any) -> Any:
        if not request.project:
            raise NodusError("BadRequest", "project is required", fix='set "project", or "*" for every project')
        if request.ttl_seconds < 0:
            raise NodusError("BadRequest", "ttl_seconds must not be negative")
        self._require(caller, request.project, "create tokens")
        secret, record = await self.identity.create_token(request.project, Role.parse(request.role or "viewer"),
                                                          request.subject, int(request.ttl_seconds))
        return _token(record, secret)

    @rpc("listtokens")
    async def ListTokens(self, caller: Caller, request: Any, context: Any) -> Any:
        project = request.project or caller.project
        self._require(caller, project, "list tokens")
        tokens = await self.identity.list_tokens(None if project == ALL_PROJECTS and request.project == "" else project,
                                                 revoked=request.include_revoked)
        return project_pb2.ListTokensResponse(tokens=[_token(t) for t in tokens])

    @rpc("revoketoken")
    async def RevokeToken(self, caller: Caller, request: Any, context: Any) -> Any:
        record = await self.identity.get_token(request.id)
        if record is None:
            raise NodusError("NotFound", f'token "{request.id}" not found', name=request.id, kind="tokens")
        self._require(caller, record["project"], "revoke tokens")
        return _token(await self.identity.revoke_token(request.id))

    @rpc("grantcredits")
    async def GrantCredits(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)  # credits are money: a project's own admin cannot mint them
        if not request.project:
            raise NodusError("BadRequest", "project is required", fix='set "project" to the project to credit')
        await self.identity.require_project(request.project)
        now = rfc3339(self.clock.now())
        posting, granted = await self.credits.grant(request.project, request.amount_usd, request.request_id, now,
                                                    note=request.note)
        log.info("credits %s: %s USD to project %s (request %s, by %s)", "granted" if granted else "already granted",
                 posting.amount, request.project, request.request_id, caller.subject)
        return project_pb2.GrantCreditsResponse(credits=_credits(await self.credits.balance(request.project, now)),
                                                granted=granted, seq=posting.seq, book_time=_timestamp(posting.time))

    @rpc("getcredits")
    async def GetCredits(self, caller: Caller, request: Any, context: Any) -> Any:
        project = request.project or caller.project
        if project == ALL_PROJECTS or not caller.can(project, Role.VIEWER):
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot read the credits of project "{project}"',
                             fix="name a project your token belongs to (GetCreditsRequest.project)")
        await self.identity.require_project(project)
        month = rfc3339(self.clock.now())[:7]
        reply = _credits(await self.credits.balance(project, rfc3339(self.clock.now())))
        reply.budgets.extend(_budget(r, month) for r in await self.budgets.report(project, month))
        return reply

    @rpc("setbudget")
    async def SetBudget(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)  # a budget limits money, as a grant adds it
        await self.identity.require_project(request.project)
        budget = await self.budgets.set(request.project, request.name, request.amount_usd, dict(request.selector))
        log.info("budget %s of project %s set to %s USD (by %s)", budget.name, budget.project, budget.amount,
                 caller.subject)
        month = rfc3339(self.clock.now())[:7]
        return next(_budget(r, month) for r in await self.budgets.report(request.project, month)
                    if r.budget.name == budget.name)

    @rpc("deletebudget")
    async def DeleteBudget(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        budget = await self.budgets.delete(request.project, request.name)
        return _budget(Room(budget, ZERO), rfc3339(self.clock.now())[:7])

    @rpc("listbudgets")
    async def ListBudgets(self, caller: Caller, request: Any, context: Any) -> Any:
        project = request.project or ("" if caller.project == ALL_PROJECTS else caller.project)
        if not (caller.project == ALL_PROJECTS and caller.role >= Role.ADMIN) and not (
                project and caller.can(project, Role.VIEWER)):
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot read the budgets of project "{project}"',
                             fix="name a project your token belongs to (ListBudgetsRequest.project)")
        month = rfc3339(self.clock.now())[:7]
        return project_pb2.ListBudgetsResponse(budgets=[_budget(r, month) for r in await self.budgets.report(project, month)])


AGENT_SERVICE, NODE_SERVICE, GANG_SERVICE = SERVICE_NAMES[2], SERVICE_NAMES[3], SERVICE_NAMES[4]


@dataclass(frozen=True, slots=True)
class GrpcServer:
    """A started gRPC server with its health service; each coordinator owns its own."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    served: tuple[str, ...]
    """Health names marked SERVING by `set_serving`: the built-in services and those registered by `start`."""
    agent_port: int = 0
    """The agents' mTLS port (0: none, a --grpc-insecure coordinator)."""

    def set_serving(self) -> None:
        loop = asyncio.get_running_loop()
        for name in self.served:
            loop.create_task(self.health.set(name, health_pb2.HealthCheckResponse.SERVING))


async def start(service: ResourceService, listen: str, blobs: Blobs | None = None,
                servicers: Sequence[tuple[str, Callable[[grpc.aio.Server], None]]] = (),
                clock: Clock = SystemClock(), credentials: grpc.ServerCredentials | None = None,
                agent_port: tuple[str, grpc.ServerCredentials] | None = None,
                node_peer: Callable[[grpc.aio.ServicerContext], Awaitable[Any]] | None = None,
                scope: Any = None) -> GrpcServer:
    """Starts the server (health NOT_SERVING until `set_serving`): TLS with `credentials`, plaintext
    without (main.py allows that on loopback only, --grpc-insecure).

    `servicers` are (full service name, function that adds it to the server), for the services built
    outside this module (AgentService, NodeService). `agent_port` is (listen address, mTLS
    credentials) of the agents' port, served by the same server; `node_peer` names the node of a
    call's client certificate, and `scope` (node_scope.NodeScope) narrows BlobService to the blobs of
    that node's attempts (None: --grpc-insecure, where the join token reaches every blob)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)])
    resource_pb2_grpc.add_ResourceServiceServicer_to_server(ResourceServicer(service), server)
    project_pb2_grpc.add_ProjectServiceServicer_to_server(ProjectServicer(
        service.identity, Credits(Ledger(service.store)), clock), server)
    for _, add in servicers:
        add(server)
    if blobs is not None:
        from .blob_api import BlobServicer  # it imports this module's error translation
        blob_pb2_grpc.add_BlobServiceServicer_to_server(BlobServicer(blobs, service.identity, node_peer, scope),
                                                      server)
    from .pricebook_api import add_to_server as add_pricebook_service  # it imports this module's `rpc`
    add_pricebook_service(server, PriceBooks(service.store), service.identity, clock)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    reflection.enable_server_reflection(SERVICE_NAMES + (health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                                         reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(listen) if credentials is None else server.add_secure_port(listen, credentials)
    if port == 0:
        raise SystemExit(f"--grpc-listen {listen}: cannot bind")
    bound_agent_port = 0
    if agent_port is not None:
        bound_agent_port = server.add_secure_port(*agent_port)
        if bound_agent_port == 0:
            raise SystemExit(f"--agent-listen {agent_port[0]}: cannot bind")
    for name in ("",) + SERVICE_NAMES:
        await checks.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    served = ("",) + SERVICE_NAMES[:2] + (BLOB_SERVICE, PRICEBOOK_SERVICE) + tuple(name for name, _ in servicers)
    return GrpcServer(server, port, checks, served, bound_agent_port)
