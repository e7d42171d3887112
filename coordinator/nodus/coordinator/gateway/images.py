"""REST routes of `nodus image push` and `nodus image ls` over image_push.ImagePushService:

    POST /apis/nodus.dev/v1/namespaces/{p}/images?name=NAME[:TAG]   (body: a tar, application/x-tar)
    POST /apis/nodus.dev/v1/namespaces/{p}/images?name=…&dryRun=All (no body: would the push be refused?)
    GET  /apis/nodus.dev/v1/namespaces/{p}/images

REST rather than a gRPC stream, as `nodus volume push` is: the customer CLI speaks REST over the
gateway's TLS with the kubeconfig's token, and an upload streams as one request body. The routes only
move bytes and JSON; the service decides (docs/adr/0032-image-push.md).
"""
from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..errors import NodusError
from ..image_push import ImagePushService

IMAGES: web.AppKey[ImagePushService] = web.AppKey("images", ImagePushService)
"""Set by coordinator/main.py; without it the routes answer 503 naming the missing registry."""

BASE = "/apis/nodus.dev/v1/namespaces/{namespace}/images"
TAR_TYPES = ("application/x-tar", "application/tar", "application/octet-stream")
CHUNK = 1 << 20


def add_routes(app: web.Application, gateway: Any) -> None:
    """The hook `make_app` calls (before the generic routes, which would otherwise take the path)."""
    routes = ImageRoutes(gateway)
    app.router.add_post(BASE, routes.push)
    app.router.add_get(BASE, routes.list)


class ImageRoutes:
    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    @staticmethod
    def _service(request: web.Request) -> ImagePushService:
        service = request.app.get(IMAGES)
        if service is None:
            raise NodusError("ServiceUnavailable", "this coordinator serves no image pushes",
                             fix="ask the operator to start the coordinator with --image-registry HOST:PORT[/PREFIX]")
        return service

    async def push(self, request: web.Request) -> web.Response:
        request["verb"], request["resource"] = "create", "images"
        service = self._service(request)
        caller = await self.gateway.caller(request)
        project, name = request.match_info["namespace"], request.query.get("name", "")
        if request.query.get("dryRun") == "All":  # the CLI's check before it uploads
            service.check(caller, project, name)
            return web.Response(body=orjson.dumps({"kind": "ImagePush", "apiVersion": "nodus.dev/v1",
                                                   "dryRun": True}), content_type="application/json")
        if request.content_type not in TAR_TYPES:
            raise NodusError("UnsupportedMediaType", f"an image push is a tar archive, not {request.content_type!r}",
                             fix="send it with Content-Type: application/x-tar (`nodus image push DIR|FILE`)")
        pushed = await service.push(caller, project, name, request.content.iter_chunked(CHUNK))
        return web.Response(body=orjson.dumps(pushed.as_json()), status=201, content_type="application/json")

    async def list(self, request: web.Request) -> web.Response:
        request["verb"], request["resource"] = "list", "images"
        service = self._service(request)
        caller = await self.gateway.caller(request)
        items = await service.list(caller, request.match_info["namespace"])
        return web.Response(body=orjson.dumps({"kind": "ImageList", "apiVersion": "nodus.dev/v1", "items": items}),
                            content_type="application/json")
