"""REST routes over the blob store: Job outputs and attempt logs for customers, Volume revisions.

    GET  /apis/nodus.dev/v1/namespaces/{p}/jobs/{name}/outputs/{output}?index=I[&rank=R]
    GET  /apis/nodus.dev/v1/namespaces/{p}/jobs/{name}/log?index=I[&attempt=N][&follow=true]
    GET  /apis/nodus.dev/v1/namespaces/{p}/jobs/{name}/checkpoints?index=I
    GET  /apis/nodus.dev/v1/namespaces/{p}/jobs/{name}/checkpoints/{seq}?index=I[&rank=R]
    POST /apis/nodus.dev/v1/namespaces/{p}/volumes/{name}/revisions      (body: tar.zst, application/zstd)
    GET  /apis/nodus.dev/v1/namespaces/{p}/volumes/{name}/revisions/{revision}

They sit under the same middleware as every other route (request ids, metav1.Status errors with
docs, fix and requestId) and authorize through the resource service: reading the Job or Volume
needs the viewer role in its project, a push the editor role. The routes name `v1` literally, so
aiohttp's router prefers them to the generic `{plural}/{name}/{sub}` route whatever the order.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import posixpath
import re
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from ..api.attempt import INDEX_LABEL, JOB_LABEL
from ..api.kinds import resolve
from ..blobs import CHUNK, BlobRef, Blobs, check_digest, digest_of_uri
from ..checkpoints import listing
from ..controllers.attempts import phase_of
from ..errors import NodusError
from ..identity import SYSTEM
from ..resources import ResourceService, utc_now
from ..sources import record_upload
from ..volumes import VolumeService, inspect_archive
from ..selectors import parse_field_selector, parse_label_selector
from .params import query_bool

log = logging.getLogger("nodus.gateway")

BLOBS: web.AppKey[Blobs] = web.AppKey("blobs", Blobs)
"""Set by coordinator/main.py; the routes answer 503 without it."""

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD = "application/zstd"
BASE = "/apis/nodus.dev/v1/namespaces/{namespace}"
_IDLE_POLLS_AFTER_END = 3
"""A follower of a finished attempt whose log saw no eof stops after this many quiet polls (5 s each)."""


def add_routes(app: web.Application, gateway: Any) -> None:
    """The hook `make_app` calls."""
    routes = Downloads(gateway)
    r = app.router
    r.add_get(BASE + "/jobs/{name}/outputs/{output}", routes.output)
    r.add_get(BASE + "/jobs/{name}/log", routes.log)
    r.add_get(BASE + "/jobs/{name}/checkpoints", routes.checkpoints)
    r.add_get(BASE + "/jobs/{name}/checkpoints/{seq}", routes.checkpoint_archive)
    r.add_post(BASE + "/volumes/{name}/revisions", routes.push_revision)
    r.add_post(BASE + "/sources", routes.push_source)
    r.add_get(BASE + "/volumes/{name}/revisions/{revision}", routes.revision_archive)


def _int_param(request: web.Request, name: str, default: int | None) -> int | None:
    text = request.query.get(name)
    if text in (None, ""):
        return default
    if not re.fullmatch(r"\d{1,9}", text):
        raise NodusError("BadRequest", f"{name} {text!r} is not a non-negative integer",
                         fix=f"pass ?{name}= a whole number (0 or more)")
    return int(text)


def _bool_param(request: web.Request, name: str) -> bool:
    return query_bool(request.query, name)


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """One satisfiable `bytes=` range as [start, end), else None (the whole content is sent)."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if m.group(1):
        start = int(m.group(1))
        end = min(int(m.group(2)) + 1, size) if m.group(2) else size
    else:
        start, end = max(size - int(m.group(2)), 0), size
    return (start, end) if start < end else None


# -- which attempt's log -----------------------------------------------------------------------------

def attempt_id(obj: dict[str, Any]) -> str:
    """The id the agent sends logs under (Assignment.attempt_id, NODUS_ATTEMPT)."""
    return str((obj.get("spec") or {}).get("id") or obj["metadata"]["name"])


