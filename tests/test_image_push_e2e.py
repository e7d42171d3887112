"""`nodus image push` / `nodus image ls` end to end (issue 11, item 6): a real coordinator configured with the
operator's registry (a real docker-registry with htpasswd auth, tests/registry.py), images built offline (an OCI
layout, and a `docker save` archive skopeo writes from it), the real CLI, and a Job naming the printed
reference run on a real `nodus-agent --runtime oci`, pulled with the operator's credentials and no
imagePullSecrets. Another project can neither list nor run the image.
"""
from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Iterator

import orjson
import pytest
import yaml

from conftest import Coordinator
from e2e import JOBS, create, joined, settled
from registry import Registry, build_busybox_layout, build_sized_layout, manifest_digest
from test_oci_e2e import clean_pods, oci_agent, traversable_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry"))
                       or os.geteuid() != 0, reason="needs runc, skopeo, umoci, docker-registry and root"),
]

PREFIX = "nodus"


def auth_file(path: Path, registry: Registry) -> Path:
    """The operator's docker config JSON for the registry (what `skopeo login --authfile` writes)."""
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    path.write_bytes(orjson.dumps({"auths": {registry.host: {"auth": token}}}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, private_oci_registry: Registry) -> Iterator[Coordinator]:
    root = tmp_path_factory.mktemp("image-push")
    creds = auth_file(root / "registry-auth.json", private_oci_registry)
    with Coordinator(root / "data").start(extra_args=(
            "--image-registry", f"{private_oci_registry.host}/{PREFIX}", "--image-registry-auth-file", str(creds),
            "--insecure-registry", private_oci_registry.host)) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def other(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for an editor of project `other` (a second customer)."""
    c.run("nodus", "project", "create", "other")
    token = c.grpc_token("other", "editor")
    config = yaml.safe_load(c.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = token
    config["contexts"][0]["context"]["namespace"] = "other"
    path = tmp_path_factory.mktemp("other") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An OCI layout of busybox, and a `docker save` archive of busybox and 6 MB more (past the gateway's
    3 MiB body limit for objects: an upload streams)."""
    root = tmp_path_factory.mktemp("built")
    oci = build_busybox_layout(root / "oci")
    second = build_sized_layout(root / "second", 6, layers=2)
    archive = root / "saved.tar"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{second}:latest",
                    f"docker-archive:{archive}:example.com/team/saved:v7"], check=True, capture_output=True)
    return {"oci": oci, "docker": archive}


def pushed_lines(out: str) -> dict[str, str]:
    found = dict(re.findall(r"^(pushed|digest|spec\.image):? (\S+)", out, re.M))
    assert set(found) == {"pushed", "digest", "spec.image"}, out
    return found


def test_push_both_formats_list_them_and_run_a_job_with_the_printed_reference(
        c: Coordinator, layouts: dict[str, Path], private_oci_registry: Registry, other: Path) -> None:
    host = private_oci_registry.host
    oci = pushed_lines(c.run("nodus", "image", "push", str(layouts["oci"]), "--name", "tools/busybox:v1").stdout)
    assert oci["pushed"] == f"{host}/{PREFIX}/default/tools/busybox:v1"
    assert oci["digest"] == manifest_digest(layouts["oci"])  # the layout's own manifest, byte for byte
    assert oci["spec.image"] == f"{host}/{PREFIX}/default/tools/busybox@{oci['digest']}"

    saved = pushed_lines(c.run("nodus", "image", "push", str(layouts["docker"])).stdout)  # named by its RepoTags
    assert saved["pushed"] == f"{host}/{PREFIX}/default/saved:v7"
    served = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", "alice:s3cret",
                             f"docker://{saved['pushed']}"], check=True, capture_output=True).stdout
    assert saved["digest"] == "sha256:" + __import__("hashlib").sha256(served).hexdigest()

    listed = orjson.loads(c.run("nodus", "image", "ls", "-o", "json").stdout)
    assert {(i["name"], i["tag"], i["digest"]) for i in listed} == {
        ("tools/busybox", "v1", oci["digest"]), ("saved", "v7", saved["digest"])}
    table = c.run("nodus", "image", "ls").stdout
    assert "tools/busybox" in table and oci["digest"] in table

    # another project sees none of them and cannot list default's
    theirs = c.run("nodus", "--kubeconfig", str(other), "image", "ls", "-o", "json").stdout
    assert orjson.loads(theirs) == []
    refused = c.run("nodus", "--kubeconfig", str(other), "-n", "default", "image", "ls", check=False)
    assert refused.returncode == 1 and "cannot list images in project \"default\"" in refused.stderr

    # nor run one: admission refuses the image of another project, naming spec.image
    token = yaml.safe_load(other.read_text())["users"][0]["user"]["token"]
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "borrowed"},
            "spec": {"image": oci["spec.image"], "command": ["true"]}}
    r = c.session(token).post(c.url(JOBS.replace("/default/", "/other/")), json=body)
    assert r.status_code == 422, r.text
    causes = r.json()["details"]["causes"]
    assert causes[0]["field"] == "spec.image" and "ImageOfAnotherProject" in causes[0]["message"], causes

    # the owner's Job with the printed reference runs, pulled with the operator's credentials
    top = traversable_dir("nodus-image-push-")
    work = top / "agent"
    try:
        with joined([oci_agent(c, work, private_oci_registry, node="push-n0").start()], c):
            create(c, "pushed-image", backoffLimit=0, image=oci["spec.image"],
                   command=["sh", "-c", "echo ran inside the pushed image; id -u"])
            st = settled(c, "pushed-image", 180)
            assert st["phase"] == "Succeeded", st
            assert st["image"]["digest"] == oci["digest"]
            job = c.session().get(c.url(f"{JOBS}/pushed-image")).json()
            assert not job["spec"].get("imagePullSecrets") and "s3cret" not in orjson.dumps(job).decode()
            assert "ran inside the pushed image" in c.run("nodus", "logs", "pushed-image").stdout
    finally:
        clean_pods(work)
        shutil.rmtree(top, ignore_errors=True)


