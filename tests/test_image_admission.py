"""Images pinned at admission, through the real coordinator against a real registry on loopback:
`status.image` is the digest the registry serves, every Assignment (replacements included) carries
registry/repository@digest even after the tag moved, and what cannot be resolved is refused naming
the field and the fix, on REST, kubectl and gRPC alike. The agent is the protocol double of
test_agent_service.py offering the oci runtime.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import BIN, Coordinator, job
from e2e import JOBS, NS
from nodus.v1 import common_pb2, resource_pb2, resource_pb2_grpc
from registry import Registry, build_busybox_layout, push
from test_agent_service import FAILED, RUNNING, FakeAgent

SECRETS = f"{NS}/secrets"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry,
      private_oci_registry: Registry) -> Iterator[Coordinator]:
    """One coordinator that reaches both test registries over plain HTTP."""
    args = ("--insecure-registry", oci_registry.host, "--insecure-registry", private_oci_registry.host)
    with Coordinator(tmp_path_factory.mktemp("images") / "data").start(extra_args=args) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def agent(c: Coordinator) -> Iterator[FakeAgent]:
    """One node offering the oci runtime, with room for every Job here (each test waits for its own)."""
    node = FakeAgent(c, "oci-node", cpus=64, memory=256 << 30, runtimes=(common_pb2.RUNTIME_OCI,))
    node.register()
    node.connect()
    node.expect("full_state")
    node.start_heartbeats()
    yield node
    node.close()


def of_job(name: str) -> Any:
    return lambda a: a.job.name == name


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry) -> tuple[str, str]:
    """busybox pushed as adm/busybox:v1: (reference, digest the registry serves)."""
    layout = build_busybox_layout(tmp_path_factory.mktemp("layouts") / "busybox")
    return f"{oci_registry.host}/adm/busybox:v1", push(layout, oci_registry, "adm/busybox", "v1")


def image_job(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return job(name, image=image, command=["sh", "-c", "echo hi"], **spec)


def post(c: Coordinator, body: dict[str, Any], **params: str) -> Any:
    return c.session().post(c.url(JOBS), json=body, params=params)


def refused_field(r: Any) -> tuple[str, str]:
    """(the field named, its message) of a 422 metav1.Status, after checking it carries a fix."""
    assert r.status_code == 422, r.text
    status = r.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid" and status["fix"], status
    (cause,) = status["details"]["causes"]
    return cause["field"], cause["message"]


def kubectl(c: Coordinator, *args: str, input: str | None = None, check: bool = True) -> Any:
    return c.run("kubectl", *args, input=input, check=check)


def test_kubectl_create_records_the_digest_the_registry_serves(c: Coordinator, busybox: tuple[str, str]) -> None:
    image, digest = busybox
    kubectl(c, "create", "-f", "-", input=yaml.safe_dump(image_job("pinned", image)))
    got = json.loads(kubectl(c, "get", "job", "pinned", "-o", "json").stdout)
    assert got["status"]["image"] == {"reference": image, "digest": digest, "user": "root"}
    assert got["spec"]["image"] == image  # the spec stays as written; the pin is status


def test_unknown_tag_is_refused_naming_spec_image_on_rest_kubectl_and_dry_run(
        c: Coordinator, busybox: tuple[str, str]) -> None:
    unknown = busybox[0].replace(":v1", ":no-such-tag")
    field, message = refused_field(post(c, image_job("unknown", unknown)))
    assert field == "spec.image" and "ImageNotFound" in message
    # A dry run resolves too: the user sees the refusal before anything is written.
    field, _ = refused_field(post(c, image_job("unknown", unknown), dryRun="All"))
    assert field == "spec.image"
    out = kubectl(c, "create", "-f", "-", input=yaml.safe_dump(image_job("unknown", unknown)), check=False)
    assert out.returncode != 0 and "spec.image" in out.stderr and "ImageNotFound" in out.stderr, out.stderr
    ok = post(c, image_job("dry", busybox[0]), dryRun="All")
    assert ok.status_code == 201 and ok.json()["status"]["image"]["digest"] == busybox[1], ok.text
    assert c.session().get(c.url(f"{JOBS}/dry")).status_code == 404  # resolved, but nothing written


def test_a_sidecar_image_is_pinned_and_its_refusal_names_the_sidecar(c: Coordinator, busybox: tuple[str, str]) -> None:
    image, digest = busybox
    missing = image.replace("adm/busybox:v1", "adm/nothing:v1")
    sidecars = [{"name": "web", "image": image, "command": ["httpd", "-f"]}, {"name": "gone", "image": missing}]
    field, message = refused_field(post(c, image_job("side", image, sidecars=sidecars)))
    assert field == "spec.sidecars[1].image" and "ImageNotFound" in message
    r = post(c, image_job("side", image, sidecars=sidecars[:1]))
    assert r.status_code == 201, r.text
    assert r.json()["status"]["sidecarImages"] == [{"name": "web", "reference": image, "digest": digest,
                                                    "user": "root"}]


def test_spec_image_cannot_change_after_admission(c: Coordinator, busybox: tuple[str, str]) -> None:
    assert post(c, image_job("fixed", busybox[0])).status_code == 201
    r = c.session().patch(c.url(f"{JOBS}/fixed"), json={"spec": {"image": busybox[0].replace(":v1", ":v2")}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 422 and "spec.image" in r.text, r.text


def test_a_moved_tag_leaves_the_pin_and_every_attempt_runs_that_digest(
        c: Coordinator, agent: FakeAgent, tmp_path: Path, oci_registry: Registry) -> None:
    first = push(build_busybox_layout(tmp_path / "a", {"Env": ["BUILD=1"]}), oci_registry, "adm/moving", "stable")
    image = f"{oci_registry.host}/adm/moving:stable"
    assert post(c, image_job("moving", image, backoffLimit=1)).status_code == 201
    one = agent.expect("assignment", of_job("moving"))
    moved = push(build_busybox_layout(tmp_path / "b", {"Env": ["BUILD=2"]}), oci_registry, "adm/moving", "stable")
    assert moved != first
    agent.update(one.attempt_id, RUNNING)
    agent.finish(one.attempt_id, FAILED, exit_code=1, reason="Error", message="boom")
    two = agent.expect("assignment", of_job("moving"))
    assert two.attempt_number == 2
    agent.update(two.attempt_id, RUNNING)
    agent.finish(two.attempt_id, common_pb2.ATTEMPT_PHASE_LOST, reason="NodeLost", message="the node went away")
    three = agent.expect("assignment", of_job("moving"))  # lost capacity: a replacement, not a retry
    assert three.attempt_number == 3
    pinned = f"{oci_registry.host}/adm/moving@{first}"
    assert one.image == two.image == three.image == pinned  # never the tag, nor the digest it moved to
    got = c.session().get(c.url(f"{JOBS}/moving")).json()
    assert got["status"]["image"]["digest"] == first


def test_a_private_repository_needs_its_pull_secret_which_the_assignment_carries(
        c: Coordinator, agent: FakeAgent, tmp_path: Path, private_oci_registry: Registry) -> None:
    reg = private_oci_registry
    digest = push(build_busybox_layout(tmp_path / "p"), reg, "adm/private", "v1")
    image = f"{reg.host}/adm/private:v1"
    field, message = refused_field(post(c, image_job("private", image)))
    assert field == "spec.image" and "ImageUnauthorized" in message
    field, _ = refused_field(post(c, image_job("private", image, imagePullSecrets=["regcred"])))
    assert field == "spec.imagePullSecrets[0]"  # the Secret does not exist yet
    wrong = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "wrong"},
             "stringData": {"username": "alice", "password": "NODUS-TEST-SECRET-nope"}}
    assert c.session().post(c.url(SECRETS), json=wrong).status_code == 201
    field, message = refused_field(post(c, image_job("private", image, imagePullSecrets=["wrong"])))
    assert field == "spec.image" and "ImageUnauthorized" in message
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "regcred"},
              "stringData": {"username": reg.username, "password": reg.password}}
    assert c.session().post(c.url(SECRETS), json=secret).status_code == 201
    r = post(c, image_job("private", image, imagePullSecrets=["regcred"]))
    assert r.status_code == 201, r.text
    assert r.json()["status"]["image"]["digest"] == digest
    a = agent.expect("assignment", of_job("private"))
    assert a.image == f"{reg.host}/adm/private@{digest}"
    assert [(p.registry, p.username, p.password) for p in a.image_pull_credentials] == \
        [(reg.host, reg.username, reg.password)]
    # A docker config (what `docker login` writes) logs in to the registries it names, this one among them.
    token = base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()
    config = {"auths": {"ghcr.io": {"auth": base64.b64encode(b"bob:other").decode()}, reg.host: {"auth": token}}}
    docker = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "dockercfg"},
              "stringData": {".dockerconfigjson": json.dumps(config)}}
    assert c.session().post(c.url(SECRETS), json=docker).status_code == 201
    r = post(c, image_job("private-docker", image, imagePullSecrets=["dockercfg"]))
    assert r.status_code == 201 and r.json()["status"]["image"]["digest"] == digest, r.text
    a = agent.expect("assignment", of_job("private-docker"))
    assert (reg.host, reg.username, reg.password) in [(p.registry, p.username, p.password)
                                                      for p in a.image_pull_credentials]


def test_grpc_create_is_refused_with_the_same_reason_and_field(c: Coordinator, busybox: tuple[str, str]) -> None:
    body = struct_pb2.Struct()
    body.update(image_job("grpc-unknown", busybox[0].replace(":v1", ":nope")))
    with c.channel() as channel:
        stub = resource_pb2_grpc.ResourceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=body),
                        metadata=(("authorization", f"Bearer {c.token}"),), timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(e.value)  # type: ignore[arg-type]
        assert status is not None
        info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
        assert any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR))
        assert any(d.Unpack(bad) for d in status.details if d.Is(bad.DESCRIPTOR))
        assert info.reason == "Invalid"
        assert [v.field for v in bad.field_violations] == ["spec.image"]
        assert "ImageNotFound" in bad.field_violations[0].description
        body.update(image_job("grpc-ok", busybox[0]))
        made = stub.Create(resource_pb2.CreateRequest(kind="jobs", project="default", object=body),
                           metadata=(("authorization", f"Bearer {c.token}"),), timeout=60)
        assert made["status"]["image"]["digest"] == busybox[1]


def test_a_coordinator_without_skopeo_refuses_image_jobs_naming_the_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busybox: tuple[str, str]) -> None:
    monkeypatch.setenv("PATH", str(BIN))  # the venv's tools only: no skopeo
    with Coordinator(tmp_path / "data").start() as bare:
        r = post(bare, image_job("no-skopeo", busybox[0]))
        assert r.status_code == 503 and r.json()["reason"] == "ServiceUnavailable", r.text
        assert "skopeo is not installed" in r.json()["message"] and "skopeo" in r.json()["fix"]
        assert bare.session().get(bare.url(f"{JOBS}/no-skopeo")).status_code == 404  # never admitted unpinned
        assert post(bare, job("no-image")).status_code == 201  # a Job without an image needs no resolver
        assert "skopeo is not on the PATH" in bare.log.read_text()
