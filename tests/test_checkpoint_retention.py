"""Checkpoints of finished Jobs: kept `retainAfterFinish` (default 168h) after completionTime, then
deleted (archives first, then the records on the Attempts); a Job deleted by its TTL loses its
checkpoints first; status.checkpoint and status.storage (bytes, billedBytes) follow, on a stepped
clock. The sweep is level-triggered: a coordinator restarted half-way finishes the work."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_job_controller import World

from nodus.coordinator.blobs import BlobStore
from nodus.coordinator.checkpoints import Retention
from nodus.coordinator.clock import ManualClock, rfc3339
from nodus.coordinator.controllers import checkpoints as rules
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.job import DeleteJob
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.store import SqliteStore

P = AttemptPhase
HOUR = 3600.0
GiB = 2**30


def commit(attempt: dict[str, Any], seq: int, sha: str, size: int, t: float) -> rules.Commit:
    return rules.Commit(attempt_id=attempt["spec"]["id"], job_uid=attempt["spec"]["jobUID"], seq=seq, sha256=sha,
                        size=size, uri="blob://sha256/" + sha, time=t, pause=0.1, reason="Periodic")


def finished_with_checkpoints(**spec: Any) -> tuple[World, str]:
    """A Job whose one attempt committed two checkpoints (4 GiB and 8 GiB) and then succeeded."""
    w = World(**spec)
    w.step()
    name = w.live()[0]
    w.run(name)
    for seq, (sha, size) in enumerate((("a" * 64, 4 * GiB), ("b" * 64, 8 * GiB)), start=1):
        c = commit(w.attempts[name], seq, sha, size, w.clock.now())
        assert rules.refusal(w.attempts[name], list(w.attempts.values()), c) is None
        w.attempts[name] = {**w.attempts[name], "status": rules.with_commit(w.attempts[name]["status"], c)}
    w.clock.advance(60)
    w.report(name, P.SUCCEEDED, exit_code=0)
    w.settle()
    assert w.status["phase"] == "Succeeded"
    return w, name


def drop_released(w: World) -> rules.Release:
    """What the sweep does to the stored objects (the blob deletions aside)."""
    assert w.job is not None
    due = rules.release(lambda project, name: w.job, list(w.attempts.values()), [w.job], w.clock.now())
    for _, name in due.attempts:
        status = rules.without_checkpoints(w.attempts[name]["status"])
        if status is not None:
            w.attempts[name] = {**w.attempts[name], "status": status}
    return due


def test_storage_bills_what_is_above_the_free_inclusion() -> None:
    w, _ = finished_with_checkpoints()
    assert w.status["storage"] == {"bytes": 12 * GiB, "billedBytes": 12 * GiB - rules.FREE_STORAGE_BYTES}
    assert rules.storage_status(3 * GiB) == {"bytes": 3 * GiB, "billedBytes": 0}
    assert rules.storage_status(0) is None


def test_checkpoints_are_kept_168h_after_the_job_finished_then_released() -> None:
    w, name = finished_with_checkpoints()
    finished = w.clock.now()
    d = w.step()
    assert d.wake_at == finished + 168 * HOUR, "the Job controller wakes when retention ends"
    assert w.status["checkpoint"]["seq"] == 2
    assert drop_released(w).attempts == (), "nothing goes before its time"

    w.clock.advance(168 * HOUR - 1)
    assert w.settle().wake_at == finished + 168 * HOUR and w.status["checkpoint"]["seq"] == 2
    w.clock.advance(1)
    w.step()
    assert "checkpoint" not in w.status and "storage" not in w.status, "the status says they are gone at once"

    due = drop_released(w)
    assert due.attempts == (("default", name),) and due.digests == ("a" * 64, "b" * 64) and due.bytes == 12 * GiB
    assert "checkpoints" not in w.attempts[name]["status"]
    assert drop_released(w).attempts == (), "level-triggered: nothing left to do"
    d = w.settle()
    assert d.wake_at is None and "storage" not in w.status


def test_retain_after_finish_is_the_specs() -> None:
    w, _ = finished_with_checkpoints(recovery={"maxAttempts": 3, "checkpoint": {"retainAfterFinish": "2h"}})
    w.clock.advance(2 * HOUR)
    w.step()
    assert "checkpoint" not in w.status and drop_released(w).digests == ("a" * 64, "b" * 64)


def test_the_ttl_deletes_the_checkpoints_before_the_job() -> None:
    w, name = finished_with_checkpoints(ttlSecondsAfterFinished=600)
    w.clock.advance(600)
    d = w.step()
    assert not any(isinstance(a, DeleteJob) for a in d.actions), "not while its checkpoints are stored"
    assert w.job is not None and "checkpoint" not in w.status
    assert d.wake_at == w.clock.now() + rules.RELEASE_GRACE
    assert drop_released(w).digests == ("a" * 64, "b" * 64)
    w.step()
    assert w.job is None, "deleted once its checkpoints are"


def test_a_job_past_its_ttl_is_deleted_anyway_when_no_sweep_runs() -> None:
    w, _ = finished_with_checkpoints(ttlSecondsAfterFinished=600)
    w.clock.advance(600 + rules.RELEASE_GRACE)
    w.step()
    assert w.job is None


def test_an_archive_another_checkpoint_still_names_is_kept() -> None:
    w, name = finished_with_checkpoints()
    other = new_attempt({"metadata": {"name": "other", "namespace": "default", "uid": "uid-2"}, "spec": {}},
                        0, 1, w.clock.now())
    other["status"]["checkpoints"] = [{"seq": 1, "sha256": "b" * 64, "size": 8 * GiB}]  # the same bytes
    jobs = {"train": w.job, "other": {"metadata": {"name": "other", "uid": "uid-2"}, "spec": {}, "status": {}}}
    w.clock.advance(168 * HOUR)
    due = rules.release(lambda project, job: jobs.get(job), [*w.attempts.values(), other], list(jobs.values()),
                        w.clock.now())
    assert due.attempts == (("default", name),) and due.digests == ("a" * 64,) and due.bytes == 4 * GiB


def test_a_running_job_keeps_its_checkpoints_and_a_gone_one_does_not() -> None:
    job = {"metadata": {"name": "j", "namespace": "default", "uid": "u1"}, "spec": {}, "status": {}}
    assert not rules.released(job, "u1", 1e12), "no completionTime: never"
    assert rules.released(None, "u1", 0) and rules.released(job, "u0", 0), "deleted, or recreated under a new uid"
    assert rules.released({**job, "metadata": {**job["metadata"], "deletionTimestamp": "x"}}, "u1", 0)


# -- the sweep against a real store and blob store --------------------------------------------------------

async def _sweep_scenario(path: Path) -> None:
    clock = ManualClock()
    store = await SqliteStore.open(path / "store.db")
    blobs = BlobStore(path)
    kept, going = await blobs.put_bytes(b"checkpoint one"), await blobs.put_bytes(b"checkpoint two")
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job",
           "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
           "spec": {"command": ["true"], "recovery": {"checkpoint": {"retainAfterFinish": "1h"}}},
           "status": {"phase": "Succeeded", "completionTime": rfc3339(clock.now())}}
    attempt = new_attempt(job, 0, 1, clock.now())
    attempt["status"] = {"phase": "Succeeded", "checkpoints": [
        {"seq": 1, "sha256": going.sha256, "size": going.size}]}
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    await objects.create(job_key("default", "j"), job)
    key = attempt_key("default", attempt["metadata"]["name"])
    await objects.create(key, attempt)
    retention = Retention(cache, objects, blobs, clock)
    assert (await retention.sweep()).attempts == ()
    assert await blobs.stat(going.sha256) is not None

    clock.advance(3600)
    # The coordinator stops after deleting the archive, before dropping the record.
    assert await blobs.delete(going.sha256)
    await cache.stop()

    cache = Cache(store)  # restarted: everything it needs is in the store
    await cache.start()
    objects = Objects(store, cache)
    due = await Retention(cache, objects, blobs, clock).sweep()
    assert due.attempts == (("default", attempt["metadata"]["name"]),)
    assert "checkpoints" not in (cache.get(key) or {})["status"]
    assert await blobs.stat(kept.sha256) is not None

    # A Job deleted by hand takes its attempts and their records at once; the archives follow.
    other = {**job, "metadata": {"name": "k", "namespace": "default", "uid": "u2"}, "status": {"phase": "Running"}}
    doomed = await blobs.put_bytes(b"checkpoint three")
    attempt = new_attempt(other, 0, 1, clock.now())
    attempt["status"] = {"phase": "Running", "checkpoints": [{"seq": 1, "sha256": doomed.sha256, "size": 16},
                                                             {"seq": 2, "sha256": kept.sha256, "size": 14}]}
    holder = new_attempt(job, 0, 2, clock.now())
    holder["status"] = {"phase": "Running", "outputs": [{"name": "m", "sha256": kept.sha256}]}
    retention = Retention(cache, objects, blobs, clock)
    await objects.create(attempt_key("default", attempt["metadata"]["name"]), attempt)
    await objects.create(attempt_key("default", holder["metadata"]["name"]), holder)
    await objects.delete(attempt_key("default", attempt["metadata"]["name"]))
    await retention.sweep()
    assert await blobs.stat(doomed.sha256) is None
    assert await blobs.stat(kept.sha256) is not None, "still named by another object"
    await cache.stop()
    await store.close()


def test_the_sweep_deletes_archives_then_records_and_survives_a_restart(tmp_path: Path) -> None:
    asyncio.run(_sweep_scenario(tmp_path))
