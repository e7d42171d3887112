"""The REST gateway (aiohttp): Kubernetes paths, verbs and errors over the resource service.

Every answer carries `X-Request-Id` (and `Audit-Id`, the header kubectl shows at -v=8); every error
is a metav1.Status with `docs`, `fix` and `requestId`.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..api.core import resolve_core
from ..api.kinds import KindInfo, resolve
from ..errors import NodusError, new_request_id
from ..audit import AuditEntry
from ..identity import Caller, Role
from ..money import quote
from ..metrics import REGISTRY, STORE_COMPACTED, STORE_REVISION, WATCHERS, observe_request
from ..resources import ResourceService
from ..watches import WatchEvent
from ..selectors import parse_field_selector, parse_label_selector
from . import discovery, downloads, images, tables
from .params import query_bool

log = logging.getLogger("nodus.gateway")

MAX_BODY = 3 * 1024 * 1024
JSON = "application/json"
_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
}
_FIELD_VALIDATION = ("Strict", "Warn", "Ignore")
_WRITES = frozenset(("POST", "PUT", "PATCH", "DELETE"))
SERVICE: web.AppKey[ResourceService] = web.AppKey("service", ResourceService)


def _header_text(text: str) -> str:
    """A warning as header-safe text: field names are customer input: quotes escaped, controls and non-ASCII as \\x escapes."""
    safe = text.encode("ascii", "backslashreplace").decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
    return "".join(ch if 32 <= ord(ch) < 127 else "\\x%02x" % ord(ch) for ch in safe)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON, headers=headers)


def status_response(err: NodusError, rid: str) -> web.Response:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
    return _json(err.to_status(rid), err.code.http, headers)


@web.middleware
async def _middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    rid = request.headers.get("X-Request-Id") or new_request_id()
    request["rid"] = rid
    started = time.perf_counter()
    verb = request.get("verb", request.method.lower())
    try:
        response = await handler(request)
    except NodusError as e:
        response = status_response(e, rid)
    except web.HTTPRequestEntityTooLarge:
        response = status_response(NodusError("RequestEntityTooLarge", "the request body is larger than 3 MiB"), rid)
    except web.HTTPNotFound:
        response = status_response(NodusError("NotFound", "the server could not find the requested resource",
                                              fix="check the path; `kubectl api-resources` lists what is served"), rid)
    except web.HTTPMethodNotAllowed as e:
        response = status_response(NodusError("MethodNotAllowed", f"{request.method} is not allowed here",
                                              fix="use one of " + ", ".join(sorted(e.allowed_methods))), rid)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:  # noqa: BLE001 - the boundary: log it, answer a Status
        log.exception("request %s %s %s failed", rid, request.method, request.path)
        response = status_response(NodusError("InternalError", "an internal error occurred"), rid)
    if not response.prepared:
        response.headers["X-Request-Id"] = rid
        response.headers["Audit-Id"] = rid
    verb = request.get("verb", verb)
    resource = request.get("resource", "")
    if request.method in _WRITES:
        _audit(request, verb, resource, response.status, rid)
    observe_request("rest", verb, resource, str(response.status), time.perf_counter() - started)
    # Every request is logged with its id; errors at INFO so support can find a customer's requestId.
    log.log(logging.INFO if response.status >= 400 else logging.DEBUG, "%s %s %s -> %s", rid,
            request.method, request.path_qs, response.status)
    return response


def _audit(request: web.Request, verb: str, resource: str, status: int, rid: str) -> None:
    """A write's line in the audit log (audit.py): who, what, the outcome; never its body."""
    log_ = request.app[SERVICE].identity.audit
    if log_ is None:
        return
    caller: Caller | None = request.get("caller")
    log_.record(AuditEntry(rid, "rest", verb, resource or request.path, request.match_info.get("namespace", ""),
                           request.match_info.get("name", "") or request.get("name", ""), str(status),
                           caller.token_id if caller else "", caller.subject if caller else ""))


