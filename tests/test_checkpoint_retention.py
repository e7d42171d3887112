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
from nodus.coordinator.controllers import recovery
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.cache import Cache, attempt_key, job_key
from nodus.coordinator.controllers.job import DeleteJob
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.controllers.views import AttemptView, JobView
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


def views(w: World) -> list[AttemptView]:
    return [AttemptView.from_object(a) for a in w.attempts.values()]


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
    assert recovery.storage_status(3 * GiB) == {"bytes": 3 * GiB, "billedBytes": 0}
    assert recovery.storage_status(0) is None


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
    assert not rules.released(JobView.from_object(job), "u1", 1e12), "no completionTime: never"
    assert rules.released(None, "u1", 0) and rules.released(JobView.from_object(job), "u0", 0), \
        "deleted, or recreated under a new uid"
    assert rules.released(JobView.from_object({**job, "metadata": {**job["metadata"], "deletionTimestamp": "x"}}),
                          "u1", 0)


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


async def _restart_scenario(path: Path) -> None:
    clock = ManualClock()
    store = await SqliteStore.open(path / "store.db")
    blobs = BlobStore(path)
    doomed = await blobs.put_bytes(b"checkpoint of a deleted job")
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
           "spec": {"command": ["true"]}, "status": {"phase": "Running"}}
    attempt = new_attempt(job, 0, 1, clock.now())
    attempt["status"] = {"phase": "Running", "checkpoints": [{"seq": 1, "sha256": doomed.sha256, "size": 27}]}
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    Retention(cache, objects, blobs, clock)
    await objects.create(attempt_key("default", attempt["metadata"]["name"]), attempt)
    # The Job was deleted by hand: its attempt goes with its records, and the coordinator stops
    # before any sweep ran.
    assert await objects.delete(attempt_key("default", attempt["metadata"]["name"]))
    await cache.stop()

    cache = Cache(store)  # restarted: the deleted attempt's archive is known only from the store
    await cache.start()
    await Retention(cache, Objects(store, cache), blobs, clock).sweep()
    assert await blobs.stat(doomed.sha256) is None, "the archive of the deleted attempt leaked"
    assert (await store.list("_retention/")).records == (), "the record is dropped once its archive is gone"
    await cache.stop()
    await store.close()


def test_the_archives_of_a_deleted_attempt_are_deleted_after_a_restart(tmp_path: Path) -> None:
    asyncio.run(_restart_scenario(tmp_path))


# -- superseded checkpoints, and checkpoints in customers' buckets ----------------------------------------

def running_with(w: World, shas: list[str], size: int = GiB, uri: str = "") -> str:
    """The Job's running attempt, after committing one checkpoint per digest (seq 1, 2, …)."""
    w.step()
    name = w.live()[0]
    w.run(name)
    for seq, sha in enumerate(shas, start=1):
        c = commit(w.attempts[name], seq, sha, size, w.clock.now())
        if uri:
            c = rules.Commit(**{**{f: getattr(c, f) for f in c.__dataclass_fields__},
                                "uri": f"{uri}{seq:010d}.manifest.json", "connection": "ckpt"})
        assert rules.refusal(w.attempts[name], list(w.attempts.values()), c) is None
        w.attempts[name] = {**w.attempts[name], "status": rules.with_commit(w.attempts[name]["status"], c)}
        w.clock.advance(600)
    return name


