"""A private git repository through a Git Connection, end to end: `git http-backend` behind a small HTTPS
server with basic auth (started here, its certificate trusted through GIT_SSL_CAINFO in the daemons'
environment), a real coordinator and a real agent.

What must hold (docs/adr/0050): a Job whose source.git.repo lies under the spec.git.urlPrefix of a Git
Connection it lists in spec.connections is resolved at admission with that Connection's Secret (the
coordinator's git ls-remote) and checked out by the agent of the attempt's node with the same login;
the password appears in neither daemon's log. Without the Connection, or with a Secret whose password
the server refuses, the Job is refused at admission (422) naming spec.source.git.repo and the fix."""
from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Coordinator
from e2e import JOBS, NS, create, ended, start_agent
from test_sources_e2e import commit_version, git

USER, PASSWORD = "ci", "s3cret-token-7f2a"


class GitOverHTTP(BaseHTTPRequestHandler):
    """git's smart HTTP protocol through `git http-backend` (CGI), for callers with the right basic auth."""

    root: Path
    logins: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        got = self.headers.get("Authorization", "")
        self.logins.append(got)
        if got != "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1",
               "REQUEST_METHOD": self.command, "PATH_INFO": path.removeprefix("/private"), "QUERY_STRING": query,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "REMOTE_USER": USER, "REMOTE_ADDR": "127.0.0.1",
               "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _serve
    do_POST = _serve


@pytest.fixture
def private_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path, list[str]]]:
    """(the repository's https:// URL, a clone that pushes to it, the Authorization headers the server saw).
    Requested before `coordinator`, so the daemons it starts trust the server's certificate."""
    cert, key = tmp_path / "git.crt", tmp_path / "git.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    monkeypatch.setenv("GIT_SSL_CAINFO", str(cert))
    root = tmp_path / "served"
    root.mkdir()
    git("init", "-q", "--bare", "-b", "main", str(root / "repo.git"), cwd=tmp_path)
    git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=root / "repo.git")
    work = tmp_path / "work"
    git("clone", "-q", str(root / "repo.git"), str(work), cwd=tmp_path)
    logins: list[str] = []
    handler = type("Handler", (GitOverHTTP,), {"root": root, "logins": logins})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/private/repo.git", work, logins
    finally:
        server.shutdown()
        server.server_close()


def post(c: Coordinator, plural: str, body: dict[str, Any]) -> None:
    r = c.session().post(c.url(f"{NS}/{plural}"), json={"apiVersion": "nodus.dev/v1", **body})
    assert r.status_code == 201, r.text


def refusal(c: Coordinator, name: str, **spec: Any) -> dict[str, Any]:
    r = c.session().post(c.url(JOBS), json={"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name},
                                            "spec": {"command": ["true"], **spec}})
    assert r.status_code == 422, r.text
    assert c.session().get(c.url(f"{JOBS}/{name}")).status_code == 404, "nothing was stored"
    body: dict[str, Any] = r.json()
    return body


def test_a_private_repository_is_read_with_its_git_connection(private_repo: tuple[str, Path, list[str]],
                                                              coordinator: Coordinator, tmp_path: Path) -> None:
    url, work, logins = private_repo
    v1 = commit_version(work, "private v1")
    prefix = url.rsplit("/", 1)[0] + "/"

    body = refusal(coordinator, "no-login", source={"git": {"repo": url, "ref": "main"}})
    [cause] = body["details"]["causes"]
    assert cause["field"] == "spec.source.git.repo", body
    assert "Git Connection whose spec.git.urlPrefix covers it" in body["fix"], body

    post(coordinator, "secrets", {"kind": "Secret", "metadata": {"name": "git-login"},
                                  "stringData": {"username": USER, "password": PASSWORD}})
    post(coordinator, "secrets", {"kind": "Secret", "metadata": {"name": "git-stale"},
                                  "stringData": {"username": USER, "password": "revoked-token"}})
    post(coordinator, "connections", {"kind": "Connection", "metadata": {"name": "private-git"},
                                      "spec": {"type": "Git", "git": {"urlPrefix": prefix, "secret": "git-login"}}})
    post(coordinator, "connections", {"kind": "Connection", "metadata": {"name": "stale-git"},
                                      "spec": {"type": "Git", "git": {"urlPrefix": prefix, "secret": "git-stale"}}})

    body = refusal(coordinator, "bad-login", connections=["stale-git"], source={"git": {"repo": url, "ref": "main"}})
    [cause] = body["details"]["causes"]
    assert cause["field"] == "spec.source.git.repo", body
    assert 'Secret "git-stale"' in cause["message"] and 'Git Connection "stale-git"' in cause["message"], cause
    assert "update Secret git-stale" in body["fix"], body

    job = create(coordinator, "from-private", command=[sys.executable, "-c", "print(open('version.txt').read().strip())"],
                 connections=["private-git"], source={"git": {"repo": url, "ref": "main"}})
    assert job["status"]["source"] == {"commit": v1}, "the coordinator's ls-remote logged in"
    before = len(logins)
    with start_agent(coordinator, tmp_path / "agent") as agent:
        final = ended(coordinator, "from-private")
        assert final["status"]["phase"] == "Succeeded", final["status"]
        assert coordinator.run("nodus", "logs", "from-private").stdout == "private v1\n", "the agent checked it out"
        agent_log = agent.log_path.read_bytes()
    assert len(logins) > before, "the checkout went through the authenticating server"
    for log in (coordinator.log.read_bytes(), agent_log):
        assert PASSWORD.encode() not in log and base64.b64encode(f"{USER}:{PASSWORD}".encode()) not in log


def test_a_git_connection_needs_its_git_fields_and_no_credentials_in_its_prefix(coordinator: Coordinator) -> None:
    c = coordinator
    for name, spec, field in [("bare", {"type": "Git"}, "spec.git"),
                              ("in-url", {"type": "Git", "git": {"urlPrefix": "https://ci:tok@git.example.com/",
                                                                 "secret": "s"}}, "spec.git.urlPrefix")]:
        r = c.session().post(c.url(f"{NS}/connections"), json={"apiVersion": "nodus.dev/v1", "kind": "Connection",
                                                               "metadata": {"name": name}, "spec": spec})
        assert r.status_code == 422, r.text
        assert field in [x["field"] for x in r.json()["details"]["causes"]], r.text
