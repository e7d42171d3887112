"""The PostgreSQL store's group commit planned in memory (store/pg_batch.py): the writes of one batch
apply in order, each seeing the ones before it, and the kv rows written are each key's final state."""
from __future__ import annotations

import asyncio

from nodus.coordinator.store.lease import Fence
from nodus.coordinator.store.pg_batch import DELETE, PUT, plan
from nodus.coordinator.store.writes import Write, WriteKind

LOOP = asyncio.new_event_loop()
"""Only to make the writes' futures; nothing runs on it."""


def w(kind: WriteKind, key: str, value: bytes = b"", expected: int | None = None, fence: Fence | None = None) -> Write:
    return Write(kind, key, value, expected, LOOP.create_future(), fence)


def test_later_writes_of_a_batch_see_the_earlier_ones_and_kv_gets_each_final_state() -> None:
    writes = [w(WriteKind.CREATE, "jobs/a", b"1"), w(WriteKind.UPDATE, "jobs/a", b"2", expected=11),
              w(WriteKind.CREATE, "jobs/a", b"x"),  # already exists within the batch
              w(WriteKind.DELETE, "jobs/b"), w(WriteKind.CREATE, "jobs/b", b"new"),
              w(WriteKind.UPDATE, "jobs/c", b"c2", expected=3),  # stale: c is at 5
              w(WriteKind.DELETE, "jobs/d")]
    p = plan(writes, {"jobs/b": (b"old", 4, 2), "jobs/c": (b"c1", 5, 5), "jobs/d": (b"d", 6, 6)}, 10, {})
    assert p.revision == 15
    results = [(r.key, r.value, r.revision, r.create_revision) if r else e.reason for _, r, e in p.outcomes]  # type: ignore[union-attr]
    assert results == [("jobs/a", b"1", 11, 11), ("jobs/a", b"2", 12, 11), "AlreadyExists",
                       ("jobs/b", b"old", 13, 2), ("jobs/b", b"new", 14, 14), "Conflict", ("jobs/d", b"d", 15, 6)]
    assert [(rev, key, t, prev_rev) for rev, key, t, _, _, prev_rev, _, _ in p.log] == [
        (11, "jobs/a", PUT, None), (12, "jobs/a", PUT, 11), (13, "jobs/b", DELETE, 4), (14, "jobs/b", PUT, None),
        (15, "jobs/d", DELETE, 6)]
    assert sorted(p.upserts) == [("jobs/a", b"2", 12, 11), ("jobs/b", b"new", 14, 14)]
    assert p.deletes == ["jobs/d"]


def test_a_fenced_write_whose_epoch_moved_is_refused_and_a_refused_batch_changes_nothing() -> None:
    stale = w(WriteKind.CREATE, "jobs/a", b"1", fence=Fence("controllers", 3))
    p = plan([stale, w(WriteKind.UPDATE, "jobs/gone", b"x")], {}, 7, {"controllers": 4})
    assert [e.reason for _, _, e in p.outcomes] == ["LeaderDeposed", "NotFound"]  # type: ignore[union-attr]
    assert p.revision == 7 and not p.changed and not p.upserts and not p.deletes


def together(*keys: str, fence: Fence | None = None) -> Write:
    """A `create_together` of `keys`, queued as one write (ADR 0108)."""
    first, *rest = (w(WriteKind.CREATE, key, key.encode(), fence=fence) for key in keys)
    first.together = tuple(rest)
    return first


def test_creates_together_apply_whole_with_consecutive_revisions_or_are_refused_whole() -> None:
    taken = together("jobs/a", "attempts/a-1")  # attempts/a-1 exists: neither is created
    deposed = together("jobs/b", "attempts/b-1", fence=Fence("controllers", 3))
    made = together("jobs/c", "attempts/c-1", fence=Fence("controllers", 4))
    clash = together("jobs/d", "attempts/c-1")  # the group before it created attempts/c-1
    p = plan([taken, deposed, w(WriteKind.CREATE, "jobs/a", b"plain"), made, clash], {"attempts/a-1": (b"old", 2, 2)},
             10, {"controllers": 4})
    results = [(r.key, r.revision) if r else e.reason for _, r, e in p.outcomes]  # type: ignore[union-attr]
    assert results == ["AlreadyExists", "AlreadyExists", "LeaderDeposed", "LeaderDeposed", ("jobs/a", 11),
                       ("jobs/c", 12), ("attempts/c-1", 13), "AlreadyExists", "AlreadyExists"]
    assert all("attempts/a-1" in str(e) for _, _, e in p.outcomes[:2])
    assert all("attempts/c-1" in str(e) for _, _, e in p.outcomes[-2:])
    assert [(rev, key, epoch) for rev, key, *_, epoch in p.log] == [
        (11, "jobs/a", None), (12, "jobs/c", 4), (13, "attempts/c-1", 4)]
    assert sorted(key for key, *_ in p.upserts) == ["attempts/c-1", "jobs/a", "jobs/c"] and p.revision == 13
