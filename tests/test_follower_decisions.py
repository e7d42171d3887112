"""A Job created through a follower is created with its first decision too (ADR 0122): the follower decides it
and writes the Job, Queued, and its first attempt in one commit under the epoch its last claim of the lease saw;
the leader's reconcile finds nothing to write. A follower that has not seen a takeover yet writes under the old
epoch, the store refuses the group whole, and the create falls back to the plain one, which the leader decides:
one 201, one Job, one attempt.

Two coordinator replicas on tests/postgres.py's throwaway cluster, controllers on, no node: every Job waits.
"""
from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import Coordinator, job
from postgres import postgres_cluster  # noqa: F401 - the session fixture
from test_create_first import ATTEMPTS, JOBS, created_once, watch
from test_durability import wait_for
from test_replicas import LEASE, replicas, status

pytestmark = pytest.mark.slow


def epochs(url: str, revisions: list[int]) -> list[int | None]:
    """The lease epoch each revision was committed under (log.epoch; NULL: an unfenced write)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT revision, epoch FROM log WHERE revision = ANY(%s) ORDER BY revision",
                            (revisions,)).fetchall()
    assert [r for r, _ in rows] == sorted(revisions)
    return [e for _, e in rows]


def attempts_of(c: Coordinator, name: str) -> list[dict[str, Any]]:
    listed = c.session().get(c.url(ATTEMPTS)).json()["items"]
    return [a for a in listed if a["spec"]["job"] == name]


def test_a_create_on_a_follower_is_one_commit_under_the_leaders_epoch(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    a, b = replicas(tmp_path, url, monkeypatch, 2)
    try:
        wait_for(lambda: [status(r).get("role") for r in (a, b)] == ["leader", "follower"], 30, "a leading")
        wait_for(lambda: status(b).get("epoch") == "1", 10, "b to see epoch 1")
        s = a.session()
        rv = s.get(a.url(JOBS)).json()["metadata"]["resourceVersion"]
        jobs: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        # Watched through the leader, whose Job controller reconciles what the follower wrote.
        threads = [watch(a, JOBS, rv, "metadata.name=f-1", 8, jobs), watch(a, ATTEMPTS, rv, "", 8, attempts)]
        made = b.session().post(b.url(JOBS), json=job("f-1"))
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["status"]["phase"] == "Queued"
        assert body["status"]["message"].startswith("waiting for capacity: ")
        for t in threads:
            t.join(20)
        # One ADDED, the object the follower's 201 answered: the leader's reconcile wrote no status after it.
        created_once(jobs, attempts, body)
        job_rv = int(body["metadata"]["resourceVersion"])
        assert s.get(a.url(f"{JOBS}/f-1")).json() == body
        # Both written under the lease's epoch, as the leader's own decisions are.
        assert epochs(url, [job_rv, job_rv + 1]) == [1, 1]
    finally:
        for r in (a, b):
            r.kill()


def test_a_follower_that_has_not_seen_a_takeover_falls_back_to_the_plain_create(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    a, = replicas(tmp_path, url, monkeypatch, 1)
    data = tmp_path / "r1"
    data.mkdir(mode=0o700)
    shutil.copytree(a.data_dir / "tls", data / "tls")
    shutil.copy2(a.data_dir / "secret.key", data / "secret.key")
    # b claims once at its start and then every 30 s: it goes on writing under the epoch it saw first.
    b = Coordinator(data).start(extra_args=("--leader-lease", "60s", "--leader-renew-interval", "30s"))
    try:
        wait_for(lambda: [status(r).get("role") for r in (a, b)] == ["leader", "follower"], 30, "a leading")
        assert status(b)["epoch"] == "1"
        before = b.session().post(b.url(JOBS), json=job("f-1"))  # decided by b while its epoch is the lease's
        assert before.status_code == 201 and before.json()["status"]["phase"] == "Queued", before.text
        with psycopg.connect(url, autocommit=True) as conn:  # a takeover, as far as b's fence is concerned
            conn.execute("UPDATE lease SET epoch = epoch + 1 WHERE name = 'controllers'")
        made = b.session().post(b.url(JOBS), json=job("f-2"))
        assert made.status_code == 201, made.text
        body = made.json()
        assert status(b)["epoch"] == "1"  # b wrote under epoch 1: refused, and created the Job plainly
        assert "phase" not in (body.get("status") or {}), body
        job_rv = int(body["metadata"]["resourceVersion"])
        assert epochs(url, [job_rv]) == [None]
        # The leader (at epoch 2 after its next claim) decides it: one attempt, the Job Queued.
        wait_for(lambda: status(a).get("epoch") == "2", 10, "a to lead at epoch 2")
        wait_for(lambda: len(attempts_of(a, "f-2")) == 1, 30, "the leader's attempt for f-2")
        wait_for(lambda: (a.session().get(a.url(f"{JOBS}/f-2")).json().get("status") or {}).get("phase") == "Queued",
                 30, "f-2 Queued")
        stored = a.session().get(a.url(f"{JOBS}/f-2")).json()
        assert stored["metadata"]["uid"] == body["metadata"]["uid"]
        listed = a.session().get(a.url(JOBS)).json()["items"]
        assert collections.Counter(i["metadata"]["name"] for i in listed)["f-2"] == 1
        assert len(attempts_of(a, "f-2")) == 1
    finally:
        for r in (a, b):
            r.kill()
