"""A real grpcurl against a running coordinator's gRPC port: reflection, health, ResourceService and auth.

Every test shares one module-scoped coordinator and uses its own object names. Streaming calls run as
subprocesses whose output is polled; no test sleeps for a fixed time.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import BIN, Coordinator, job
from agent_double import wait_for

RS = "nodus.v1.ResourceService"
# grpcurl prints response fields by their proto names (resource_version), not their JSON names.
# gRPC status codes as numbers (grpcurl -format-error prints them so) and as grpcurl names them.
INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED = 3, 5, 7, 16


# ---- helpers -------------------------------------------------------------------------------------

def grpcurl(c: Coordinator, method: str, body: dict[str, Any] | None = None, token: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["grpcurl", *c.grpcurl_tls(), "-format-error"]
    if token is not None:
        args += ["-H", f"authorization: Bearer {token}"]
    if body is not None:
        args += ["-d", json.dumps(body)]
    return c.run(*args, c.grpc, method, check=check, timeout=30)


def call(c: Coordinator, method: str, body: dict[str, Any], token: str | None = None) -> Any:
    """A ResourceService call that must succeed; returns the decoded answer."""
    return json.loads(grpcurl(c, f"{RS}/{method}", body, token=c.token if token is None else token).stdout)


def failure(c: Coordinator, method: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
    """A ResourceService call that must fail; returns the error grpcurl prints (-format-error)."""
    result = grpcurl(c, f"{RS}/{method}", body, token=token, check=False)
    assert result.returncode != 0, f"{method} succeeded:\n{result.stdout}"
    error = json.loads(result.stderr)
    assert result.returncode == 64 + error["code"], result  # grpcurl's exit code carries the status code
    return error


def documents(text: str) -> list[Any]:
    """The JSON documents grpcurl printed one after another (a server stream)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        try:
            doc, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # a document still being written
        out.append(doc)


def events_for(events: list[dict[str, Any]], name: str) -> list[str]:
    return [e["type"] for e in events if e.get("object", {}).get("metadata", {}).get("name") == name]


def job_create(name: str, project: str = "default", **spec: Any) -> dict[str, Any]:
    return {"kind": "jobs", "project": project, "object": job(name, **spec)}


