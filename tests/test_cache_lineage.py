"""The cache's attempts by Job index (ADR 0109): an index's lineage, which an assignment's restore and the
checkpoint cadence read, is found without walking every attempt of the Job, and it follows the cache."""
from __future__ import annotations

from typing import Any, cast

from nodus.coordinator import checkpoints as store
from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.cache import Cache, attempt_key
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.store.base import Store
from nodus.v1 import agent_pb2

JOB = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "p", "uid": "u1"},
       "spec": {"command": ["true"], "completions": 3, "parallelism": 3}}


class Revisions:
    def __init__(self, cache: Cache) -> None:
        self.cache, self.next = cache, 1

    def put(self, obj: dict[str, Any] | None, name: str) -> None:
        self.next += 1
        self.cache.apply(attempt_key("p", name), obj, self.next)


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def test_an_index_lineage_holds_its_own_attempts_and_follows_updates_and_deletes() -> None:
    cache, now = Cache(cast(Store, None)), ManualClock().now()
    w = Revisions(cache)
    made = {a["metadata"]["name"]: a for a in (new_attempt(JOB, i, n, now) for i, n in ((0, 1), (1, 1), (0, 2), (2, 1)))}
    for name, obj in made.items():
        w.put(obj, name)
    other = new_attempt({**JOB, "metadata": {**JOB["metadata"], "name": "train-0"}}, 0, 1, now)  # a name's prefix
    w.put(other, other["metadata"]["name"])
    assert names(cache.attempts_of_index("p", "train", 0)) == ["train-0-1", "train-0-2"]
    assert names(cache.attempts_of_index("p", "train", 1)) == ["train-1-1"]
    assert names(cache.attempts_of_index("p", "train-0", 0)) == ["train-0-0-1"]
    assert cache.attempts_of_index("p", "train", 5) == [] and cache.attempts_of_index("q", "train", 0) == []

    w.put({**made["train-0-2"], "status": {"phase": "Running"}}, "train-0-2")  # a new revision: still there once
    assert [o.get("status", {}).get("phase") for o in cache.attempts_of_index("p", "train", 0)] == ["Pending", "Running"]
    w.put(None, "train-0-1")
    w.put(None, "train-1-1")
    assert names(cache.attempts_of_index("p", "train", 0)) == ["train-0-2"]
    assert cache.attempts_of_index("p", "train", 1) == []
    # The Job's own view is unchanged by the index: every attempt that is left.
    assert names(cache.attempts_of("p", "train")) == ["train-0-2", "train-2-1"]


def test_a_replacement_restores_its_index_checkpoint_from_the_lineage_not_another_index() -> None:
    cache, now = Cache(cast(Store, None)), ManualClock().now()
    w = Revisions(cache)
    first, neighbour = new_attempt(JOB, 0, 1, now), new_attempt(JOB, 1, 1, now)
    first["status"] = {"phase": "Lost", "checkpoints": [{"seq": 3, "sha256": "3" * 64, "size": 10}]}
    neighbour["status"] = {"phase": "Running", "checkpoints": [{"seq": 9, "sha256": "9" * 64, "size": 10}]}
    second = new_attempt(JOB, 0, 2, now)
    for obj in (first, neighbour, second):
        w.put(obj, obj["metadata"]["name"])
    out = agent_pb2.Assignment(attempt_id=second["spec"]["id"])
    store.prepare(out, second, JOB, cache.attempts_of_index("p", "train", 0))
    assert out.restore_from.seq == 3 and out.restore_from.sha256 == "3" * 64
    fresh = agent_pb2.Assignment(attempt_id=neighbour["spec"]["id"])
    store.prepare(fresh, neighbour, JOB, cache.attempts_of_index("p", "train", 1))
    assert not fresh.HasField("restore_from"), "its own checkpoint is no restore of its own"


def test_a_jobs_attempts_and_views_keep_their_order_and_follow_new_revisions() -> None:
    """attempts_of and attempt_views_of keep the keys' sorted order while it is cached (ADR 0109): an attempt
    created or deleted shows at once, and a new revision of one shows its new value and view."""
    cache, now = Cache(cast(Store, None)), ManualClock().now()
    w = Revisions(cache)
    for i in (2, 0, 10):
        a = new_attempt(JOB, i, 1, now)
        w.put(a, a["metadata"]["name"])
    assert names(cache.attempts_of("p", "train")) == ["train-0-1", "train-10-1", "train-2-1"]
    assert [v.name for v in cache.attempt_views_of("p", "train")] == ["train-0-1", "train-10-1", "train-2-1"]
    ran = new_attempt(JOB, 1, 1, now)
    w.put(ran, "train-1-1")
    w.put(None, "train-10-1")
    assert [v.name for v in cache.attempt_views_of("p", "train")] == ["train-0-1", "train-1-1", "train-2-1"]
    w.put({**ran, "status": {"phase": "Succeeded", "exitCode": 0}}, "train-1-1")
    assert [v.phase.value for v in cache.attempt_views_of("p", "train")] == ["Pending", "Succeeded", "Pending"]
    assert [(a.get("status") or {}).get("phase") for a in cache.attempts_of("p", "train")] == \
        ["Pending", "Succeeded", "Pending"]
    for name in ("train-0-1", "train-1-1", "train-2-1"):
        w.put(None, name)
    assert cache.attempts_of("p", "train") == [] and cache.attempt_views_of("p", "train") == []
    again = new_attempt(JOB, 3, 1, now)  # the same Job name later: its new attempt is found
    w.put(again, "train-3-1")
    assert names(cache.attempts_of("p", "train")) == ["train-3-1"]