def test_a_long_run_keeps_its_newest_checkpoints_and_the_older_ones_are_deleted() -> None:
    w = World()
    shas = [f"{i:x}" * 64 for i in range(1, 12)]  # 11 checkpoints; the 2nd is the same bytes as the 11th
    shas[-1] = shas[1]
    name = running_with(w, shas)
    status = w.attempts[name]["status"]
    assert [c["seq"] for c in status["checkpoints"]] == list(range(4, 12))
    assert [c["seq"] for c in status[rules.SUPERSEDED]] == [1, 2, 3]
    w.step()
    assert w.status["storage"]["bytes"] == 8 * GiB, "only the checkpoints kept count"

    due = rules.release(lambda project, job: w.job, list(w.attempts.values()), [w.job], w.clock.now())
    assert due.attempts == () and due.trimmed == (("default", name, 3),)
    assert due.digests == (shas[0], shas[2]), "the 2nd's bytes are still the 11th's: kept"
    pushed_meanwhile = {**status, rules.SUPERSEDED: [*status[rules.SUPERSEDED], {"seq": 4, "sha256": "f" * 64}]}
    assert rules.without_superseded(pushed_meanwhile, upto=3)[rules.SUPERSEDED] == [{"seq": 4, "sha256": "f" * 64}], \
        "one pushed out while the sweep deleted waits for the next sweep"
    trimmed = rules.without_superseded(status, upto=3)
    assert trimmed is not None and rules.SUPERSEDED not in trimmed and len(trimmed["checkpoints"]) == 8
    w.attempts[name] = {**w.attempts[name], "status": trimmed}
    due = rules.release(lambda project, job: w.job, list(w.attempts.values()), [w.job], w.clock.now())
    assert due.trimmed == () and due.digests == (), "level-triggered: nothing left to do"


def test_checkpoints_in_the_customers_bucket_are_owned_not_billed_and_go_by_their_connection() -> None:
    w = World(connections=["ckpt"])
    prefix = "s3://b/nodus/default/train/0/att/"
    name = running_with(w, [f"{i:x}" * 64 for i in range(1, 11)], uri=prefix)
    w.step()
    assert recovery.storage_status(*recovery.storage_bytes(views(w), None), free=0) == \
        {"bytes": 8 * GiB, "billedBytes": 0}
    assert recovery.storage_status(*recovery.storage_bytes(views(w), [{"size": GiB}]), free=0) == \
        {"bytes": 9 * GiB, "billedBytes": GiB}, "outputs are held by Nodus"
    due = rules.release(lambda project, job: w.job, list(w.attempts.values()), [w.job], w.clock.now())
    assert due.digests == () and due.trimmed == (("default", name, 2),)
    assert due.s3 == (rules.S3Archive("default", "ckpt", prefix, 1), rules.S3Archive("default", "ckpt", prefix, 2))

    w.clock.advance(60)
    w.report(name, P.SUCCEEDED, exit_code=0)
    w.settle()
    w.clock.advance(168 * HOUR)
    due = rules.release(lambda project, job: w.job, list(w.attempts.values()), [w.job], w.clock.now())
    assert due.attempts == (("default", name),) and due.s3 == (rules.S3Archive("default", "ckpt", prefix, 0),), \
        "a released attempt's whole store goes (torn uploads too)"
    status = w.attempts[name]["status"]
    assert rules.without_checkpoints(status, keep={rules.S3Archive("default", "ckpt", prefix, 0)}) is None, \
        "a deletion to retry keeps its records"
    assert "checkpoints" not in (rules.without_checkpoints(status) or {})