class Stream:
    """A grpcurl server-streaming call left running; its stdout and stderr are polled from files."""

    def __init__(self, c: Coordinator, tmp_path: Path, method: str, body: dict[str, Any], token: str) -> None:
        env = {**os.environ, "HOME": str(c.data_dir.parent)}
        self.out_path, self.err_path = tmp_path / "stream.out", tmp_path / "stream.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(BIN / "grpcurl"), *c.grpcurl_tls(), "-format-error", "-H", f"authorization: Bearer {token}",
                 "-d", json.dumps(body), c.grpc, method],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    @property
    def events(self) -> list[dict[str, Any]]:
        return documents(self.out_path.read_text())

    def until(self, ready: Callable[[list[dict[str, Any]]], bool], what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.events):
            exited = self.proc.poll() is not None
            if exited and ready(self.events):
                return
            if exited or time.monotonic() > deadline:
                state = f"exited {self.proc.returncode}" if exited else "timed out"
                raise AssertionError(f"{state} waiting for {what}\nstdout:\n{self.out_path.read_text()}\n"
                                     f"stderr:\n{self.err_path.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def stream(shared_coordinator: Coordinator, tmp_path: Path) -> Iterator[Callable[..., Stream]]:
    started: list[Stream] = []

    def start(body: dict[str, Any], token: str | None = None, method: str = f"{RS}/Watch") -> Stream:
        sub = tmp_path / str(len(started))
        sub.mkdir()
        s = Stream(shared_coordinator, sub, method, body, shared_coordinator.token if token is None else token)
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def editor_a(shared_coordinator: Coordinator) -> str:
    """A token with the editor role in project a (and nothing in project default)."""
    shared_coordinator.run("nodus", "project", "create", "a")
    return shared_coordinator.grpc_token("a", "editor")


# ---- reflection and health -----------------------------------------------------------------------

def test_list_shows_every_service(shared_coordinator: Coordinator) -> None:
    services = grpcurl(shared_coordinator, "list").stdout.split()
    for service in ("nodus.v1.ResourceService", "nodus.v1.ProjectService", "nodus.v1.AgentService",
                    "nodus.v1.NodeService", "nodus.v1.GangService", "grpc.health.v1.Health"):
        assert service in services, services
    described = shared_coordinator.run("grpcurl", *shared_coordinator.grpcurl_tls(), shared_coordinator.grpc, "list", RS).stdout.split()
    assert {f"{RS}.{m}" for m in ("Get", "List", "Watch", "Create", "Update", "Patch", "Delete")} <= set(described)


def test_health_check_is_serving(shared_coordinator: Coordinator) -> None:
    answer = json.loads(grpcurl(shared_coordinator, "grpc.health.v1.Health/Check").stdout)
    assert answer == {"status": "SERVING"}
    answer = json.loads(grpcurl(shared_coordinator, "grpc.health.v1.Health/Check", {"service": RS}).stdout)
    assert answer == {"status": "SERVING"}
    # The services the control plane registers (not built by grpc_api) are marked too.
    for service in ("nodus.v1.AgentService", "nodus.v1.NodeService", "nodus.v1.GangService", "nodus.v1.BlobService"):
        answer = json.loads(grpcurl(shared_coordinator, "grpc.health.v1.Health/Check", {"service": service}).stdout)
        assert answer == {"status": "SERVING"}, service


# ---- ResourceService -----------------------------------------------------------------------------

def test_create_get_list_delete(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    created = call(c, "Create", job_create("gc-crud", completions=3, parallelism=2))
    assert created["kind"] == "Job" and created["apiVersion"] == "nodus.dev/v1"
    assert created["metadata"]["name"] == "gc-crud" and created["metadata"]["namespace"] == "default"
    assert created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    assert created["spec"]["completions"] == 3 and created["spec"]["parallelism"] == 2
    assert created["spec"]["backoffLimit"] == 6, "defaults are written into the stored object"

    got = call(c, "Get", {"kind": "jobs", "project": "default", "name": "gc-crud"})
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["spec"] == created["spec"]
    # The kind may be named by plural, Kind or short name.
    assert call(c, "Get", {"kind": "Job", "project": "default", "name": "gc-crud"})["metadata"]["uid"] == \
        created["metadata"]["uid"]
    assert call(c, "Get", {"kind": "nj", "project": "default", "name": "gc-crud"})["metadata"]["uid"] == \
        created["metadata"]["uid"]

    listed = call(c, "List", {"kind": "jobs", "project": "default"})
    assert "gc-crud" in [item["metadata"]["name"] for item in listed["items"]]
    assert int(listed["resource_version"]) >= int(created["metadata"]["resourceVersion"])
    selected = call(c, "List", {"kind": "jobs", "project": "default", "fieldSelector": "metadata.name=gc-crud"})
    assert [item["metadata"]["name"] for item in selected["items"]] == ["gc-crud"]

    deleted = call(c, "Delete", {"kind": "jobs", "project": "default", "name": "gc-crud"})
    assert deleted.get("kind") in ("Job", "Status"), deleted
    deadline = time.monotonic() + 20  # finalizers may run before it is gone
    while True:
        result = grpcurl(c, f"{RS}/Get", {"kind": "jobs", "project": "default", "name": "gc-crud"},
                         token=c.token, check=False)
        if result.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert result.returncode == 64 + NOT_FOUND, result
    listed = call(c, "List", {"kind": "jobs", "project": "default"})
    assert "gc-crud" not in [item["metadata"]["name"] for item in listed.get("items", [])]


def test_create_invalid_job_names_the_field(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    error = failure(c, "Create", job_create("gc-bad", completions=0), token=c.token)
    assert error["code"] == INVALID_ARGUMENT, error
    assert "spec.completions: Invalid value: 0" in error["message"], error
    violations = [d for d in error["details"] if d["@type"] == "type.googleapis.com/google.rpc.BadRequest"]
    assert violations and violations[0]["field_violations"][0]["field"] == "spec.completions", error
    info = [d for d in error["details"] if d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"]
    assert info and info[0]["reason"] == "Invalid" and info[0]["domain"] == "nodus.dev", error

    several = failure(c, "Create", job_create("gc-bad", completions=0, parallelism=0), token=c.token)
    (bad_request,) = [d for d in several["details"] if d["@type"].endswith("google.rpc.BadRequest")]
    assert {v["field"] for v in bad_request["field_violations"]} == {"spec.completions", "spec.parallelism"}

    unknown = job_create("gc-bad")
    unknown["object"]["spec"]["comand"] = ["x"]
    error = failure(c, "Create", unknown, token=c.token)
    assert error["code"] == INVALID_ARGUMENT and "spec.comand" in error["message"], error

    missing = failure(c, "Get", {"kind": "jobs", "project": "default", "name": "gc-bad"}, token=c.token)
    assert missing["code"] == NOT_FOUND, "nothing was stored"


def test_get_missing_is_not_found(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    error = failure(c, "Get", {"kind": "jobs", "project": "default", "name": "gc-no-such-job"}, token=c.token)
    assert error["code"] == NOT_FOUND, error
    assert '"gc-no-such-job" not found' in error["message"], error
    error = failure(c, "Delete", {"kind": "jobs", "project": "default", "name": "gc-no-such-job"}, token=c.token)
    assert error["code"] == NOT_FOUND, error


def test_watch_streams_an_added_event(shared_coordinator: Coordinator, stream: Any) -> None:
    c = shared_coordinator
    rv = call(c, "List", {"kind": "jobs", "project": "default"})["resource_version"]
    watch = stream({"kind": "jobs", "project": "default", "resourceVersion": rv, "timeoutSeconds": 30})
    call(c, "Create", job_create("gc-watch"))
    watch.until(lambda evs: "ADDED" in events_for(evs, "gc-watch"), "the ADDED event")
    (added,) = [e for e in watch.events if e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "gc-watch"]
    assert added["object"]["kind"] == "Job" and added["object"]["spec"]["completions"] == 1
    assert watch.proc.poll() is None, "the stream stays open"

    call(c, "Delete", {"kind": "jobs", "project": "default", "name": "gc-watch"})
    watch.until(lambda evs: "DELETED" in events_for(evs, "gc-watch"), "the DELETED event")


def test_watch_starting_now_sees_a_new_job(shared_coordinator: Coordinator, stream: Any) -> None:
    """No resourceVersion: the stream starts with the current objects as ADDED, then the changes, so the
    new job arrives as ADDED whether the create lands before or after the watch is in place."""
    c = shared_coordinator
    watch = stream({"kind": "jobs", "project": "default", "timeoutSeconds": 30})
    call(c, "Create", job_create("gc-watch-now"))
    watch.until(lambda evs: "ADDED" in events_for(evs, "gc-watch-now"), "the ADDED event")


def test_watch_initial_events_then_bookmark_then_timeout(shared_coordinator: Coordinator, stream: Any) -> None:
    c = shared_coordinator
    call(c, "Create", job_create("gc-initial"))
    watch = stream({"kind": "jobs", "project": "default", "fieldSelector": "metadata.name=gc-initial",
                    "sendInitialEvents": True, "allowBookmarks": True, "timeoutSeconds": 1})
    watch.until(lambda evs: any(e["type"] == "BOOKMARK" for e in evs), "the bookmark")
    events = watch.events
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"], events
    assert events[0]["object"]["metadata"]["name"] == "gc-initial"
    assert events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    assert watch.proc.wait(20) == 0, "timeoutSeconds ends the stream cleanly"


# ---- authentication and authorization ------------------------------------------------------------

REQUESTS: dict[str, dict[str, Any]] = {
    "Get": {"kind": "jobs", "project": "default", "name": "gc-auth"},
    "List": {"kind": "jobs", "project": "default"},
    "Watch": {"kind": "jobs", "project": "default", "timeoutSeconds": 5},
    "Create": job_create("gc-auth-new"),
    "Update": {"kind": "jobs", "project": "default", "name": "gc-auth", "object": job("gc-auth")},
    "Patch": {"kind": "jobs", "project": "default", "name": "gc-auth", "patchType": "merge",
              "patch": '{"spec":{"parallelism":1}}'},
    "Delete": {"kind": "jobs", "project": "default", "name": "gc-auth"},
}


@pytest.fixture(scope="module")
def auth_job(shared_coordinator: Coordinator) -> str:
    call(shared_coordinator, "Create", job_create("gc-auth"))
    return "gc-auth"


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_no_token_is_unauthenticated(shared_coordinator: Coordinator, auth_job: str, method: str) -> None:
    error = failure(shared_coordinator, method, REQUESTS[method], token=None)
    assert error["code"] == UNAUTHENTICATED, error
    assert "no bearer token" in error["message"], error


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_bad_token_is_unauthenticated(shared_coordinator: Coordinator, auth_job: str, method: str) -> None:
    error = failure(shared_coordinator, method, REQUESTS[method], token="nodus_000000000000_not-a-real-token")
    assert error["code"] == UNAUTHENTICATED, error
    error = failure(shared_coordinator, method, REQUESTS[method], token="garbage")
    assert error["code"] == UNAUTHENTICATED, error


def test_unauthenticated_calls_change_nothing(shared_coordinator: Coordinator, auth_job: str) -> None:
    c = shared_coordinator
    failure(c, "Create", job_create("gc-auth-new"), token=None)
    failure(c, "Delete", {"kind": "jobs", "project": "default", "name": auth_job}, token="garbage")
    assert failure(c, "Get", {"kind": "jobs", "project": "default", "name": "gc-auth-new"},
                   token=c.token)["code"] == NOT_FOUND
    assert call(c, "Get", {"kind": "jobs", "project": "default", "name": auth_job})["metadata"]["name"] == auth_job


@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_other_project_editor_is_denied(shared_coordinator: Coordinator, auth_job: str, editor_a: str,
                                        method: str) -> None:
    error = failure(shared_coordinator, method, REQUESTS[method], token=editor_a)
    assert error["code"] == PERMISSION_DENIED, error
    assert 'in the namespace "default"' in error["message"], error


def test_other_project_editor_sees_nothing_of_default(shared_coordinator: Coordinator, auth_job: str,
                                                      editor_a: str, stream: Any) -> None:
    c = shared_coordinator
    # The editor works in its own project.
    mine = call(c, "Create", job_create("gc-in-a", project="a"), token=editor_a)
    assert mine["metadata"]["namespace"] == "a"

    listed = call(c, "List", {"kind": "jobs", "project": ""}, token=editor_a)
    projects = {item["metadata"]["namespace"] for item in listed.get("items", [])}
    assert projects == {"a"}, listed
    assert "gc-in-a" in [item["metadata"]["name"] for item in listed["items"]]
    assert auth_job not in json.dumps(listed)
    # The admin, by contrast, sees both projects with an empty project.
    everything = call(c, "List", {"kind": "jobs", "project": ""})
    assert {"a", "default"} <= {item["metadata"]["namespace"] for item in everything["items"]}

    # A watch of every project shows the editor project a only: a job created in default first never
    # arrives, while the one created in a afterwards does (events come in store order).
    watch = stream({"kind": "jobs", "project": "", "timeoutSeconds": 30}, token=editor_a)
    watch.until(lambda evs: "ADDED" in events_for(evs, "gc-in-a"), "the initial ADDED of project a's job")
    call(c, "Create", job_create("gc-hidden"))
    call(c, "Create", job_create("gc-in-a-2", project="a"), token=editor_a)
    watch.until(lambda evs: "ADDED" in events_for(evs, "gc-in-a-2"), "the ADDED of project a's new job")
    seen = {e["object"]["metadata"].get("namespace") for e in watch.events if e["type"] != "BOOKMARK"}
    assert seen == {"a"}, watch.events
    assert not events_for(watch.events, "gc-hidden")


def test_operators_read_a_gang_with_grpcurl(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    call(c, "Create", job_create("grpcurl-gang", command=["true"], distributed={"nodes": 3}))
    gang = wait_for(lambda: (g := json.loads(grpcurl(c, "nodus.v1.GangService/GetGang",
                                                     {"project": "default", "job": "grpcurl-gang"},
                                                     token=c.token).stdout)).get("size") and g)
    assert gang["size"] == 3 and gang["epoch"] == "1" and gang["phase"] == "GANG_PHASE_QUEUED", gang
    assert sorted(m.get("rank", 0) for m in gang["members"]) == [0, 1, 2]  # created together, none placed
    listed = json.loads(grpcurl(c, "nodus.v1.GangService/ListGangs", {"project": "default"}, token=c.token).stdout)
    assert "grpcurl-gang" in [g["job"]["name"] for g in listed["gangs"]]
    result = grpcurl(c, "nodus.v1.GangService/GetGang", {"project": "default", "job": "grpcurl-gang"},
                     token=None, check=False)
    assert result.returncode == 64 + UNAUTHENTICATED, result
    call(c, "Delete", {"kind": "jobs", "project": "default", "name": "grpcurl-gang"})
