"""A front for the test registry (tests/registry.py) that changes how it answers: Bearer-token auth (the
flow Docker Hub and most hosted registries use, which docker-registry's htpasswd mode does not offer),
or blob answers that start and then stop sending (a stalled link). Everything else is relayed."""
from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

import orjson
import requests

from registry import Registry

TOKEN = "front-token-0123456789"
RELAYED = ("Content-Type", "Docker-Content-Digest")


class Front:
    """`host` serves the upstream registry's repositories. With `bearer` (user, password) every /v2/
    request needs a token from /token, which needs those credentials; with `stall_blobs` a blob answer
    sends its headers and 100 bytes, then nothing until the front stops."""

    def __init__(self, upstream: Registry, bearer: tuple[str, str] | None = None, stall_blobs: bool = False) -> None:
        self.upstream, self.bearer, self.stall_blobs = upstream, bearer, stall_blobs
        self.tokens_issued = 0
        self.blobs_started = 0
        self.release = threading.Event()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                front.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Front:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/token"):
            expected = base64.b64encode(":".join(self.bearer or ("", "")).encode()).decode()
            if h.headers.get("Authorization") != f"Basic {expected}":
                return self._send(h, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            self.tokens_issued += 1
            return self._send(h, 200, orjson.dumps({"token": TOKEN}))
        if self.bearer and h.headers.get("Authorization") != f"Bearer {TOKEN}":
            repo = h.path.removeprefix("/v2/").split("/manifests/")[0].split("/blobs/")[0]
            challenge = f'Bearer realm="http://{self.host}/token",service="front",scope="repository:{repo}:pull"'
            return self._send(h, 401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge})
        if self.stall_blobs and "/blobs/" in h.path:
            self.blobs_started += 1
            h.send_response(200)
            h.send_header("Content-Length", str(1 << 20))
            h.end_headers()
            h.wfile.write(b"x" * 100)
            h.wfile.flush()
            self.release.wait()
            return None
        got = requests.get(f"http://{self.upstream.host}{h.path}", timeout=30,
                           headers={"Accept": h.headers.get("Accept", "*/*")})
        return self._send(h, got.status_code, got.content, {k: got.headers[k] for k in RELAYED if k in got.headers})

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        h.send_response(status)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
