"""A Job's code through the daemons. source.git against a real repository served by `git daemon`:
admission resolves the branch to the commit it names (status.source.commit), every attempt checks out
exactly that commit even after the branch moved (a replacement of a failed attempt included), a tag
resolves to its commit, and a ref or repository that cannot be read is refused at admission naming
the field. source.blob: `nodus source push DIR` and `nodus apply -f JOB --source DIR` upload the
code, the Job runs it, and a blob this project never pushed is refused naming spec.source.blob."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Coordinator
from e2e import JOBS, attempts_of, create, ended, start_agent

PROGRAM = """
import os, sys
print(open("version.txt").read().strip(), flush=True)
marker = sys.argv[1]
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(1)
"""


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
                          ).stdout.strip()


def commit_version(work: Path, version: str) -> str:
    (work / "version.txt").write_text(version + "\n")
    git("add", "version.txt", cwd=work)
    git("commit", "-q", "-m", version, cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A bare repository `repo.git` served on loopback by git daemon, and a clone that pushes to it."""
    root = tmp_path / "served"
    root.mkdir()
    git("init", "-q", "--bare", "-b", "main", str(root / "repo.git"), cwd=tmp_path)
    git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=root / "repo.git")
    work = tmp_path / "work"
    git("clone", "-q", str(root / "repo.git"), str(work), cwd=tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={root}",
                               "--listen=127.0.0.1", f"--port={port}", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}/repo.git", work
    finally:
        daemon.terminate()
        daemon.wait(10)


def test_every_attempt_runs_the_commit_the_branch_named_at_admission(coordinator: Coordinator,
                                                                     served: tuple[str, Path],
                                                                     tmp_path: Path) -> None:
    url, work = served
    v1 = commit_version(work, "v1")
    git("tag", "-a", "-m", "release", "release-1", cwd=work)
    git("push", "-q", "origin", "release-1", cwd=work)
    marker = tmp_path / "failed-once"
    job = create(coordinator, "from-git", command=[sys.executable, "-c", PROGRAM, str(marker)], backoffLimit=1,
                 source={"git": {"repo": url, "ref": "main"}})
    assert job["status"]["source"] == {"commit": v1}
    v2 = commit_version(work, "v2")  # the branch moves after admission
    assert v2 != v1
    with start_agent(coordinator, tmp_path / "agent"):
        final = ended(coordinator, "from-git")
        assert final["status"]["phase"] == "Succeeded", final["status"]
        attempts = sorted(attempts_of(coordinator, "from-git"), key=lambda a: a["spec"]["number"])
        assert [a["status"]["phase"] for a in attempts] == ["Failed", "Succeeded"]
        logs = [coordinator.run("nodus", "logs", "from-git", "--attempt", str(n)).stdout for n in (1, 2)]
        assert logs == ["v1\n", "v1\n"], "both attempts, the replacement too, ran the admitted commit"

    tagged = create(coordinator, "from-tag", command=["true"], source={"git": {"repo": url, "ref": "release-1"}})
    assert tagged["status"]["source"] == {"commit": v1}, "an annotated tag is peeled to its commit"
    head = create(coordinator, "from-head", command=["true"], source={"git": {"repo": url}})
    assert head["status"]["source"] == {"commit": v2}

    r = coordinator.session().post(coordinator.url(JOBS), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "no-ref"},
        "spec": {"command": ["true"], "source": {"git": {"repo": url, "ref": "no-such-branch"}}}})
    assert r.status_code == 422, r.text
    [cause] = r.json()["details"]["causes"]
    assert cause["field"] == "spec.source.git.ref" and "'no-such-branch' is no branch or tag" in cause["message"]
    r = coordinator.session().post(coordinator.url(JOBS), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "no-repo"},
        "spec": {"command": ["true"], "source": {"git": {"repo": url.replace("repo.git", "missing.git")}}}})
    assert r.status_code == 422 and r.json()["details"]["causes"][0]["field"] == "spec.source.git.repo", r.text


def test_a_pushed_directory_is_the_jobs_code_and_an_unknown_one_is_refused(coordinator: Coordinator,
                                                                          tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "main.py").write_text("from pkg.words import WORD\nprint(WORD)\n")
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "words.py").write_text("WORD = 'pushed code runs'\n")
    pushed = coordinator.run("nodus", "source", "push", str(code))
    sha = pushed.stdout.strip()
    assert sha.startswith("sha256:") and len(sha) == 71, pushed.stdout
    again = coordinator.run("nodus", "source", "push", str(code))
    assert again.stdout.strip() == sha and "unchanged" in again.stderr, "the same tree is the same source"

    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"""apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: from-dir
spec:
  command: ["{sys.executable}", "main.py"]
""")
    with start_agent(coordinator, tmp_path / "agent"):
        coordinator.run("nodus", "apply", "-f", str(job_file), "--source", str(code))
        final = ended(coordinator, "from-dir")
        assert final["spec"]["source"] == {"blob": sha} and final["status"]["source"] == {"blob": sha}
        assert final["status"]["phase"] == "Succeeded", final["status"]
        assert coordinator.run("nodus", "logs", "from-dir").stdout == "pushed code runs\n"

    unknown = "sha256:" + "0" * 64
    r = coordinator.session().post(coordinator.url(JOBS), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "no-blob"},
        "spec": {"command": ["true"], "source": {"blob": unknown}}})
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"][0]["field"] == "spec.source.blob" and "nodus source push" in r.json()["fix"]
    coordinator.run("nodus", "project", "create", "other")
    r = coordinator.session().post(coordinator.url(JOBS.replace("/default/", "/other/")), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "theirs"},
        "spec": {"command": ["true"], "source": {"blob": sha}}})
    assert r.status_code == 422 and "pushed to project other" in r.text, "another project's push is not this one's"
