"""Identity: roles within a project, and nothing of project B for a token of project A, on every verb."""
from __future__ import annotations

import json
from typing import Any

import grpc
import stat

import pytest

from conftest import Coordinator, job
from nodus.v1 import project_pb2, project_pb2_grpc, resource_pb2, resource_pb2_grpc

B_JOBS = "/apis/nodus.dev/v1/namespaces/b/jobs"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    c = shared_coordinator
    c.run("nodus", "project", "create", "a")
    c.run("nodus", "project", "create", "b")
    r = c.session().post(c.url(B_JOBS), json=job("secret-plan"))
    assert r.status_code == 201, r.text
    # one of A's own, so that "only A's objects are listed" is not said of an empty list
    r = c.session().post(c.url("/apis/nodus.dev/v1/namespaces/a/jobs"), json=job("a-plan"))
    assert r.status_code == 201, r.text
    return c


@pytest.fixture(scope="module")
def a_admin(c: Coordinator) -> str:
    return c.grpc_token("a", "admin")


def test_first_start_writes_a_private_kubeconfig_and_join_token(c: Coordinator) -> None:
    for name in ("kubeconfig", "join-token"):
        mode = stat.S_IMODE((c.data_dir / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert (c.data_dir / "join-token").read_text().startswith("nodusjoin_")


def test_project_a_token_gets_nothing_of_project_b_over_rest(c: Coordinator, a_admin: str) -> None:
    s = c.session(a_admin)
    calls = [
        ("get", lambda: s.get(c.url(f"{B_JOBS}/secret-plan"))),
        ("list", lambda: s.get(c.url(B_JOBS))),
        ("watch", lambda: s.get(c.url(B_JOBS), params={"watch": "true", "timeoutSeconds": "1"})),
        ("create", lambda: s.post(c.url(B_JOBS), json=job("intruder"))),
        ("replace", lambda: s.put(c.url(f"{B_JOBS}/secret-plan"), json=job("secret-plan"))),
        ("patch", lambda: s.patch(c.url(f"{B_JOBS}/secret-plan"), data=b'{"spec":{"parallelism":1}}', headers=MERGE)),
        ("status", lambda: s.patch(c.url(f"{B_JOBS}/secret-plan/status"), data=b'{"status":{}}', headers=MERGE)),
        ("delete", lambda: s.delete(c.url(f"{B_JOBS}/secret-plan"))),
        ("delete-missing", lambda: s.delete(c.url(f"{B_JOBS}/does-not-exist"))),
    ]
    for verb, call in calls:
        r = call()
        assert r.status_code == 403, (verb, r.status_code, r.text)
        if verb in ("list", "watch", "create"):
            assert "secret-plan" not in r.text  # nothing of B's objects leaks
        body = r.json()
        assert body["reason"] == "Forbidden" and "spec" not in body
    # the object is untouched
    assert c.session().get(c.url(f"{B_JOBS}/secret-plan")).json()["metadata"]["generation"] == 1
    # across projects, only A's objects are listed
    everything = s.get(c.url("/apis/nodus.dev/v1/jobs")).json()["items"]
    assert {o["metadata"]["namespace"] for o in everything} == {"a"}
    assert "a-plan" in [o["metadata"]["name"] for o in everything]


def test_roles_within_a_project(c: Coordinator) -> None:
    viewer = c.session(c.grpc_token("a", "viewer"))
    editor = c.session(c.grpc_token("a", "editor"))
    a_jobs = "/apis/nodus.dev/v1/namespaces/a/jobs"
    denied = viewer.post(c.url(a_jobs), json=job("v1"))
    assert denied.status_code == 403 and "editor" in denied.json()["fix"]
    assert editor.post(c.url(a_jobs), json=job("e1")).status_code == 201
    assert viewer.get(c.url(f"{a_jobs}/e1")).status_code == 200
    assert viewer.delete(c.url(f"{a_jobs}/e1")).status_code == 403
    assert editor.delete(c.url(f"{a_jobs}/e1")).status_code == 200


def _grpc_calls(stub: Any) -> list[tuple[str, Any]]:
    obj = json.loads(json.dumps(job("intruder")))
    from google.protobuf import struct_pb2
    s = struct_pb2.Struct()
    s.update(obj)
    return [
        ("Get", lambda md: stub.Get(resource_pb2.GetRequest(kind="jobs", project="b", name="secret-plan"), metadata=md)),
        ("List", lambda md: stub.List(resource_pb2.ListRequest(kind="jobs", project="b"), metadata=md)),
        ("Watch", lambda md: list(stub.Watch(resource_pb2.WatchRequest(kind="jobs", project="b", timeout_seconds=1),
                                             metadata=md))),
        ("Create", lambda md: stub.Create(resource_pb2.CreateRequest(kind="jobs", project="b", object=s), metadata=md)),
        ("Update", lambda md: stub.Update(resource_pb2.UpdateRequest(kind="jobs", project="b", name="secret-plan",
                                                                     object=s), metadata=md)),
        ("Patch", lambda md: stub.Patch(resource_pb2.PatchRequest(kind="jobs", project="b", name="secret-plan",
                                                                  patch_type="merge", patch='{"spec":{}}'), metadata=md)),
        ("Delete", lambda md: stub.Delete(resource_pb2.DeleteRequest(kind="jobs", project="b", name="secret-plan"),
                                          metadata=md)),
    ]


def test_project_a_token_gets_nothing_of_project_b_over_grpc(c: Coordinator, a_admin: str) -> None:
    with c.channel() as channel:
        stub = resource_pb2_grpc.ResourceServiceStub(channel)
        for name, call in _grpc_calls(stub):
            with pytest.raises(grpc.RpcError) as e:
                call((("authorization", f"Bearer {a_admin}"),))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            with pytest.raises(grpc.RpcError) as e:
                call(())
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        listed = stub.List(resource_pb2.ListRequest(kind="jobs"), metadata=(("authorization", f"Bearer {a_admin}"),))
        assert {item["metadata"]["namespace"] for item in listed.items} == {"a"}
        assert "a-plan" in [item["metadata"]["name"] for item in listed.items]
        projects = project_pb2_grpc.ProjectServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            projects.CreateToken(project_pb2.CreateTokenRequest(project="b", role="admin"),
                                 metadata=(("authorization", f"Bearer {a_admin}"),))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as e:
            projects.CreateProject(project_pb2.CreateProjectRequest(name="c"),
                                   metadata=(("authorization", f"Bearer {a_admin}"),))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_revoked_and_expired_tokens_stop_working(c: Coordinator) -> None:
    admin = (("authorization", f"Bearer {c.token}"),)
    with c.channel() as channel:
        projects = project_pb2_grpc.ProjectServiceStub(channel)
        token = projects.CreateToken(project_pb2.CreateTokenRequest(project="a", role="viewer"), metadata=admin)
        assert c.session(token.secret).get(c.url("/apis/nodus.dev/v1/namespaces/a/jobs")).status_code == 200
        listed = projects.ListTokens(project_pb2.ListTokensRequest(project="a"), metadata=admin)
        assert token.id in [t.id for t in listed.tokens] and all(not t.secret for t in listed.tokens)
        projects.RevokeToken(project_pb2.RevokeTokenRequest(id=token.id), metadata=admin)
    assert c.session(token.secret).get(c.url("/apis/nodus.dev/v1/namespaces/a/jobs")).status_code == 401


def test_cli_errors_are_one_line_plus_fix(c: Coordinator) -> None:
    out = c.run("nodus", "get", "job", "no-such-job", check=False)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0] == 'error: jobs.nodus.dev "no-such-job" not found'
    assert lines[1].startswith("  fix: ")
    dup = c.run("nodus", "project", "create", "a", check=False)
    assert dup.returncode == 1 and "already exists" in dup.stderr


def test_a_missing_project_is_refused_until_it_exists_and_then_is_not_read_again(tmp_path: Any) -> None:
    """A create checks its project; one seen to exist is remembered (no verb deletes a project, ADR 0078),
    a missing one never is, so a project created after a refusal is found at once."""
    import asyncio

    from nodus.coordinator.errors import NodusError
    from nodus.coordinator.identity import Identity
    from nodus.coordinator.store import SqliteStore

    async def body() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            identity = Identity(store)
            with pytest.raises(NodusError) as e:
                await identity.require_project("later")
            assert e.value.reason == "NotFound"
            await identity.create_project("later")
            await identity.require_project("later")
            reads: list[str] = []
            read = store.get

            async def counted(key: str) -> Any:
                reads.append(key)
                return await read(key)
            store.get = counted  # type: ignore[method-assign]
            await identity.require_project("later")
            assert reads == [], "a project seen to exist is not read again"
            with pytest.raises(NodusError):
                await identity.require_project("never")
            assert reads == ["_identity/projects/never"]
        finally:
            await store.close()
    asyncio.run(body())
