"""The Volume kind end to end: `nodus volume push`, immutable revisions, pins in Jobs, kubectl."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import zstandard

from conftest import Coordinator, job

NS = "/apis/nodus.dev/v1/namespaces/default"
VOLUMES = f"{NS}/volumes"
JOBS = f"{NS}/jobs"


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    return shared_coordinator


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def unpack(archive: bytes) -> dict[str, bytes]:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive)) as reader:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def volume(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{VOLUMES}/{name}"))
    assert r.status_code == 200, r.text
    return r.json()


def push_raw(c: Coordinator, name: str, body: bytes, token: str | None = None, **headers: str) -> Any:
    return c.session(token).post(c.url(f"{VOLUMES}/{name}/revisions"), data=body,
                                 headers={"Content-Type": "application/zstd", **headers})


def tar_zst(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def test_push_creates_the_volume_and_revisions(c: Coordinator, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "data", {"train.csv": "a,b\n1,2\n", "nested/dev.csv": "a,b\n3,4\n"})
    out = c.run("nodus", "volume", "push", "corpus", str(tree)).stdout
    assert "volume/corpus revision 1 pushed: 2 files" in out
    vol = volume(c, "corpus")
    assert vol["kind"] == "Volume" and vol["apiVersion"] == "nodus.dev/v1"
    assert vol["status"]["latestRevision"] == 1
    (rev1,) = vol["status"]["revisions"]
    assert rev1["revision"] == 1 and rev1["files"] == 2 and rev1["phase"] == "Ready"
    assert rev1["createTime"].endswith("Z") and len(rev1["sha256"]) == 64 and rev1["size"] > 0
    assert rev1["sha256"] in out

    again = c.run("nodus", "volume", "push", "corpus", str(tree)).stdout
    assert "revision 1 unchanged" in again, "the same tree archives the same: no new revision"
    assert len(volume(c, "corpus")["status"]["revisions"]) == 1

    (tree / "train.csv").write_text("a,b\n1,2\n5,6\n")
    (tree / "nested" / "extra.txt").write_text("x")
    out2 = c.run("nodus", "volume", "push", "corpus", str(tree)).stdout
    assert "revision 2 pushed: 3 files" in out2
    vol = volume(c, "corpus")
    assert vol["status"]["latestRevision"] == 2
    assert vol["status"]["revisions"][0] == rev1, "a revision never changes"

    archive = c.session().get(c.url(f"{VOLUMES}/corpus/revisions/1"))
    assert archive.status_code == 200 and archive.headers["Content-Type"] == "application/zstd"
    assert hashlib.sha256(archive.content).hexdigest() == rev1["sha256"]
    assert unpack(archive.content) == {"train.csv": b"a,b\n1,2\n", "nested/dev.csv": b"a,b\n3,4\n"}
    latest = c.session().get(c.url(f"{VOLUMES}/corpus/revisions/latest"))
    assert unpack(latest.content)["train.csv"] == b"a,b\n1,2\n5,6\n"
    missing = c.session().get(c.url(f"{VOLUMES}/corpus/revisions/9"))
    assert missing.status_code == 404 and "latest revision is 2" in missing.json()["fix"]


def test_jobs_pin_volume_revisions(c: Coordinator, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "d", {"x.txt": "one"})
    c.run("nodus", "volume", "push", "pinned", str(tree))
    (tree / "x.txt").write_text("two")
    c.run("nodus", "volume", "push", "pinned", str(tree))
    revs = {r["revision"]: r for r in volume(c, "pinned")["status"]["revisions"]}

    body = job("uses-volume", inputs=[{"name": "data", "volume": {"name": "pinned"}},
                                      {"name": "old", "volume": {"name": "pinned", "revision": 1}}],
               volumes=[{"volume": "pinned", "mountPath": "/data", "readOnly": True},
                        {"volume": "pinned", "mountPath": "/scratch"}])
    r = c.session().post(c.url(JOBS), json=body)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["spec"]["inputs"][0]["volume"] == {"name": "pinned"}, "the spec stays as written"
    assert created["status"]["inputs"] == [
        {"name": "data", "volumeRevision": 2, "sha256": revs[2]["sha256"]},
        {"name": "old", "volumeRevision": 1, "sha256": revs[1]["sha256"]},
    ]
    assert created["status"]["volumes"] == [
        {"volume": "pinned", "mountPath": "/data", "revision": 2, "sha256": revs[2]["sha256"]},
        {"volume": "pinned", "mountPath": "/scratch", "revision": 2, "sha256": revs[2]["sha256"]},
    ]

    (tree / "x.txt").write_text("three")
    c.run("nodus", "volume", "push", "pinned", str(tree))
    stored = c.session().get(c.url(f"{JOBS}/uses-volume")).json()
    assert stored["status"]["inputs"][0]["volumeRevision"] == 2, "a pin never moves"
    dry = c.session().post(c.url(JOBS), json=job("dry-volume", inputs=[{"name": "d", "volume": {"name": "pinned"}}]),
                           params={"dryRun": "All"})
    assert dry.status_code == 201 and dry.json()["status"]["inputs"][0]["volumeRevision"] == 3


def test_bad_volume_references_are_invalid(c: Coordinator) -> None:
    assert c.session().post(c.url(VOLUMES), json={"apiVersion": "nodus.dev/v1", "kind": "Volume",
                                                  "metadata": {"name": "empty-vol"},
                                                  "spec": {"description": "nothing yet"}}).status_code == 201
    c.run("nodus", "volume", "push", "small", str(make_tree(Path(c.data_dir.parent) / "small", {"f": "1"})))
    body = job("bad-refs", inputs=[{"name": "a", "volume": {"name": "no-such-volume"}},
                                   {"name": "b", "volume": {"name": "small", "revision": 7}},
                                   {"name": "c", "volume": {"name": "empty-vol"}}],
               volumes=[{"volume": "ghost", "mountPath": "/ghost", "readOnly": True}])
    r = c.session().post(c.url(JOBS), json=body)
    assert r.status_code == 422, r.text
    causes = {cause["field"]: cause for cause in r.json()["details"]["causes"]}
    assert causes["spec.inputs[0].volume.name"]["reason"] == "FieldValueNotFound"
    assert "no Ready revision 7 (latest: 1)" in causes["spec.inputs[1].volume.revision"]["message"]
    assert "nodus volume push empty-vol" in causes["spec.inputs[2].volume.name"]["message"]
    assert causes["spec.volumes[0].volume"]["reason"] == "FieldValueNotFound"


def test_push_refusals(c: Coordinator, tmp_path: Path) -> None:
    garbage = push_raw(c, "refused", b"this is not an archive")
    assert garbage.status_code == 400 and "not a tar.zst archive" in garbage.json()["message"]
    assert "revisions" not in (volume(c, "refused").get("status") or {}), "no revision for a bad upload"
    digest = hashlib.sha256(b"this is not an archive").hexdigest()
    assert not (c.data_dir / "blobs" / "sha256" / digest[:2] / digest[2:]).exists(), "its blob is dropped"

    escape = push_raw(c, "refused", tar_zst({"../outside.txt": b"x"}))
    assert escape.status_code == 400 and "leaves the volume" in escape.json()["message"]

    good = tar_zst({"ok.txt": b"fine"})
    wrong = push_raw(c, "refused", good, **{"X-Content-SHA256": "0" * 64})
    assert wrong.status_code == 422 and wrong.json()["reason"] == "DigestMismatch"

    media = c.session().post(c.url(f"{VOLUMES}/refused/revisions"), data=good,
                             headers={"Content-Type": "application/octet-stream"})
    assert media.status_code == 415 and "application/zstd" in media.json()["fix"]

    viewer = c.grpc_token("default", "viewer")
    denied = push_raw(c, "refused", good, token=viewer)
    assert denied.status_code == 403 and denied.json()["reason"] == "Forbidden"
    c.run("nodus", "project", "create", "vol-other")
    outsider = c.grpc_token("vol-other", "editor")
    assert push_raw(c, "refused", good, token=outsider).status_code == 403
    assert c.session(outsider).get(c.url(f"{VOLUMES}/corpus/revisions/1")).status_code == 403

    ok = push_raw(c, "refused", good, **{"X-Content-SHA256": hashlib.sha256(good).hexdigest()})
    assert ok.status_code == 201 and ok.json()["revision"] == 1 and ok.json()["files"] == 1


def test_concurrent_pushes_get_distinct_revisions(c: Coordinator) -> None:
    results: list[Any] = []

    def push(i: int) -> None:
        results.append(push_raw(c, "busy", tar_zst({"n.txt": str(i).encode()})))

    threads = [threading.Thread(target=push, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 201 for r in results), [r.text for r in results]
    assert sorted(r.json()["revision"] for r in results) == [1, 2, 3, 4, 5, 6]
    vol = volume(c, "busy")
    assert vol["status"]["latestRevision"] == 6 and len(vol["status"]["revisions"]) == 6


def test_kubectl_sees_volumes_and_deletes_them(c: Coordinator, tmp_path: Path) -> None:
    c.run("nodus", "volume", "push", "kube-vol", str(make_tree(tmp_path / "k", {"a": "1", "b": "2"})))
    table = c.run("kubectl", "get", "volumes").stdout
    header = table.splitlines()[0].split()
    assert header[:4] == ["NAME", "REVISION", "SIZE", "FILES"]
    row = next(line.split() for line in table.splitlines() if line.startswith("kube-vol "))
    assert row[1] == "1" and row[3] == "2"
    got = json.loads(c.run("kubectl", "get", "vol", "kube-vol", "-o", "json").stdout)
    assert got["status"]["revisions"][0]["files"] == 2
    assert "kube-vol" in c.run("nodus", "get", "volumes").stdout
    explain = c.run("kubectl", "explain", "volumes.status.revisions").stdout
    assert "immutable" in explain.lower() or "never change" in explain
    c.run("kubectl", "delete", "volume", "kube-vol")
    assert c.session().get(c.url(f"{VOLUMES}/kube-vol")).status_code == 404