async def find_attempt(service: ResourceService, project: str, job: str, index: int,
                       number: int | None, rank: int | None = None) -> dict[str, Any] | None:
    """The Attempt whose log `…/jobs/JOB/log?index=I[&attempt=N][&rank=R]` serves: number N, else the
    latest; of a gang, rank R (default rank 0).

    Attempts (api/attempt.py) live in the Job's project, labelled `nodus.dev/job` and
    `nodus.dev/index`, numbered by `spec.number` from 1; their log is stored under `spec.id`."""
    page = await service.list(SYSTEM, resolve("attempts"), project,
                              labels=parse_label_selector(f"{JOB_LABEL}={job},{INDEX_LABEL}={index}"),
                              fields=parse_field_selector(None))
    if rank is not None:
        page_items = [a for a in page.items if _rank(a) == rank]
    else:
        page_items = page.items
    # A gang's members share their number (the epoch): rank 0 (the driver) comes last among equals.
    attempts = sorted(page_items, key=lambda a: (listing.attempt_number(a), -_rank(a)))
    if number is not None:
        return next((a for a in reversed(attempts) if listing.attempt_number(a) == number), None)
    return attempts[-1] if attempts else None


def _rank(obj: dict[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("gang") or {}).get("rank") or 0)


def _attempt_gone(service: ResourceService, project: str, attempt: dict[str, Any]) -> Callable[[], Awaitable[bool]]:
    """For a follower: True once the attempt was deleted, or ended and its log stayed quiet a while
    without an eof (an agent that died before sending it)."""
    info = resolve("attempts")
    quiet = 0

    async def gone() -> bool:
        nonlocal quiet
        try:
            current = await service.get(SYSTEM, info, project, attempt["metadata"]["name"])
        except NodusError as e:
            if e.reason == "NotFound":
                return True
            raise
        if phase_of(current).terminal:
            quiet += 1
        return quiet >= _IDLE_POLLS_AFTER_END
    return gone