async def _bucket_failures(path: Path) -> None:
    """The sweep against a real store, vault and Connection, with S3 deletions that fail in each way."""
    from nodus.checkpoint.errors import StoreError
    from nodus.coordinator.vault import Vault, load_or_create_key

    clock = ManualClock()
    store = await SqliteStore.open(path / "store.db")
    vault = Vault(store, load_or_create_key(path / "secret.key"))
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    await objects.create("connections/default/ckpt", {"kind": "Connection", "metadata": {"name": "ckpt"},
                                                      "spec": {"type": "S3", "s3": {"bucket": "b", "secret": "keys",
                                                                                    "endpoint": "http://s3.test"}}})
    await objects.create("secrets/default/keys", {"kind": "Secret", "metadata": {"name": "keys"},
                                                  "status": {"version": 1}})
    await vault.put("default", "keys", 1, {"accessKeyId": "QUtJQQ==", "secretAccessKey": "c2VjcmV0"})
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
           "spec": {"command": ["true"], "connections": ["ckpt"]},
           "status": {"phase": "Succeeded", "completionTime": rfc3339(clock.now() - 200 * HOUR)}}
    await objects.create(job_key("default", "j"), job)
    names = []
    for n, conn in enumerate(("ckpt", "ckpt", "gone"), start=1):
        attempt = new_attempt(job, 0, n, clock.now())
        attempt["status"] = {"phase": "Succeeded", "checkpoints": [
            {"seq": n, "sha256": "a" * 64, "size": 5, "connection": conn,
             "uri": f"s3://b/nodus/default/j/0/att-{n}/{n:010d}.manifest.json"}]}
        await objects.create(attempt_key("default", attempt["metadata"]["name"]), attempt)
        names.append(attempt["metadata"]["name"])

    calls: list[tuple[rules.S3Archive, dict[str, str]]] = []
    outcome = {"att-1": StoreError("deleting: SlowDown: reduce your request rate"),
               "att-2": StoreError("deleting: AccessDenied: no")}
    outcome["att-2"].retryable = False

    def delete(archive: rules.S3Archive, fields: dict[str, str]) -> None:
        calls.append((archive, fields))
        error = next((e for k, e in outcome.items() if f"/{k}/" in archive.prefix), None)
        if error is not None:
            raise error

    retention = Retention(cache, objects, None, clock, vault, delete=delete)  # type: ignore[arg-type]
    await retention.sweep()
    assert [a.prefix for a, _ in calls] == ["s3://b/nodus/default/j/0/att-1/", "s3://b/nodus/default/j/0/att-2/"], \
        "no keys for a Connection that is gone: nothing to call"
    assert calls[0][1] == {"endpoint": "http://s3.test", "accessKeyId": "AKIA", "secretAccessKey": "secret"}
    left = {n: bool((cache.get(attempt_key("default", n)) or {})["status"].get("checkpoints")) for n in names}
    assert left == {names[0]: True, names[1]: False, names[2]: False}, \
        "a throttled deletion is retried; refused keys and a deleted Connection cannot ever delete: dropped"

    outcome.clear()
    calls.clear()
    await retention.sweep()
    assert [a.prefix for a, _ in calls] == ["s3://b/nodus/default/j/0/att-1/"]
    assert not (cache.get(attempt_key("default", names[0])) or {})["status"].get("checkpoints")
    await cache.stop()
    await store.close()


def test_deletions_in_a_bucket_are_retried_only_when_they_can_succeed(tmp_path: Path) -> None:
    asyncio.run(_bucket_failures(tmp_path))


async def _forgotten_after_a_failed_delete(path: Path) -> None:
    clock = ManualClock()
    store = await SqliteStore.open(path / "store.db")
    blobs = BlobStore(path)
    refs = [await blobs.put_bytes(f"checkpoint {i}".encode()) for i in range(3)]
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "gone", "namespace": "default",
                                                                     "uid": "u9"}, "spec": {"command": ["true"]}}
    attempt = new_attempt(job, 0, 1, clock.now())
    attempt["status"] = {"phase": "Running", "checkpoints": [{"seq": i + 1, "sha256": r.sha256, "size": r.size}
                                                             for i, r in enumerate(refs)]}
    key = attempt_key("default", attempt["metadata"]["name"])
    await objects.create(key, attempt)

    class Flaky:
        """The blob store, failing the first delete (a disk error)."""
        failed = False

        async def delete(self, sha256: str) -> bool:
            if not Flaky.failed:
                Flaky.failed = True
                raise OSError("injected: the disk said no")
            return await blobs.delete(sha256)

    retention = Retention(cache, objects, Flaky(), clock)  # type: ignore[arg-type]
    await objects.delete(key)  # its Job was deleted: the attempt goes with its records
    try:
        await retention.sweep()
    except OSError:
        pass
    assert [await blobs.stat(r.sha256) is not None for r in refs] == [True] * 3
    await retention.sweep()
    assert [await blobs.stat(r.sha256) for r in refs] == [None] * 3, "the next sweep deletes every one of them"
    await cache.stop()
    await store.close()


def test_archives_of_deleted_attempts_survive_a_failed_delete_until_the_next_sweep(tmp_path: Path) -> None:
    asyncio.run(_forgotten_after_a_failed_delete(tmp_path))