class Gateway:
    def __init__(self, service: ResourceService) -> None:
        self.service = service
        self._sign: quote.Signer | None = None
        """A dry run's ETag is keyed (money/quote.py); the signer is made on the first one."""
        self.openapi = discovery.build_openapi()
        self.ready = False
        self.replica: Callable[[], Awaitable[dict[str, Any]]] | None = None
        """This replica's role, lease epoch and watch lag (main.py wires the control plane's)."""
        self._watches: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def close_watches(self, app: web.Application) -> None:
        """on_shutdown: open watches would hold a graceful stop for up to an hour; end them now
        (clients re-watch from their last resourceVersion, as they do after any disconnect)."""
        self._closing = True
        for task in list(self._watches):
            task.cancel()

    # -- helpers ----------------------------------------------------------------------------------
    async def caller(self, request: web.Request) -> Caller:
        """Who sent `request` (its bearer token authenticated, within its rate limit); the routes of
        downloads and images ask too. The audit log names the caller (the middleware's _audit)."""
        caller = await self.service.identity.authenticate(request.headers.get("Authorization"))
        request["caller"] = caller
        return caller

    @staticmethod
    def _info(request: web.Request) -> KindInfo:
        version = request.match_info["version"]
        core = request.path.startswith("/api/")  # the core group: Events only
        try:
            info = resolve_core(request.match_info["plural"]) if core else resolve(request.match_info["plural"])
        except NodusError:
            raise web.HTTPNotFound() from None
        if info.version != version or info.plural != request.match_info["plural"]:
            raise web.HTTPNotFound()
        request["resource"] = info.plural
        return info

    @staticmethod
    def _dry_run(request: web.Request) -> bool:
        values = request.query.getall("dryRun", [])
        for v in values:
            if v != "All":
                raise NodusError("BadRequest", f"dryRun {v!r} is not supported", fix="use dryRun=All")
        return bool(values)

    def _etag(self, obj: dict[str, Any]) -> str:
        """A dry run's ETag: with an estimate (a Job), the estimate of this exact spec that a create
        sent with If-Match is bound to (money/quote.py); otherwise the spec's hash."""
        estimate = (obj.get("status") or {}).get("estimate")
        if estimate is not None:
            if self._sign is None:
                self._sign = self.service.vault.signer(quote.ETAG_PURPOSE)
            return quote.etag(obj.get("spec"), estimate, self._sign)
        return '"' + hashlib.sha256(orjson.dumps(obj.get("spec"), option=orjson.OPT_SORT_KEYS)).hexdigest()[:32] + '"'

    @staticmethod
    def _field_validation(request: web.Request) -> str:
        value = request.query.get("fieldValidation", "Strict") or "Strict"
        if value not in _FIELD_VALIDATION:
            raise NodusError("BadRequest", f"fieldValidation {value!r} is not supported",
                             fix="use fieldValidation=Strict, Warn or Ignore")
        return value

    @staticmethod
    async def _body(request: web.Request) -> Any:
        # A body sent with no Content-Type at all is read as JSON, as the Kubernetes API server does
        # (the official Python client's CustomObjectsApi sends its create and replace bodies so).
        ctype = request.content_type if "Content-Type" in request.headers else JSON
        raw = await request.read()
        if ctype not in (JSON, "", "application/yaml"):
            raise NodusError("UnsupportedMediaType", f"the body's content type {ctype!r} is not supported",
                             fix="send application/json")
        if ctype == "application/yaml":
            import yaml
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise NodusError("BadRequest", f"the body is not valid YAML: {e}") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise NodusError("BadRequest", f"the body is not valid JSON: {e}",
                             fix="send a JSON object with apiVersion, kind, metadata and spec") from None

    @staticmethod
    def _respond(request: web.Request, info: KindInfo, obj: dict[str, Any], status: int = 200,
                 warnings: tuple[str, ...] = ()) -> web.Response:
        headers = {}
        if warnings:
            headers["Warning"] = ", ".join('299 - "' + _header_text(w) + '"' for w in warnings)
        if tables.wants_table(request.headers.get("Accept", "")):
            return _json(tables.table(info, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")}),
                         status, headers)
        return _json(obj, status, headers)

    # -- non-resource paths -----------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        """"ok" once serving; `?verbose` (as kube-apiserver's) adds whether this replica leads the
        controllers or follows, the lease epoch it last saw, and how far its watches lag the store."""
        if not self.ready:
            return web.Response(text="not ready", status=503)
        if "verbose" not in request.query or self.replica is None:
            return web.Response(text="ok")
        status = await self.replica()
        lines = [f"{key}: {value}" for key, value in status.items()]
        return web.Response(text="\n".join(["[+]ping ok", *lines, "readyz check passed"]) + "\n")

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text for an operator token or a `metrics` one (docs/adr/0046-tokens-rate-limits-audit.md)."""
        caller = await self.caller(request)
        if not (caller.is_operator or caller.role == Role.METRICS):
            raise NodusError("Forbidden", f'User "{caller.subject}" cannot read /metrics',
                             fix="scrape with a metrics token (`nodus token create --project '*' --role metrics`) "
                                 "or an operator's (DATA_DIR/kubeconfig)")
        if self.replica is not None:
            await self.replica()  # refreshes the watch lag gauge
        STORE_REVISION.set(self.service.store.revision)
        STORE_COMPACTED.set(self.service.store.compacted_revision)
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def version(self, request: web.Request) -> web.Response:
        return _json(discovery.SERVER_VERSION)

    async def api(self, request: web.Request) -> web.Response:
        await self.caller(request)
        return _json(discovery.api_versions())

    async def core_version(self, request: web.Request) -> web.Response:
        await self.caller(request)
        return _json(discovery.core_resource_list())

    async def apis(self, request: web.Request) -> web.Response:
        await self.caller(request)
        return _json(discovery.api_group_list())

    async def group(self, request: web.Request) -> web.Response:
        await self.caller(request)
        return _json(discovery.api_group())

    async def group_version(self, request: web.Request) -> web.Response:
        await self.caller(request)
        body = discovery.api_resource_list(request.match_info["version"])
        if body is None:
            raise web.HTTPNotFound()
        return _json(body)

    async def openapi_index(self, request: web.Request) -> web.Response:
        await self.caller(request)
        return _json(discovery.openapi_index(self.openapi), headers={"Cache-Control": "no-cache, private"})

    async def openapi_doc(self, request: web.Request) -> web.StreamResponse:
        await self.caller(request)
        doc = self.openapi.get(request.match_info["version"])
        if doc is None:
            raise web.HTTPNotFound()
        etag = f'"{doc.etag}"'
        cache = "public, immutable, max-age=31536000" if request.query.get("hash") == doc.etag else "no-cache, private"
        headers = {"ETag": etag, "Cache-Control": cache}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=doc.body, content_type=JSON, headers=headers)

    # -- collections ------------------------------------------------------------------------------
    async def collection(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        info = self._info(request)
        project = request.match_info.get("namespace")
        caller = await self.caller(request)
        q = request.query
        if request.method == "POST":
            request["verb"] = "create"
            if project is None:
                raise web.HTTPMethodNotAllowed("POST", ["GET"])
            body = await self._body(request)
            dry_run = self._dry_run(request)
            obj, warnings = await self.service.create(caller, info, project, body, dry_run=dry_run,
                                                      field_validation=self._field_validation(request),
                                                      if_match=request.headers.get("If-Match", ""),
                                                      owned=True)  # the body parsed above, nobody else's
            request["name"] = obj["metadata"].get("name", "")  # the audit log's, for a generateName
            response = self._respond(request, info, obj, 201, warnings)
            if dry_run:
                response.headers["ETag"] = self._etag(obj)
            return response
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), info.fields)
        if query_bool(q, "watch"):
            request["verb"] = "watch"
            return await self._watch(request, caller, info, project, labels, fields)
        request["verb"] = "list"
        limit = q.get("limit", "0")
        if not limit.isdigit():
            raise NodusError("BadRequest", f"limit {limit!r} is not a non-negative integer")
        page = await self.service.list(caller, info, project, labels=labels, fields=fields, limit=int(limit),
                                       continue_token=q.get("continue", ""),
                                       resource_version=q.get("resourceVersion", ""),
                                       resource_version_match=q.get("resourceVersionMatch", ""))
        list_meta: dict[str, Any] = {"resourceVersion": page.resource_version}
        if page.continue_token:
            list_meta["continue"] = page.continue_token
        if tables.wants_table(request.headers.get("Accept", "")):
            return _json(tables.table(info, page.items, list_meta))
        return _json({"kind": f"{info.kind}List", "apiVersion": info.api_version, "metadata": list_meta,
                      "items": page.items})

    async def _watch(self, request: web.Request, caller: Caller, info: KindInfo, project: str | None,
                     labels: Any, fields: Any) -> web.StreamResponse:
        q = request.query
        timeout_text = q.get("timeoutSeconds", "")
        if timeout_text and not timeout_text.isdigit():
            raise NodusError("BadRequest", f"timeoutSeconds {timeout_text!r} is not a non-negative integer")
        # Like kube-apiserver: an unbounded watch ends after 30-60 minutes so clients spread their re-lists.
        timeout = int(timeout_text) if timeout_text else random.randint(1800, 3600)
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        rid = request["rid"]
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON, "X-Request-Id": rid,
                                                           "Audit-Id": rid, "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        # Registered before the first await: a watch still opening when close_watches runs is ended
        # too (it used to slip past and hold a graceful stop until the server's shutdown timeout).
        task = asyncio.current_task()
        if self._closing or task is None:
            raise NodusError("ServiceUnavailable", "the coordinator is stopping; watch again",
                             fix="watch again from your last resourceVersion once it is back")
        self._watches.add(task)
        try:
            return await self._stream_watch(request, response, caller, info, project, labels, fields, q, rid,
                                            timeout, as_table)
        except asyncio.CancelledError:
            if not self._closing or not response.prepared:
                raise
            # Ended by close_watches: finish the chunked stream, so the client sees the watch end (and
            # re-watches) rather than a broken transfer.
            task.uncancel()
            return response
        finally:
            self._watches.discard(task)

    async def _stream_watch(self, request: web.Request, response: web.StreamResponse, caller: Caller,
                            info: KindInfo, project: str | None, labels: Any, fields: Any, q: Any, rid: str,
                            timeout: float | None, as_table: bool) -> web.StreamResponse:
        error: NodusError | None = None
        stream = None
        try:
            stream = await self.service.watch(
                caller, info, project, labels=labels, fields=fields,
                resource_version=q.get("resourceVersion", ""),
                send_initial_events=query_bool(q, "sendInitialEvents"),
                allow_bookmarks=query_bool(q, "allowWatchBookmarks"))
        except NodusError as e:
            if e.reason != "Expired":
                raise
            error = e
        await response.prepare(request)
        WATCHERS.labels("rest").inc()
        try:
            if error is not None:
                await response.write(orjson.dumps({"type": "ERROR", "object": error.to_status(rid)}) + b"\n")
                return response
            assert stream is not None
            try:
                async with asyncio.timeout(timeout):
                    while True:  # what piled up while the last write waited goes out in one write
                        try:
                            batch = await stream.next_batch()
                        except StopAsyncIteration:
                            break
                        await response.write(b"".join(self._table_line(info, ev) if as_table
                                                      else stream.json_line(ev) for ev in batch))
            except TimeoutError:
                pass
            except NodusError as e:
                await response.write(orjson.dumps({"type": "ERROR", "object": e.to_status(rid)}) + b"\n")
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            WATCHERS.labels("rest").dec()
            if stream is not None:
                await stream.aclose()
        return response

    @staticmethod
    def _table_line(info: KindInfo, ev: WatchEvent) -> bytes:
        """`ev` with its object as a one-row Table (kubectl get -w)."""
        obj = ev.object
        if ev.type != "BOOKMARK":
            obj = tables.table(info, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")})
        return orjson.dumps({"type": ev.type, "object": obj}) + b"\n"

    # -- objects ----------------------------------------------------------------------------------
    async def item(self, request: web.Request) -> web.StreamResponse:
        info = self._info(request)
        project = request.match_info["namespace"]
        name = request.match_info["name"]
        sub = request.match_info.get("sub", "")
        if sub and (sub != "status" or not info.has_status):
            raise web.HTTPNotFound()
        caller = await self.caller(request)
        method = request.method
        if method == "GET":
            request["verb"] = "get"
            return self._respond(request, info, await self.service.get(caller, info, project, name))
        if method == "PUT":
            request["verb"] = "update"
            obj, warnings = await self.service.replace(
                caller, info, project, name, await self._body(request), subresource=sub,
                dry_run=self._dry_run(request), field_validation=self._field_validation(request))
            return self._respond(request, info, obj, 200, warnings)
        if method == "PATCH":
            request["verb"] = "patch"
            patch_type = _PATCH_TYPES.get(request.content_type)
            if patch_type is None:
                raise NodusError(
                    "UnsupportedMediaType",
                    f"the patch content type {request.content_type!r} is not supported for {info.resource}",
                    fix="use a merge patch (kubectl patch --type merge) or a JSON patch (--type json)")
            obj, warnings = await self.service.patch(
                caller, info, project, name, patch_type, await request.read(), subresource=sub,
                dry_run=self._dry_run(request), field_validation=self._field_validation(request))
            return self._respond(request, info, obj, 200, warnings)
        if method == "DELETE":
            request["verb"] = "delete"
            if sub:
                raise web.HTTPMethodNotAllowed("DELETE", ["GET", "PUT", "PATCH"])
            options: dict[str, Any] = {}
            raw = await request.read()
            if raw.strip():
                try:
                    options = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise NodusError("BadRequest", "the DeleteOptions body is not valid JSON") from None
                if not isinstance(options, dict) or not isinstance(options.get("preconditions") or {}, dict):
                    raise NodusError("BadRequest", "the DELETE body must be a DeleteOptions object",
                                     fix='send {"propagationPolicy": "Background"} or no body')
            dry = options.get("dryRun") or []
            if not isinstance(dry, list) or any(v != "All" for v in dry):
                raise NodusError("BadRequest", "DeleteOptions.dryRun must be a list holding only \"All\"")
            dry_run = self._dry_run(request) or bool(dry)
            precondition = str(((options.get("preconditions") or {}).get("resourceVersion")) or "")
            obj = await self.service.delete(caller, info, project, name, dry_run=dry_run, precondition=precondition)
            return self._respond(request, info, obj, 200)
        raise web.HTTPMethodNotAllowed(method, ["GET", "PUT", "PATCH", "DELETE"])


def make_app(service: ResourceService) -> tuple[web.Application, Gateway]:
    gateway = Gateway(service)
    app = web.Application(middlewares=[_middleware], client_max_size=MAX_BODY)
    app[SERVICE] = service
    app.on_shutdown.append(gateway.close_watches)
    r = app.router
    r.add_get("/healthz", gateway.healthz)
    r.add_get("/livez", gateway.healthz)
    r.add_get("/readyz", gateway.readyz)
    r.add_get("/metrics", gateway.metrics)
    r.add_get("/version", gateway.version)
    r.add_get("/api", gateway.api)
    r.add_get("/apis", gateway.apis)
    r.add_get("/apis/nodus.dev", gateway.group)
    r.add_get("/apis/nodus.dev/{version}", gateway.group_version)
    r.add_get("/openapi/v3", gateway.openapi_index)
    r.add_get("/openapi/v3/apis/nodus.dev/{version}", gateway.openapi_doc)
    downloads.add_routes(app, gateway)  # outputs, logs and volume revisions over the blob store
    images.add_routes(app, gateway)  # nodus image push / ls
    base = "/apis/nodus.dev/{version}"
    r.add_route("*", base + "/namespaces/{namespace}/{plural}", gateway.collection)
    r.add_route("*", base + "/namespaces/{namespace}/{plural}/{name}", gateway.item)
    r.add_route("*", base + "/namespaces/{namespace}/{plural}/{name}/{sub}", gateway.item)
    r.add_route("*", base + "/{plural}", gateway.collection)
    r.add_get("/api/v1", gateway.core_version)
    core = "/api/{version:v1}"  # Events, read-only (api/core.py)
    r.add_route("*", core + "/namespaces/{namespace}/{plural}", gateway.collection)
    r.add_route("*", core + "/namespaces/{namespace}/{plural}/{name}", gateway.item)
    r.add_route("*", core + "/{plural}", gateway.collection)
    return app, gateway