class Downloads:
    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self.service: ResourceService = gateway.service
        self.volumes = VolumeService(self.service)

    @staticmethod
    def _blobs(request: web.Request) -> Blobs:
        blobs = request.app.get(BLOBS)
        if blobs is None:
            raise NodusError("ServiceUnavailable", "the blob store is not configured on this coordinator")
        return blobs

    async def _stream_blob(self, request: web.Request, blobs: Blobs, ref: BlobRef, filename: str) -> web.StreamResponse:
        """The blob with its digest headers, honouring If-None-Match and one `Range`."""
        etag = f'"{ref.sha256}"'
        first = await blobs.head(ref.sha256, len(ZSTD_MAGIC))
        ctype = ZSTD if first == ZSTD_MAGIC else "application/octet-stream"
        if ctype == ZSTD and not posixpath.splitext(filename)[1]:
            filename += ".tar.zst"  # a directory output, archived by the agent
        rid = request["rid"]
        headers = {
            "X-Request-Id": rid,
            "Audit-Id": rid,
            "Content-Type": ctype,
            "ETag": etag,
            "Digest": "sha-256=" + base64.b64encode(bytes.fromhex(ref.sha256)).decode(),
            "X-Content-SHA256": ref.sha256,
            "Content-Disposition": f'attachment; filename="{filename}"',
            "Accept-Ranges": "bytes",
            "Cache-Control": "private, max-age=0",
        }
        if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
            return web.Response(status=304, headers=headers)
        span = _byte_range(request.headers.get("Range"), ref.size)
        start, end = span or (0, ref.size)
        status = 206 if span else 200
        if span:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{ref.size}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = end - start
        await response.prepare(request)
        if request.method != "HEAD":
            async for data in blobs.read(ref.sha256, start, end):
                await response.write(data)
        await response.write_eof()
        return response

    # -- outputs ----------------------------------------------------------------------------------
    async def output(self, request: web.Request) -> web.StreamResponse:
        request["verb"], request["resource"] = "get", "jobs/outputs"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project, name, output = (request.match_info[k] for k in ("namespace", "name", "output"))
        index = _int_param(request, "index", 0)
        rank = _int_param(request, "rank", None)
        job = await self.service.get(caller, resolve("jobs"), project, name)
        outputs = [o for o in (job.get("status") or {}).get("outputs") or [] if isinstance(o, dict)]
        matches = [o for o in outputs if o.get("name") == output and (o.get("index") or 0) == index]
        if rank is not None:
            matches = [o for o in matches if (o.get("rank") or 0) == rank]
        if not matches:
            have = sorted({f'{o.get("name")} (index {o.get("index") or 0})' for o in outputs})
            raise NodusError(
                "NotFound", f'job "{name}" has no committed output "{output}" for index {index}'
                + (f" and rank {rank}" if rank is not None else "") + " (yet)",
                name=output, kind="jobs/outputs", group="nodus.dev",
                fix=("committed outputs: " + ", ".join(have)) if have else
                f"outputs are committed when an index succeeds; watch it with `nodus watch job {name}`, "
                f"then `nodus outputs get {name} {output} --index {index}`")
        entry = min(matches, key=lambda o: o.get("rank") or 0)
        digest = digest_of_uri(entry["uri"]) if entry.get("uri") else check_digest(str(entry.get("sha256", "")))
        ref = await blobs.stat(digest)
        if ref is None:
            raise NodusError("NotFound", f'the content of output "{output}" of job "{name}" (index {index}) is no '
                             "longer stored", name=output, kind="jobs/outputs", group="nodus.dev",
                             fix="outputs are kept until the Job's ttlSecondsAfterFinished; run the Job again")
        stem = f"{name}-{output}-{index}" + (f"-rank{entry.get('rank')}" if entry.get("rank") else "")
        suffix = posixpath.splitext(posixpath.basename(str(entry.get("path") or "").rstrip("/")))[1]
        if not re.fullmatch(r"\.[A-Za-z0-9_-]{1,16}", suffix):
            suffix = ""  # only a plain extension goes into the Content-Disposition file name
        return await self._stream_blob(request, blobs, ref, stem + suffix)

    # -- checkpoints ------------------------------------------------------------------------------
    async def checkpoints(self, request: web.Request) -> web.Response:
        request["verb"], request["resource"] = "list", "jobs/checkpoints"
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.match_info["name"]
        index = _int_param(request, "index", 0) or 0
        fields = ("seq", "time", "size", "sha256", "uri", "reason", "format", "epoch", "attempt")
        items = []
        for c in await listing.committed(self.service, caller, project, name, index):
            item = {k: c[k] for k in fields if k in c}
            if c.get("parts"):
                item["parts"] = [{k: p[k] for k in ("rank", "size", "sha256", "uri") if k in p} for p in c["parts"]]
            items.append(item)
        return web.Response(body=orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "CheckpointList",
                                               "metadata": {}, "items": items}),
                            content_type="application/json", headers={"X-Request-Id": request["rid"]})

    async def checkpoint_archive(self, request: web.Request) -> web.StreamResponse:
        request["verb"], request["resource"] = "get", "jobs/checkpoints"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.match_info["name"]
        text = request.match_info["seq"]
        if not re.fullmatch(r"\d{1,18}", text):
            raise NodusError("BadRequest", f"checkpoint {text!r} is not a sequence number",
                             fix=f"list them with `nodus checkpoint ls --job {name}`")
        seq, index, rank = int(text), _int_param(request, "index", 0) or 0, _int_param(request, "rank", 0) or 0
        part, nparts = await listing.held_part(self.service, caller, project, name, index, seq, rank)
        uri = str(part.get("uri") or "")
        ref = await blobs.stat(digest_of_uri(uri) if uri else check_digest(str(part.get("sha256", ""))))
        if ref is None:
            raise NodusError("NotFound", f"the archive of checkpoint {seq} of job \"{name}\" is no longer stored",
                             name=str(seq), kind="jobs/checkpoints", group="nodus.dev",
                             fix="it was deleted by retention; a newer checkpoint may be kept")
        stem = f"{name}-{index}-checkpoint-{seq}" + (f"-rank{rank}" if nparts > 1 else "")
        return await self._stream_blob(request, blobs, ref, stem + ".tar.zst")

    # -- logs -------------------------------------------------------------------------------------
    async def log(self, request: web.Request) -> web.StreamResponse:
        request["verb"], request["resource"] = "get", "jobs/log"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.match_info["name"]
        index = _int_param(request, "index", 0)
        number = _int_param(request, "attempt", None)
        follow = _bool_param(request, "follow")
        await self.service.get(caller, resolve("jobs"), project, name)
        rank = _int_param(request, "rank", None)
        attempt = await find_attempt(self.service, project, name, index or 0, number, rank)
        if attempt is None:
            which = f"attempt {number}" if number is not None else "attempt"
            raise NodusError("NotFound", f'job "{name}" has no {which} for index {index} yet',
                             name=name, kind="attempts", group="nodus.dev",
                             fix=f"an index gets an attempt once it is scheduled: `nodus get attempts {name}` lists "
                                 f"them; `nodus logs {name} --index {index} -f` waits for it")
        log_id = attempt_id(attempt)
        rid = request["rid"]
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "X-Nodus-Attempt": log_id, "X-Nodus-Attempt-Number": str(listing.attempt_number(attempt)),
            "X-Request-Id": rid, "Audit-Id": rid})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            if follow:
                async for data in blobs.logs.follow(log_id, 0, stop=_attempt_gone(self.service, project, attempt)):
                    await response.write(data)
            else:
                size = (await blobs.logs.state(log_id)).size
                offset = 0
                while offset < size:
                    data = await blobs.logs.read(log_id, offset, min(CHUNK, size - offset))
                    if not data:
                        break
                    offset += len(data)
                    await response.write(data)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        except NodusError as e:  # the headers are sent: all that is left is to end the stream
            log.warning("log of attempt %s for %s ended early (%s): %s", log_id, rid, e.reason, e.message)
        return response

    # -- volumes ----------------------------------------------------------------------------------
    async def push_revision(self, request: web.Request) -> web.Response:
        request["verb"], request["resource"] = "create", "volumes/revisions"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.match_info["name"]
        info = resolve("volumes")
        self.volumes.authorize_push(caller, project)
        if request.content_type not in (ZSTD, "application/x-zstd"):
            raise NodusError("UnsupportedMediaType", f"a volume revision must be a tar.zst archive, not "
                             f"{request.content_type!r}", fix="send the archive with Content-Type: application/zstd")
        created_volume = await self.volumes.ensure(caller, project, name)
        ref, files = await self._put_archive(request, blobs)
        revision, added = await self.volumes.append_revision(project, name, ref, files)
        body = {"kind": "VolumeRevision", "apiVersion": info.api_version, "volume": name, "namespace": project,
                **revision, "created": added, "volumeCreated": created_volume}
        return web.Response(body=orjson.dumps(body), status=201 if added else 200, content_type="application/json")

    @staticmethod
    async def _put_archive(request: web.Request, blobs: Blobs) -> tuple[BlobRef, int]:
        """Stores the request's tar.zst body (its sha256 checked as it arrives) and counts its files; an
        archive that is not one, or would unpack outside its directory, is refused and not kept."""
        ref, new_blob = await blobs.put(request.content.iter_chunked(CHUNK),
                                        request.headers.get("X-Content-SHA256", ""), request.content_length or 0)
        try:
            async with blobs.local_copy(ref.sha256) as path:
                return ref, await asyncio.to_thread(inspect_archive, path)
        except NodusError:
            if new_blob:
                await blobs.delete(ref.sha256)
            raise

    async def push_source(self, request: web.Request) -> web.Response:
        """`nodus source push DIR`: a tar.zst of the Job's code, kept for the project; spec.source.blob
        names it by the sha256 this answers."""
        request["verb"], request["resource"] = "create", "sources"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project = request.match_info["namespace"]
        self.volumes.authorize_push(caller, project)  # the same rule: the editor role in the project
        if request.content_type not in (ZSTD, "application/x-zstd"):
            raise NodusError("UnsupportedMediaType", f"a source must be a tar.zst archive, not {request.content_type!r}",
                             fix="send the archive with Content-Type: application/zstd (`nodus source push DIR`)")
        ref, files = await self._put_archive(request, blobs)
        created = await record_upload(self.service.store, project, ref.sha256, ref.size, files, utc_now())
        body = {"kind": "Source", "apiVersion": "nodus.dev/v1", "namespace": project, "sha256": f"sha256:{ref.sha256}",
                "size": ref.size, "files": files, "created": created}
        return web.Response(body=orjson.dumps(body), status=201 if created else 200, content_type="application/json")

    async def revision_archive(self, request: web.Request) -> web.StreamResponse:
        request["verb"], request["resource"] = "get", "volumes/revisions"
        blobs = self._blobs(request)
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.match_info["name"]
        text = request.match_info["revision"]
        chosen = await self.volumes.revision(caller, project, name, text)
        ref = await blobs.stat(chosen["sha256"])
        if ref is None:
            raise NodusError("NotFound", f'the content of revision {chosen["revision"]} of volume "{name}" is no '
                             "longer stored", name=name, kind="volumes", group="nodus.dev",
                             fix="push the directory again")
        return await self._stream_blob(request, blobs, ref, f"{name}-r{chosen['revision']}.tar.zst")
