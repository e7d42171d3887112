"""Writable volumes (issue 16 item 3): a mount with readOnly: false starts from the Volume's latest revision
and, when the index succeeds, what the program left there becomes the next revision; two writers from the same
revision both get theirs (the later commit the next number), an attempt that fails commits nothing, and a later
Job mounting the Volume read-only sees the last commit. Real coordinator and agent, `nodus volume push`."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from conftest import Coordinator
from e2e import NS, attempts_of, create, settled, start_agent
from nodus.coordinator.volume_commits import pending_commits

pytestmark = pytest.mark.timeout(240)

VOLUMES = f"{NS}/volumes"
# Appends one line to the mounted volume's log.txt and writes a file named after the Job.
WRITE = ('import os, sys; d = os.environ["NODUS_VOLUME_DATA"]; '
         'open(os.path.join(d, "log.txt"), "a").write(sys.argv[1] + "\\n"); '
         'open(os.path.join(d, sys.argv[1] + ".txt"), "w").write("by " + sys.argv[1]); '
         'sys.exit(int(sys.argv[2]))')


def _volume(c: Coordinator) -> dict[str, Any]:
    r = c.session().get(c.url(f"{VOLUMES}/data"))
    assert r.status_code == 200, r.text
    return dict(r.json())


def _files(c: Coordinator, revision: int) -> dict[str, str]:
    r = c.session().get(c.url(f"{VOLUMES}/data/revisions/{revision}"))
    assert r.status_code == 200, r.text
    out = {}
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(r.content)) as raw, \
            tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            if member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                out[member.name.removeprefix("./")] = f.read().decode()
    return out


def test_pending_commits_are_the_unrecorded_volume_outputs_of_a_success() -> None:
    out = {"name": "nodus.volume.data", "sha256": "a" * 64, "size": 1}
    attempt = {"status": {"phase": "Succeeded", "outputs": [out, {"name": "outputs", "sha256": "b" * 64}]}}
    assert pending_commits(attempt) == [out]
    assert pending_commits({"status": {**attempt["status"], "phase": "Failed"}}) == []
    done = {"status": {**attempt["status"], "volumeCommits": [{"volume": "data", "revision": 2}]}}
    assert pending_commits(done) == []


def test_a_writable_mount_commits_the_next_revision_when_its_index_succeeds(coordinator: Coordinator,
                                                                            tmp_path: Path) -> None:
    c = coordinator
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "log.txt").write_text("seed\n")
    c.run("nodus", "volume", "push", "data", str(seed))
    mount = [{"volume": "data", "mountPath": "/data", "readOnly": False}]
    with start_agent(c, tmp_path / "agent"):
        create(c, "w1", command=["python3", "-c", WRITE, "w1", "0"], volumes=mount)
        create(c, "w2", command=["python3", "-c", WRITE, "w2", "0"], volumes=mount)
        create(c, "broken", command=["python3", "-c", WRITE, "broken", "3"], volumes=mount,
               backoffLimit=0)
        for name in ("w1", "w2"):
            assert settled(c, name, 120)["phase"] == "Succeeded"
        assert settled(c, "broken", 120)["phase"] == "Failed"

        def committed() -> dict[str, Any] | None:
            v = _volume(c)
            return v if (v.get("status") or {}).get("latestRevision") == 3 else None
        from agent_double import wait_for
        volume = wait_for(committed, 30, interval=0.2, what="both writers' revisions")
        revisions = {r["revision"]: r for r in volume["status"]["revisions"]}
        assert sorted(revisions) == [1, 2, 3], revisions
        writers = {revisions[2]["fromAttempt"].split("-")[0], revisions[3]["fromAttempt"].split("-")[0]}
        assert writers == {"w1", "w2"}, revisions
        assert "fromAttempt" not in revisions[1]  # the push
        for number in (2, 3):
            files = _files(c, number)
            writer = revisions[number]["fromAttempt"].split("-")[0]
            # Each started from revision 1 (the latest when it was admitted): the seed line, then its own.
            assert files["log.txt"] == f"seed\n{writer}\n", files
            assert files[f"{writer}.txt"] == f"by {writer}" and revisions[number]["files"] == 2
            assert "broken.txt" not in files
        for name in ("w1", "w2"):
            (a,) = attempts_of(c, name)
            commits = a["status"]["volumeCommits"]
            assert commits == [{"volume": "data",
                                "revision": next(n for n, r in revisions.items() if r.get("fromAttempt") ==
                                                 a["metadata"]["name"])}], commits
            assert not any(o["name"].startswith("nodus.") for o in settled(c, name).get("outputs") or [])
        (b,) = attempts_of(c, "broken")
        assert "volumeCommits" not in b["status"]

        # A reader of the latest revision sees the last commit.
        latest = _files(c, 3)
        create(c, "reader", command=["python3", "-c", 'import os; print(open(os.path.join('
                                     'os.environ["NODUS_VOLUME_DATA"], "log.txt")).read(), end="")'],
               volumes=[{"volume": "data", "mountPath": "/data", "readOnly": True}])
        assert settled(c, "reader", 120)["phase"] == "Succeeded"
        (r,) = attempts_of(c, "reader")
        log = c.run("nodus", "logs", "reader").stdout
        assert latest["log.txt"] in log, log
        assert _volume(c)["status"]["latestRevision"] == 3, "a read-only mount commits nothing"
