"""A graceful stop is never held by a REST watch, whatever it was doing when the stop began.

The gateway runs in-process here (aiohttp's test server) over a service whose authentication and
watch the test controls, so the race that once held a stop for the server's whole shutdown timeout
(a watch still authenticating when on_shutdown ended the open watches) is driven step by step
instead of hoped for under load.
"""
from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from nodus.coordinator.gateway.app import make_app

WATCH = "/apis/nodus.dev/v1/namespaces/default/jobs?watch=true"


class Identity:
    """Authentication that waits until the test lets it finish, and says when it has begun."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def authenticate(self, header: str | None) -> object:
        self.entered.set()
        await self.release.wait()
        return object()


class Service:
    """The two things a watch asks of the resource service; the stream sends nothing until cancelled."""

    def __init__(self) -> None:
        self.identity = Identity()
        self.streaming = asyncio.Event()

    async def watch(self, *args: Any, **kwargs: Any) -> Stream:
        return Stream(self.streaming)


class Stream:
    """A watch stream (watches.WatchStream's interface) whose first batch never comes."""

    def __init__(self, streaming: asyncio.Event) -> None:
        self.streaming = streaming

    async def next_batch(self) -> list[Any]:
        self.streaming.set()
        await asyncio.Event().wait()
        return []  # never reached: the watch waits until it is ended

    async def aclose(self) -> None:
        pass


async def _with_client(test: Any) -> None:
    service = Service()
    app, gateway = make_app(service)  # type: ignore[arg-type]
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await asyncio.wait_for(test(client, service, gateway, app), 30)
    finally:
        await client.close()


def test_a_watch_still_authenticating_when_the_stop_begins_is_refused_with_service_unavailable() -> None:
    async def test(client: TestClient, service: Service, gateway: Any, app: Any) -> None:
        request = asyncio.create_task(client.get(WATCH))
        await service.identity.entered.wait()
        await gateway.close_watches(app)  # what on_shutdown runs
        service.identity.release.set()
        response = await request
        body = await response.json()
        assert response.status == 503, body
        assert body["kind"] == "Status" and body["reason"] == "ServiceUnavailable", body
        assert "watch again" in body["message"], body
        assert not service.streaming.is_set(), "the refused watch must not open a stream"

    asyncio.run(_with_client(test))


def test_an_open_watch_is_ended_when_the_stop_begins() -> None:
    async def test(client: TestClient, service: Service, gateway: Any, app: Any) -> None:
        service.identity.release.set()
        response = await client.get(WATCH)
        assert response.status == 200
        await service.streaming.wait()
        await gateway.close_watches(app)
        # The stream ends (a client re-watches from its last resourceVersion) instead of staying open.
        assert await response.content.read() == b""

    asyncio.run(_with_client(test))