def test_a_job_names_a_pushed_image_by_its_image_ref(c: Coordinator, layouts: dict[str, Path],
                                                     private_oci_registry: Registry) -> None:
    """spec.imageRef: NAME[:TAG] as `nodus image ls` lists it, resolved in the project's own namespace."""
    oci = pushed_lines(c.run("nodus", "image", "push", str(layouts["oci"]), "--name", "tools/busybox:v2").stdout)
    both = c.session().post(c.url(JOBS), json={"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "b"},
                                               "spec": {"image": oci["spec.image"], "imageRef": "tools/busybox:v2",
                                                        "command": ["true"]}})
    assert both.status_code == 422 and both.json()["details"]["causes"][0]["field"] == "spec.imageRef", both.text
    missing = c.session().post(c.url(JOBS), json={"apiVersion": "nodus.dev/v1", "kind": "Job",
                                                  "metadata": {"name": "m"},
                                                  "spec": {"imageRef": "tools/busybox:nope", "command": ["true"]}})
    assert missing.status_code == 422, missing.text
    assert missing.json()["details"]["causes"][0]["field"] == "spec.imageRef", missing.text
    top = traversable_dir("nodus-image-ref-")
    work = top / "agent"
    try:
        with joined([oci_agent(c, work, private_oci_registry, node="ref-n0").start()], c):
            create(c, "by-ref", backoffLimit=0, imageRef="tools/busybox:v2",
                   command=["sh", "-c", "echo ran by its imageRef"])
            st = settled(c, "by-ref", 180)
            assert st["phase"] == "Succeeded", st
            assert st["image"] == {"reference": oci["pushed"], "digest": oci["digest"], "user": st["image"]["user"]}
            assert "ran by its imageRef" in c.run("nodus", "logs", "by-ref").stdout
    finally:
        clean_pods(work)
        shutil.rmtree(top, ignore_errors=True)


def test_what_is_not_an_image_is_refused_naming_the_argument(c: Coordinator, tmp_path: Path) -> None:
    not_layout = tmp_path / "plain"
    not_layout.mkdir()
    (not_layout / "index.json").write_text("{}")
    r = c.run("nodus", "image", "push", str(not_layout), "--name", "x", check=False)
    assert r.returncode == 1 and "not an OCI image layout (oci-layout missing)" in r.stderr, r.stderr
    assert "fix:" in r.stderr

    plain_tar = tmp_path / "plain.tar"
    with tarfile.open(plain_tar, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    r = c.run("nodus", "image", "push", str(plain_tar), check=False)
    assert r.returncode == 1 and "a tar without manifest.json is not a `docker save` archive" in r.stderr, r.stderr

    # the coordinator checks for itself (a client other than the CLI)
    resp = c.session().post(c.url("/apis/nodus.dev/v1/namespaces/default/images"), params={"name": "x"},
                            data=plain_tar.read_bytes(), headers={"Content-Type": "application/x-tar"})
    assert resp.status_code == 400, resp.text
    assert "DIR|FILE: the archive is not an image" in resp.json()["message"]

    r = c.run("nodus", "image", "push", str(plain_tar.parent / "missing"), check=False)
    assert r.returncode == 1 and "no such file or directory" in r.stderr


def test_a_bad_name_is_refused_and_nothing_is_listed(c: Coordinator, layouts: dict[str, Path]) -> None:
    r = c.run("nodus", "image", "push", str(layouts["oci"]), "--name", "Bad_Name:v1", check=False)
    assert r.returncode == 1 and "--name: 'Bad_Name' is not an image name" in r.stderr, r.stderr
    r = c.run("nodus", "image", "push", str(layouts["oci"]), check=False)  # a layout carries no name
    assert r.returncode == 1 and "--name is required" in r.stderr, r.stderr
    names = {i["name"] for i in orjson.loads(c.run("nodus", "image", "ls", "-o", "json").stdout)}
    assert "Bad_Name" not in names and "bad_name" not in names


def test_without_a_registry_configured_push_is_refused_with_the_fix(coordinator: Coordinator,
                                                                     layouts: dict[str, Path]) -> None:
    r = coordinator.run("nodus", "image", "push", str(layouts["oci"]), "--name", "busybox", check=False)
    assert r.returncode == 1 and "no image registry configured" in r.stderr, r.stderr
    assert "--image-registry HOST:PORT[/PREFIX]" in r.stderr
    # nor can a Job name a project image there
    refused = coordinator.session().post(coordinator.url(JOBS), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "by-ref"},
        "spec": {"imageRef": "busybox:v1", "command": ["true"]}})
    assert refused.status_code == 422, refused.text
    cause = refused.json()["details"]["causes"][0]
    assert cause["field"] == "spec.imageRef" and "without --image-registry" in cause["message"], cause
