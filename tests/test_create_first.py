"""A Job created with its first decision (ADR 0108): the Job, already Queued with the reason it waits, and its
first attempt are one commit; a watcher of Jobs sees one ADDED and nothing more from the controllers; a refused
create-together falls back to the plain create (the store's creates-together themselves: tests/test_store.py, on
both engines)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import orjson
import pytest

from conftest import Coordinator, job
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.controllers.job_controller import FirstDecision
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.store.base import Record
from nodus.coordinator.store.lease import Fence
from nodus.coordinator.vault import Vault, load_or_create_key

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
ATTEMPTS = "/apis/nodus.dev/v1/namespaces/default/attempts"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """Controllers on and no node: every Job waits for capacity."""
    with Coordinator(tmp_path_factory.mktemp("first") / "data").start() as c:
        yield c


def watch(c: Coordinator, path: str, rv: str, selector: str, seconds: int, out: list[dict[str, Any]]) -> threading.Thread:
    def consume() -> None:
        with c.session().get(c.url(path), params={"watch": "true", "resourceVersion": rv, "fieldSelector": selector,
                                                  "timeoutSeconds": str(seconds)}, stream=True) as resp:
            out.extend(orjson.loads(line) for line in resp.iter_lines() if line)
    t = threading.Thread(target=consume)
    t.start()
    return t


def created_once(jobs: list[dict[str, Any]], attempts: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    """What watchers of a Job created with its first decision were sent (ADR 0108): one ADDED of the Job, the
    object its 201 answered, and no MODIFIED from the controllers afterwards (their decision is the one it was
    created with); one ADDED of its attempt, at the next revision (the same commit). Returns the attempt."""
    assert [e["type"] for e in jobs] == ["ADDED"], jobs
    assert jobs[0]["object"] == body
    mine = [e for e in attempts if e["object"]["spec"]["job"] == body["metadata"]["name"]]
    assert [e["type"] for e in mine] == ["ADDED"], mine
    attempt: dict[str, Any] = mine[0]["object"]
    assert int(attempt["metadata"]["resourceVersion"]) == int(body["metadata"]["resourceVersion"]) + 1
    assert attempt["spec"]["jobUID"] == body["metadata"]["uid"]
    return attempt


def test_a_job_is_created_queued_with_its_attempt_and_watched_once(c: Coordinator) -> None:
    s = c.session()
    rv = s.get(c.url(JOBS)).json()["metadata"]["resourceVersion"]
    jobs: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    threads = [watch(c, JOBS, rv, "metadata.name=first-1", 8, jobs), watch(c, ATTEMPTS, rv, "", 8, attempts)]
    made = s.post(c.url(JOBS), json=job("first-1"))
    assert made.status_code == 201, made.text
    body = made.json()
    # The 201 answers the Job as stored: already Queued, saying why it waits, its first attempt counted.
    assert body["status"]["phase"] == "Queued"
    assert body["status"]["message"].startswith("waiting for capacity: ")
    assert body["status"]["attempts"]["total"] == 1 and body["status"]["active"] == 1
    for t in threads:
        t.join(20)
    attempt = created_once(jobs, attempts, body)
    assert attempt["status"]["phase"] == "Pending"
    assert body["status"]["message"] == "waiting for capacity: " + attempt["status"]["placement"]["explain"]
    assert s.get(c.url(f"{JOBS}/first-1")).json() == body


def test_a_job_created_suspended_is_left_to_the_controller(c: Coordinator) -> None:
    s = c.session()
    made = s.post(c.url(JOBS), json=job("first-suspended", state="Suspended"))
    assert made.status_code == 201, made.text
    assert "phase" not in (made.json().get("status") or {})  # no first decision folded in: it creates nothing
    for _ in range(100):
        got = s.get(c.url(f"{JOBS}/first-suspended")).json()
        if (got.get("status") or {}).get("phase") == "Suspended":
            break
        threading.Event().wait(0.1)
    assert got["status"]["phase"] == "Suspended"
    names = [a["metadata"]["name"] for a in s.get(c.url(ATTEMPTS)).json()["items"]]
    assert not any(n.startswith("first-suspended") for n in names)



class FoldingDecider:
    """A Job controller's stand-in: every Job's first decision is Queued with one attempt (its name fixed)."""

    fence: Fence | None = None

    def __init__(self) -> None:
        self.written: list[list[str]] = []

    def decide_first(self, project: str, job: dict[str, Any]) -> FirstDecision:
        attempt = {"apiVersion": "nodus.dev/v1", "kind": "Attempt",
                   "metadata": {"name": "again-0-1", "namespace": project},
                   "spec": {"job": job["metadata"]["name"], "jobUID": job["metadata"]["uid"]}}
        return FirstDecision({**(job.get("status") or {}), "phase": "Queued"}, {"attempts/default/again-0-1": attempt},
                             None)

    def first_written(self, records: Sequence[Record], first: FirstDecision, job: dict[str, Any]) -> None:
        self.written.append([r.key for r in records])


def test_a_refused_commit_falls_back_to_the_plain_create(tmp_path: Path) -> None:
    async def test() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            identity = Identity(store)
            await identity.ensure_project("default")
            service = ResourceService(store, identity, Vault(store, load_or_create_key(tmp_path / "secret.key")))
            decider = FoldingDecider()
            service.first_decisions = decider
            # An attempt of a deleted Job of the same name, not collected yet: the Job and its first decision cannot
            # be written together, and the create is answered as without them, not refused.
            leftover = b'{"metadata":{"name":"again-0-1"},"spec":{"job":"again","jobUID":"old"}}'
            await store.create("attempts/default/again-0-1", leftover)
            made, _ = await service.create(SYSTEM, resolve("jobs"), "default", job("again"), owned=True)
            assert "phase" not in (made.get("status") or {}) and decider.written == []
            stored = await store.get("jobs/default/again")
            assert stored is not None and orjson.loads(stored.value).get("status") == made.get("status")
            left = await store.get("attempts/default/again-0-1")
            assert left is not None and left.value == leftover
            # Without it, the same create writes the Job Queued and the attempt in one commit, and says so.
            await store.delete("attempts/default/again-0-1")
            await store.delete("jobs/default/again")
            made, _ = await service.create(SYSTEM, resolve("jobs"), "default", job("again"), owned=True)
            assert made["status"]["phase"] == "Queued"
            assert decider.written == [["jobs/default/again", "attempts/default/again-0-1"]]
            attempt = await store.get("attempts/default/again-0-1")
            assert attempt is not None and attempt.revision == int(made["metadata"]["resourceVersion"]) + 1
        finally:
            await store.close()
    asyncio.run(asyncio.wait_for(test(), 30))


def test_the_cache_holds_what_the_first_commit_stored(tmp_path: Path) -> None:
    """The Job controller's cache takes the Job and its first attempt as the create wrote them (ADR 0114: the
    documents, not the bytes decoded again): each equal to what the store holds, at the store's revision, so
    the controllers read the same objects as after a restart's list."""
    from job_harness import PROJECT, JobHarness
    from nodus.coordinator.controllers.cache import decode
    from nodus.coordinator.controllers.objects import encode as encode_object, new_uid
    from nodus.coordinator.stored import encode

    async def test() -> None:
        h = await JobHarness.open(tmp_path)
        try:
            job = {"apiVersion": "nodus.dev/v1", "kind": "Job",
                   "metadata": {"name": "kept", "namespace": PROJECT, "uid": new_uid(), "generation": 1},
                   "spec": {"completions": 1, "parallelism": 1, "command": ["true"]}}
            first = h.controller.decide_first(PROJECT, job)
            assert first is not None and first.attempts
            job["status"] = first.status
            records = await h.store.create_together(
                [("jobs/default/kept", encode(job)), *((k, encode_object(a)) for k, a in first.attempts.items())])
            h.controller.first_written(records, first, job)
            for rec in records:
                stored = await h.store.get(rec.key)
                assert stored is not None and stored.revision == rec.revision
                assert h.cache.get(rec.key) == decode(rec.key, stored.value, stored.revision)
                assert h.cache.revision(rec.key) == rec.revision
            assert job["metadata"]["resourceVersion"] == str(records[0].revision)
        finally:
            await h.close()
    asyncio.run(asyncio.wait_for(test(), 30))
