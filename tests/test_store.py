"""The store's contract, against both engines (SQLite and PostgreSQL): CAS, paging on one snapshot, watch without gap or
duplicate (across restarts and slow consumers), compaction, group commit, and durability under kill -9.

Async tests run through `run()` (asyncio.run with a deadline), so no asyncio plugin is needed.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store import Event, EventType, Record, SqliteStore, Store, prefix_end
from nodus.coordinator.store.pg_tail import LogTail
from nodus.coordinator.store.postgres import PostgresStore
from postgres import PostgresCluster, postgres_cluster  # noqa: F401 - the session fixture

T = TypeVar("T")


def run(test: Callable[[], Awaitable[T]], deadline: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), deadline)
    return asyncio.run(bounded())


def reason(excinfo: pytest.ExceptionInfo[NodusError]) -> str:
    return excinfo.value.reason


async def take(events: AsyncIterator[Event], n: int) -> list[Event]:
    return [await anext(events) for _ in range(n)]


class Backend:
    """Where one engine's store lives, and how to open it (again, or a fresh one)."""

    def __init__(self, engine: str, tmp_path: Path, cluster: PostgresCluster | None) -> None:
        self.engine, self.tmp_path, self.cluster = engine, tmp_path, cluster
        self.location = (str(tmp_path / f"store-{os.urandom(4).hex()}.db") if cluster is None
                         else cluster.database())

    def fresh(self) -> Backend:
        return Backend(self.engine, self.tmp_path, self.cluster)

    async def open(self, *, watch_buffer: int | None = None, sqlite: type[SqliteStore] = SqliteStore,
                   postgres: type[PostgresStore] = PostgresStore, **pg: Any) -> Store:
        """Open the store here; `sqlite`/`postgres` pick a subclass. watch_buffer sizes a watch's live buffer."""
        if self.cluster is None:
            # sqlite-mirror: every key also kept in memory and read there (the coordinator mirrors the
            # API's objects, store/opening.py), so every test here holds for reads from the mirror too.
            mirror = ("",) if self.engine == "sqlite-mirror" else ()
            return await sqlite.open(Path(self.location), mirror=mirror,
                                     **({} if watch_buffer is None else {"watch_buffer": watch_buffer}))
        return await postgres.open(self.location, **pg, **({} if watch_buffer is None else {"watch_buffer": watch_buffer}))


@pytest.fixture(params=["sqlite", "sqlite-mirror", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    cluster = request.getfixturevalue("postgres_cluster") if request.param == "postgres" else None
    return Backend(request.param, tmp_path, cluster)


def test_create_get_update_delete(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        created = await store.create("jobs/default/train", b'{"a":1}')
        assert created == Record("jobs/default/train", b'{"a":1}', 1, 1)
        assert await store.get("jobs/default/train") == created
        assert await store.get("jobs/default/missing") is None

        updated = await store.update("jobs/default/train", b'{"a":2}', created.revision)
        assert updated == Record("jobs/default/train", b'{"a":2}', 2, 1)
        unconditional = await store.update("jobs/default/train", b'{"a":3}', None)
        assert unconditional.revision == 3

        deleted = await store.delete("jobs/default/train", expected_revision=3)
        # The deleted value, the incarnation's create revision, and the delete's own revision.
        assert deleted == Record("jobs/default/train", b'{"a":3}', 4, 1)
        assert await store.get("jobs/default/train") is None
        assert store.revision == 4

        again = await store.create("jobs/default/train", b"{}")
        assert again == Record("jobs/default/train", b"{}", 5, 5)  # a new incarnation
        await store.close()
    run(body)


def test_errors_already_exists_not_found_conflict(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        record = await store.create("k", b"1")
        with pytest.raises(NodusError) as e:
            await store.create("k", b"2")
        assert reason(e) == "AlreadyExists"
        await store.update("k", b"2", record.revision)
        with pytest.raises(NodusError) as e:
            await store.update("k", b"3", record.revision)  # stale
        assert reason(e) == "Conflict"
        with pytest.raises(NodusError) as e:
            await store.delete("k", expected_revision=record.revision)
        assert reason(e) == "Conflict"
        with pytest.raises(NodusError) as e:
            await store.update("missing", b"x", None)
        assert reason(e) == "NotFound"
        with pytest.raises(NodusError) as e:
            await store.delete("missing")
        assert reason(e) == "NotFound"
        assert (await store.get("k")) == Record("k", b"2", 2, 1)
        assert store.revision == 2  # failed operations take no revision
        await store.close()
    run(body)


def test_revisions_strictly_increase_across_keys(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        records = await asyncio.gather(*(store.create(f"kind{i % 3}/k{i}", b"v") for i in range(60)))
        revisions = sorted(r.revision for r in records)
        assert revisions == list(range(1, 61))
        assert store.revision == 60
        await store.close()
    run(body)


def test_list_pages_by_prefix_on_one_snapshot(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        for i in range(25):
            await store.create(f"jobs/default/job-{i:02d}", f"{i}".encode())
        for outside in ("jobs/defaultx/a", "jobs/other/a", "jobs/default", "sweeps/default/a"):
            await store.create(outside, b"no")

        first = await store.list("jobs/default/", limit=10)
        assert [r.key for r in first.records] == [f"jobs/default/job-{i:02d}" for i in range(10)]
        assert first.more and first.revision == store.revision
        # Writes between pages must not show in later pages of the same list.
        await store.delete("jobs/default/job-15")
        await store.update("jobs/default/job-20", b"changed", None)
        await store.create("jobs/default/job-99", b"new")

        second = await store.list("jobs/default/", limit=10, start_after=first.records[-1].key,
                                  revision=first.revision)
        third = await store.list("jobs/default/", limit=10, start_after=second.records[-1].key,
                                 revision=first.revision)
        assert second.more and not third.more and len(third.records) == 5
        keys = [r.key for page in (first, second, third) for r in page.records]
        assert keys == [f"jobs/default/job-{i:02d}" for i in range(25)]
        values = [r.value for page in (first, second, third) for r in page.records]
        assert values == [f"{i}".encode() for i in range(25)]

        now = await store.list("jobs/default/")
        assert not now.more and now.revision == store.revision
        assert len(now.records) == 25 and now.records[-1].key == "jobs/default/job-99"
        everything = await store.list("")
        assert len(everything.records) == 29
        await store.close()
    run(body)


def test_list_at_an_older_revision_returns_the_old_state(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        for key in ("a/1", "a/2", "a/3"):
            await store.create(key, b"v0:" + key.encode())
        await store.update("a/1", b"v1", None)           # 4
        await store.delete("a/2")                        # 5
        await store.create("a/4", b"v0")                 # 6
        await store.delete("a/3")                        # 7
        await store.create("a/3", b"reborn")             # 8
        await store.update("a/3", b"reborn2", None)      # 9
        at3 = await store.list("a/", revision=3)
        assert at3.revision == 3 and at3.records == (
            Record("a/1", b"v0:a/1", 1, 1), Record("a/2", b"v0:a/2", 2, 2), Record("a/3", b"v0:a/3", 3, 3))
        at6 = await store.list("a/", revision=6)
        assert at6.records == (Record("a/1", b"v1", 4, 1), Record("a/3", b"v0:a/3", 3, 3),
                               Record("a/4", b"v0", 6, 6))
        at8 = await store.list("a/", revision=8, limit=2)
        assert at8.more and [r.key for r in at8.records] == ["a/1", "a/3"]
        assert at8.records[1] == Record("a/3", b"reborn", 8, 8)
        assert (await store.list("a/", revision=0)).records == ()
        with pytest.raises(NodusError) as e:
            await store.list("a/", revision=10)
        assert reason(e) == "Timeout"  # Kubernetes: "Too large resource version"
        await store.close()
    run(body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["create", "update", "delete"]), st.sampled_from("abcdef"),
                              st.binary(max_size=4)), min_size=1, max_size=25),
       compact_at=st.integers(min_value=0, max_value=30), limit=st.integers(min_value=0, max_value=3))
def test_list_at_every_revision_matches_a_model(backend: Backend, ops: list[tuple[str, str, bytes]],
                                                compact_at: int, limit: int) -> None:
    async def body() -> None:
        store = await backend.fresh().open()
        state: dict[str, Record] = {}
        history = [dict(state)]  # history[r]: the state at revision r
        for kind, name, value in ops:
            key = f"p/{name}"
            # The model says which writes the store must refuse, and why; every other write must land.
            refusal = ("AlreadyExists" if kind == "create" and key in state
                       else "NotFound" if kind != "create" and key not in state else None)
            if refusal:
                with pytest.raises(NodusError) as e:
                    await (store.create(key, value) if kind == "create" else
                           store.update(key, value, None) if kind == "update" else store.delete(key))
                assert e.value.reason == refusal, (kind, key, e.value)
                continue
            if kind == "create":
                state[key] = await store.create(key, value)
            elif kind == "update":
                state[key] = await store.update(key, value, None)
            else:
                await store.delete(key)
                del state[key]
            history.append(dict(state))
        assert store.revision == len(history) - 1
        compacted = min(compact_at, store.revision)
        await store.compact(compacted)
        await store.create("q/outside", b"")  # a later write outside the prefix changes nothing
        for revision, expected in enumerate(history):
            if revision < compacted:
                with pytest.raises(NodusError):
                    await store.list("p/", revision=revision)
                continue
            got: list[Record] = []
            after = None
            while True:
                page = await store.list("p/", limit=limit, start_after=after, revision=revision)
                got += page.records
                if not page.more:
                    break
                after = page.records[-1].key
            assert got == [expected[k] for k in sorted(expected)]
        await store.close()
    run(body)


def test_compaction_expires_old_revisions_and_keeps_values(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        for i in range(10):
            await store.create(f"k/{i}", b"v")
            await store.update(f"k/{i}", b"w", None)
        await store.compact(12)
        assert store.compacted_revision == 12
        with pytest.raises(NodusError) as e:
            await store.list("k/", revision=11)
        assert reason(e) == "Expired"
        with pytest.raises(NodusError) as e:
            await anext(store.watch("k/", 11))
        assert reason(e) == "Expired"
        assert len((await store.list("k/", revision=12)).records) == 6
        replay = store.watch("k/", 12)
        assert [ev.revision for ev in await take(replay, 8)] == list(range(13, 21))
        await replay.aclose()
        assert [r.value for r in (await store.list("k/")).records] == [b"w"] * 10
        await store.compact(store.revision)  # everything: the log is empty, the revision is not lost
        await store.compact(5)  # below the compacted revision: nothing to do
        with pytest.raises(NodusError) as e:
            await store.compact(store.revision + 1)
        assert reason(e) == "BadRequest"
        await store.close()

        store = await backend.open()
        assert (store.revision, store.compacted_revision) == (20, 20)
        assert (await store.create("k/new", b"")).revision == 21
        assert len((await store.list("k/")).records) == 11
        await store.close()
    run(body)


def test_watch_replays_then_goes_live_without_gap_or_duplicate(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        acked: dict[int, tuple[Record, EventType]] = {}
        halfway = asyncio.Event()

        async def writer(w: int) -> None:
            for i in range(25):
                key = f"jobs/w{w}/{i % 5}"
                if i < 5:
                    record = await store.create(key, f"{w}:{i}".encode())
                elif i < 20:
                    record = await store.update(key, f"{w}:{i}".encode(), None)
                else:
                    record = await store.delete(key)
                acked[record.revision] = (record, EventType.DELETE if i >= 20 else EventType.PUT)
                if len(acked) >= 100:
                    halfway.set()
                await asyncio.sleep(0)

        writers = [asyncio.create_task(writer(w)) for w in range(8)]
        await halfway.wait()
        start = 40  # an earlier revision: replay 41.., then live while writers continue
        seen: list[Event] = []
        async for event in store.watch("jobs/", start):
            seen.append(event)
            if event.revision == 200:
                break
        await asyncio.gather(*writers)
        assert [e.revision for e in seen] == list(range(start + 1, 201))
        for event in seen:
            record, type_ = acked[event.revision]
            assert (event.type, event.key, event.value, event.create_revision) == (
                type_, record.key, record.value, record.create_revision)
        await store.close()
    run(body)


class PausedCatchUpStore(SqliteStore):
    """Pauses a watch's first log read, before or after it takes its snapshot, so the test can commit
    writes exactly inside the window where a gap or a duplicate would come from."""

    pause: str | None = None  # "before" or "after" the snapshot
    entered: threading.Event
    gate: threading.Event

    def _read_log(self, conn: Any, prefix: str, after: int, limit: int) -> tuple[list[Event], int]:
        where, self.pause = self.pause, None
        if where == "before":
            self.entered.set()
            self.gate.wait(10)
        result = super()._read_log(conn, prefix, after, limit)
        if where == "after":
            self.entered.set()
            self.gate.wait(10)
        return result


class PausedCatchUpPostgres(PostgresStore):
    """The same pause for PostgreSQL, whose snapshot is taken by the log read's first query."""

    pause: str | None = None
    entered: threading.Event
    gate: threading.Event

    async def _read_log(self, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        where, self.pause = self.pause, None
        if where == "before":
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 10)
        result = await super()._read_log(prefix, after, limit)
        if where == "after":
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 10)
        return result


@pytest.mark.parametrize("pause", ["before", "after"])
def test_watch_has_no_gap_or_duplicate_at_the_switch_to_live(backend: Backend, pause: str) -> None:
    async def body() -> None:
        store: Any = await backend.open(sqlite=PausedCatchUpStore, postgres=PausedCatchUpPostgres)
        store.entered, store.gate, store.pause = threading.Event(), threading.Event(), pause
        for i in range(3):
            await store.create(f"k/{i}", b"")
        events = store.watch("k/", 1)
        first = asyncio.create_task(anext(events))  # subscribes, then starts the paused log read
        await asyncio.to_thread(store.entered.wait, 10)
        for i in range(3, 6):
            # Committed and published while the catch-up read waits: "before" puts them in both the
            # snapshot and the live buffer (duplicates to drop), "after" only in the buffer (no gap).
            await store.create(f"k/{i}", b"")
        store.gate.set()
        seen = [await first] + await take(events, 4)
        nxt = asyncio.create_task(anext(events))
        await store.create("k/6", b"")
        seen.append(await nxt)
        assert [e.revision for e in seen] == [2, 3, 4, 5, 6, 7]
        await events.aclose()
        await store.close()
    run(body)


def test_watch_filters_by_prefix_and_reports_previous_values(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        events = store.watch("jobs/", 0)
        await store.create("sweeps/a", b"s")
        await store.create("jobs/a", b"1")
        await store.update("jobs/a", b"2", None)
        await store.delete("jobs/a")
        got = await take(events, 3)
        assert got == [Event(EventType.PUT, "jobs/a", b"1", 2, None, 2),
                       Event(EventType.PUT, "jobs/a", b"2", 3, b"1", 2),
                       Event(EventType.DELETE, "jobs/a", b"2", 4, b"2", 2)]
        await events.aclose()
        await store.close()
    run(body)


def test_slow_watcher_catches_up_from_history_instead_of_buffering(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open(watch_buffer=8)
        events = store.watch("", 0)
        first = await store.create("k/0", b"")
        assert (await anext(events)).revision == first.revision  # now live, with an 8-event buffer
        for i in range(1, 300):
            await store.create(f"k/{i}", b"")  # overflows the buffer while nobody reads
        rest = await take(events, 299)
        assert [e.revision for e in rest] == list(range(2, 301))
        late = asyncio.create_task(anext(events))
        await store.create("k/late", b"")
        assert (await late).key == "k/late"
        await events.aclose()
        await store.close()
    run(body)


def test_watch_ends_when_the_store_closes(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        events = store.watch("", 0)
        await store.create("a", b"")
        assert (await anext(events)).key == "a"
        pending = asyncio.create_task(anext(events))
        await asyncio.sleep(0)
        await store.close()
        with pytest.raises(StopAsyncIteration):
            await pending
    run(body)


def test_watch_resumes_across_a_restart_without_loss_or_duplicate(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        events = store.watch("jobs/", 0)
        for i in range(10):
            await store.create(f"jobs/{i}", b"before")
        seen = await take(events, 7)
        last_seen = seen[-1].revision
        for i in range(5):
            await store.update(f"jobs/{i}", b"unseen", None)
        await events.aclose()
        await store.close()

        store = await backend.open()
        assert store.revision == 15
        for i in range(5):
            await store.delete(f"jobs/{i}")
        resumed = await take(store.watch("jobs/", last_seen), 20 - last_seen)
        assert [e.revision for e in resumed] == list(range(last_seen + 1, 21))
        assert [e.type for e in resumed[-5:]] == [EventType.DELETE] * 5
        await store.close()
    run(body)


def test_concurrent_creates_of_one_key_exactly_one_succeeds(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        results = await asyncio.gather(*(store.create("jobs/default/same", str(i).encode()) for i in range(50)),
                                       return_exceptions=True)
        winners = [r for r in results if isinstance(r, Record)]
        losers = [r for r in results if isinstance(r, NodusError)]
        assert len(winners) == 1 and len(losers) == 49
        assert all(e.reason == "AlreadyExists" for e in losers)
        assert await store.get("jobs/default/same") == winners[0]
        await store.close()
    run(body)


class GatedStore(SqliteStore):
    """Holds the writer inside its first batch until the test opens the gate, so the next operations
    queue up and are committed together; records each batch's size."""

    hold = False
    entered: threading.Event
    gate: threading.Event
    batches: list[int]

    def _commit_batch(self, conn: Any, writes: list[Any]) -> None:
        self.batches.append(len(writes))
        if self.hold:
            self.hold = False
            self.entered.set()
            self.gate.wait(10)
        super()._commit_batch(conn, writes)


class GatedPostgres(PostgresStore):
    """The same gate for PostgreSQL's writer task."""

    hold = False
    entered: threading.Event
    gate: threading.Event
    batches: list[int]

    async def _commit_batch(self, writes: Sequence[Any]) -> None:
        self.batches.append(len(writes))
        if self.hold:
            self.hold = False
            self.entered.set()
            await asyncio.to_thread(self.gate.wait, 10)
        await super()._commit_batch(writes)


def test_a_failing_operation_does_not_fail_its_batch(backend: Backend) -> None:
    async def body() -> None:
        store: Any = await backend.open(sqlite=GatedStore, postgres=GatedPostgres)
        store.entered, store.gate, store.batches = threading.Event(), threading.Event(), []
        await store.create("existing", b"1")
        store.batches.clear()
        store.hold = True
        blocker = asyncio.create_task(store.create("blocker", b""))
        await asyncio.to_thread(store.entered.wait, 10)
        ops = [store.create("new/1", b""), store.create("existing", b"dup"),
               store.create("new/2", b""), store.update("existing", b"x", 99),
               store.delete("missing"), store.create("new/3", b"")]
        tasks = [asyncio.create_task(op) for op in ops]
        while store._queue.qsize() < len(ops):
            await asyncio.sleep(0)
        store.gate.set()
        await blocker
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert store.batches == [1, len(ops)]  # the six went in one transaction
        assert [r.revision if isinstance(r, Record) else getattr(r, "reason", r) for r in results] == [
            3, "AlreadyExists", 4, "Conflict", "NotFound", 5]
        assert [r.key for r in (await store.list("new/")).records] == ["new/1", "new/2", "new/3"]
        assert (await store.get("existing")) == Record("existing", b"1", 1, 1)
        await store.close()
    run(body)


def test_creates_together_commit_whole_in_order_or_not_at_all(backend: Backend) -> None:
    """`create_together` (ADR 0108, 0118): consecutive revisions in the items' order, one batch for a watcher,
    the records returned; a key that exists refuses the whole group with its AlreadyExists."""
    async def body() -> None:
        store = await backend.open()
        try:
            assert store.creates_together
            start = store.revision
            records = await store.create_together([("jobs/p/a", b'{"a":1}'), ("attempts/p/a-0-1", b'{"b":2}')])
            assert [(r.key, r.value, r.revision, r.create_revision) for r in records] == [
                ("jobs/p/a", b'{"a":1}', start + 1, start + 1), ("attempts/p/a-0-1", b'{"b":2}', start + 2, start + 2)]
            watch = store.watch_batches("", start)
            assert watch is not None
            batch = await anext(watch)
            assert [(e.key, e.revision, e.value) for e in batch] == [
                ("jobs/p/a", start + 1, b'{"a":1}'), ("attempts/p/a-0-1", start + 2, b'{"b":2}')]
            await watch.aclose()
            # The second key exists: the first is not created either, and both callers' writes are refused.
            with pytest.raises(NodusError) as refused:
                await store.create_together([("jobs/p/b", b"{}"), ("attempts/p/a-0-1", b"{}")])
            assert refused.value.reason == "AlreadyExists" and "attempts/p/a-0-1" in str(refused.value)
            assert await store.get("jobs/p/b") is None and store.revision == start + 2
            assert [r.key for r in (await store.list("")).records] == ["attempts/p/a-0-1", "jobs/p/a"]
            with pytest.raises(ValueError, match="distinct keys"):
                await store.create_together([("jobs/p/c", b"{}"), ("jobs/p/c", b"{}")])
        finally:
            await store.close()
    run(body)


def test_writes_together_update_and_create_whole_or_not_at_all(backend: Backend) -> None:
    """`write_together` (ADR 0127): compare-and-swap updates and creates in one commit, in order, with consecutive
    revisions; a stale expected revision (or a missing key) refuses the whole group, creates included."""
    async def body() -> None:
        store = await backend.open()
        try:
            attempt = await store.create("attempts/p/a-0-1", b"running")
            job = await store.create("jobs/p/a", b"queued")
            start = store.revision
            records = await store.write_together([("attempts/p/a-0-1", b"succeeded", attempt.revision),
                                                  ("jobs/p/a", b"1 of 2", job.revision),
                                                  ("attempts/p/a-1-1", b"pending", None)])
            assert [(r.key, r.value, r.revision, r.create_revision) for r in records] == [
                ("attempts/p/a-0-1", b"succeeded", start + 1, attempt.revision),
                ("jobs/p/a", b"1 of 2", start + 2, job.revision), ("attempts/p/a-1-1", b"pending", start + 3, start + 3)]
            for stale in ([("attempts/p/a-1-1", b"running", start + 3), ("jobs/p/a", b"2 of 2", job.revision),
                           ("attempts/p/a-2-1", b"pending", None)],
                          [("attempts/p/a-1-1", b"running", start + 3), ("jobs/p/gone", b"x", 1)]):
                with pytest.raises(NodusError) as refused:
                    await store.write_together(stale)
                assert refused.value.reason in ("Conflict", "NotFound")
                assert store.revision == start + 3
            assert (await store.get("attempts/p/a-1-1")).value == b"pending"  # type: ignore[union-attr]
            assert await store.get("attempts/p/a-2-1") is None
            assert (await store.get("jobs/p/a")).value == b"1 of 2"  # type: ignore[union-attr]
        finally:
            await store.close()
    run(body)


def test_creates_together_in_one_batch_see_the_writes_before_them(backend: Backend) -> None:
    """Groups queued behind a held batch commit in the next one with the other writes: a group whose key an
    earlier write of that batch created is refused whole, the writes after it are not, and each group that
    applies has consecutive revisions."""
    async def body() -> None:
        store: Any = await backend.open(sqlite=GatedStore, postgres=GatedPostgres)
        store.entered, store.gate, store.batches = threading.Event(), threading.Event(), []
        try:
            store.hold = True
            blocker = asyncio.create_task(store.create("blocker", b""))
            await asyncio.to_thread(store.entered.wait, 10)
            ops = [store.create("attempts/p/x-0-1", b"plain"),
                   store.create_together([("jobs/p/x", b"x"), ("attempts/p/x-0-1", b"x1")]),  # refused whole
                   store.create_together([("jobs/p/y", b"y"), ("attempts/p/y-0-1", b"y1"), ("attempts/p/y-0-2", b"y2")]),
                   store.update("jobs/p/y", b"y!", None)]
            tasks = [asyncio.create_task(op) for op in ops]
            while store._queue.qsize() < len(ops):
                await asyncio.sleep(0)
            store.gate.set()
            await blocker
            plain, x, y, updated = await asyncio.gather(*tasks, return_exceptions=True)
            assert store.batches == [1, len(ops)]
            assert plain.revision == 2
            assert isinstance(x, NodusError) and x.reason == "AlreadyExists" and "attempts/p/x-0-1" in str(x)
            assert [(r.key, r.revision) for r in y] == [("jobs/p/y", 3), ("attempts/p/y-0-1", 4), ("attempts/p/y-0-2", 5)]
            assert (updated.revision, updated.create_revision) == (6, 3)
            assert await store.get("jobs/p/x") is None
            assert (await store.get("attempts/p/x-0-1")).value == b"plain"  # type: ignore[union-attr]
            assert [(r.key, r.value) for r in (await store.list("jobs/")).records] == [("jobs/p/y", b"y!")]
            history = await take(store.watch("", 1), 5)
            assert [(e.revision, e.key) for e in history] == [
                (2, "attempts/p/x-0-1"), (3, "jobs/p/y"), (4, "attempts/p/y-0-1"), (5, "attempts/p/y-0-2"), (6, "jobs/p/y")]
        finally:
            await store.close()
    run(body)


CHILD = """
import asyncio, sys
from pathlib import Path
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.store.postgres import PostgresStore

async def main():
    engine, location = sys.argv[1], sys.argv[2]
    store = await (SqliteStore.open(Path(location), mirror=("",) if engine == "sqlite-mirror" else ())
                   if engine.startswith("sqlite") else PostgresStore.open(location))
    async def creator(i):
        j = 0
        while True:
            key = f"burst/{i}/{j}"
            await store.create(key, b"x" * 200)
            sys.stdout.write(key + "\\n")  # printed only once acknowledged
            sys.stdout.flush()
            j += 1
    await asyncio.gather(*(creator(i) for i in range(32)))

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_acknowledged_writes_survive_kill_9(backend: Backend) -> None:
    printed: list[str] = []
    with subprocess.Popen([sys.executable, "-c", CHILD, backend.engine, backend.location], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stderr is not None
        try:
            while len(printed) < 2000:
                line = child.stdout.readline()
                if not line:
                    pytest.fail(f"child ended early: {child.stderr.read()}")
                printed.append(line)
        finally:
            os.kill(child.pid, signal.SIGKILL)  # mid-burst: 32 creators with writes in flight
            child.wait(10)
        printed += child.stdout.readlines()
    acknowledged = {line.rstrip("\n") for line in printed if line.endswith("\n")}
    assert len(acknowledged) >= 2000

    async def check() -> None:
        store = await backend.open()
        stored = {r.key for r in (await store.list("burst/")).records}
        missing = acknowledged - stored
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:3]}"
        assert store.revision == len(stored)
        assert (await store.create("after/restart", b"")).revision == len(stored) + 1
        await store.close()
    run(check)


def test_prefix_end() -> None:
    assert prefix_end("jobs/") == "jobs0"
    assert prefix_end("") is None
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"


@pytest.fixture
def pg(postgres_cluster: PostgresCluster, tmp_path: Path) -> Backend:
    return Backend("postgres", tmp_path, postgres_cluster)


def test_postgres_reads_answer_after_the_server_dropped_every_connection(pg: Backend) -> None:
    """The pool hands out a connection without a round trip to test it first (ADR 0118): a get, a list and a watch's
    catch-up and a compaction whose connection pg_terminate_backend killed run again on a fresh one instead of failing."""
    async def body() -> None:
        store = await pg.open(application_name="nodus-test-dropped")
        try:
            await store.create("jobs/p/a", b"1")
            await asyncio.gather(*(store.get("jobs/p/a") for _ in range(8)))  # the pool grows (up to its four)
            with psycopg.connect(pg.cluster.url("postgres"), autocommit=True) as admin:  # type: ignore[union-attr]
                killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE application_name = 'nodus-test-dropped'").fetchone()
            assert killed is not None and killed[0] >= 3  # the writer, the LISTEN and the pooled ones
            await store.compact(0)  # compaction (idempotent) runs again on a fresh connection too
            assert await store.get("jobs/p/a") == Record("jobs/p/a", b"1", 1, 1)
            assert [r.key for r in (await store.list("jobs/")).records] == ["jobs/p/a"]
            assert [r.key for r in await asyncio.gather(*(store.get("jobs/p/a") for _ in range(8)))] == ["jobs/p/a"] * 8
            events = store.watch("jobs/", 0)
            assert (await anext(events)).key == "jobs/p/a"
            await store.create("jobs/p/b", b"2")  # the writer's connection is opened again too
            assert (await anext(events)).key == "jobs/p/b"
            await events.aclose()
        finally:
            await store.close()
    run(body)


def test_postgres_watch_sees_another_process_writes_with_notifications_lost(pg: Backend) -> None:
    """A watcher that never hears a NOTIFY (listen=False) still sees every write of another store
    on the same database, by its poll: correctness never rests on a notification."""
    async def body() -> None:
        writer = await pg.open()
        watcher = await pg.open(listen=False, poll_interval=0.05)
        events = watcher.watch("jobs/", 0)
        for i in range(20):
            await writer.create(f"jobs/{i}", str(i).encode())
        got = await take(events, 20)
        assert [(e.revision, e.key, e.value) for e in got] == [(i + 1, f"jobs/{i}", str(i).encode()) for i in range(20)]
        await events.aclose()
        await watcher.close()
        await writer.close()
    run(body)


def test_postgres_watchers_see_two_concurrent_writer_processes_in_revision_order_without_gap(pg: Backend) -> None:
    """Two stores (two replicas) commit group after group at once while watchers of a third read the log as
    they are woken, in pages smaller than a batch: each watcher sees every revision of its prefix once, in
    order, with the value its writer wrote; the prefixes' revisions together are every revision, none
    missing (a watch's page and head come from one snapshot, and revisions are handed out in commit
    order)."""
    class SmallPages(PostgresStore):
        LOG_PAGE = 7

    async def body() -> None:
        writers = [await pg.open(), await pg.open()]
        watcher = await pg.open(postgres=SmallPages, poll_interval=0.05)
        watches = {prefix: watcher.watch(prefix, 0) for prefix in ("a/", "b/", "")}
        total = 2 * 10 * 12

        async def write(w: int) -> None:
            for burst in range(10):
                await asyncio.gather(*(writers[w].create(f"{'ab'[(w + i) % 2]}/{w}-{burst}-{i}", f"{w}{burst}{i}".encode())
                                       for i in range(12)))

        async def follow(prefix: str) -> list[Event]:
            return await take(watches[prefix], total if prefix == "" else total // 2)
        _, _, *seen = await asyncio.gather(write(0), write(1), *(follow(p) for p in watches))
        by_prefix = dict(zip(watches, seen))
        for prefix, events in by_prefix.items():
            revisions = [e.revision for e in events]
            assert revisions == sorted(set(revisions)), f"{prefix!r}: out of order or twice"
            assert all(e.key.startswith(prefix) and e.value == "".join(e.key[2:].split("-")).encode()
                       for e in events), prefix
        assert [e.revision for e in by_prefix[""]] == list(range(1, total + 1))
        assert sorted(e.revision for e in by_prefix["a/"] + by_prefix["b/"]) == list(range(1, total + 1))
        for events in watches.values():
            await events.aclose()
        for store in (watcher, *writers):
            await store.close()
    run(body, deadline=60)


def test_postgres_notify_wakes_a_watcher_in_another_process_before_its_poll(pg: Backend) -> None:
    """With a poll far beyond the test's deadline, only LISTEN/NOTIFY can deliver the other store's write."""
    async def body() -> None:
        writer = await pg.open()
        watcher = await pg.open(poll_interval=3600)
        events = watcher.watch("", 0)
        await writer.create("first", b"")
        assert (await anext(events)).key == "first"  # its log read is done; it waits next
        await writer.create("k", b"v")  # committed after that read: only a wake-up brings it
        assert (await anext(events)).key == "k"
        await events.aclose()
        await watcher.close()
        await writer.close()
    run(body, deadline=20)


class CountingReads(PostgresStore):
    """Counts the log reads of its watches, whichever reads them (each watch itself, or the process's tail)."""

    reads = 0

    async def _read_log(self, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        self.reads += 1
        return await super()._read_log(prefix, after, limit)

    async def _read_tail(self, after: int, limit: int) -> tuple[Sequence[Event], int]:
        self.reads += 1
        return await super()._read_tail(after, limit)


@pytest.mark.parametrize("writer_is", ["this store", "another store"])
def test_postgres_watches_of_a_process_share_one_log_read_per_commit(pg: Backend, writer_is: str) -> None:
    """Twenty live watches of one store (a replica's REST watchers) and five commits, one at a time: every
    watch gets every event in order, and the store reads the log once per commit of another process (the
    tail, woken by NOTIFY: the poll is an hour) and not at all for its own commits, not once per watch
    (ADR 0100: a hundred watchers' reads queued on the pool put a follower's watch p99 at seconds)."""
    async def body() -> None:
        watcher: Any = await pg.open(postgres=CountingReads, poll_interval=3600)
        writer = watcher if writer_is == "this store" else await pg.open()
        watches = [watcher.watch("jobs/", 0) for _ in range(20)]
        await writer.create("jobs/first", b"")
        for events in watches:
            assert (await anext(events)).key == "jobs/first"  # caught up: each watch is live now
        reads = watcher.reads
        for i in range(5):
            await writer.create(f"jobs/{i}", str(i).encode())
            for events in watches:
                got = await anext(events)
                assert (got.key, got.value, got.revision) == (f"jobs/{i}", str(i).encode(), i + 2)
        assert watcher.reads - reads == (0 if writer is watcher else 5)
        for events in watches:
            await events.aclose()
        for store in {watcher, writer}:
            await store.close()
    run(body, deadline=30)


def test_postgres_notify_of_segments_nobody_watches_sends_no_read(pg: Backend) -> None:
    """A commit's NOTIFY names the top segments of its keys (ADR 0087): another store that watches only "jobs/"
    reads the log for a write under "jobs/" before its poll, and not for one under "_leases/" alone."""
    async def body() -> None:
        writer = await pg.open()
        watcher: Any = await pg.open(postgres=CountingReads, poll_interval=3600)
        jobs = watcher.watch("jobs/p/", 0)
        await writer.create("jobs/p/first", b"")
        assert (await anext(jobs)).key == "jobs/p/first"
        # The first create's NOTIFY can arrive after the catch-up read already found it, and wake one more read:
        # counted from once the tail is still (nothing read for 0.3 s), only what the writes below set off counts.
        reads = -1
        while reads != watcher.reads:
            reads = watcher.reads
            await asyncio.sleep(0.3)
        for i in range(5):
            await writer.create(f"_leases/n{i}", b"")
        await writer.create("jobs/p/k", b"v")
        got = await anext(jobs)
        assert (got.key, got.revision) == ("jobs/p/k", 7)
        assert watcher.reads - reads == 1, "a lease write sent the tail to read the log"
        await jobs.aclose()
        await watcher.close()
        await writer.close()
    run(body, deadline=20)


def test_a_tail_is_woken_by_the_segments_its_watches_follow_and_by_a_notify_naming_none() -> None:
    async def body() -> None:
        async def never(after: int, limit: int) -> tuple[Sequence[Event], int]:
            raise AssertionError("not read here")
        tail = LogTail(never, lambda: 0, 3600, 8, 10)
        subscription = tail.subscribe("jobs/p/", 0)
        tail.notified(["_leases/"])
        assert not tail._wake.is_set()
        tail.notified(["_leases/", "jobs/"])
        assert tail._wake.is_set()
        tail._wake.clear()
        tail.notified(None)  # a replica of the code before ADR 0087 names no segment
        assert tail._wake.is_set()
        tail.unsubscribe(subscription)
        tail._wake.clear()
        tail.notified(["jobs/"])
        assert not tail._wake.is_set() and tail.watching == 0
    asyncio.run(body())


def test_postgres_migrations_run_once_under_concurrent_starts(pg: Backend) -> None:
    async def body() -> None:
        stores = await asyncio.gather(*(pg.open() for _ in range(4)))
        with psycopg.connect(pg.location) as conn:
            assert conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [(1,), (2,)]
        for store in stores:
            await store.close()
    run(body)


def test_a_mirrored_store_reads_what_it_held_before_a_restart_and_only_its_prefixes_in_memory(tmp_path: Path) -> None:
    """The mirror is loaded from the file at open (a restarted coordinator GETs what it stored before),
    follows every write and delete after it, and keys outside its prefixes are read from the file."""
    async def body() -> None:
        path = tmp_path / "store.db"
        store = await SqliteStore.open(path)
        await store.create("jobs/p/a", b"1")
        b = await store.create("jobs/p/b", b"2")
        await store.create("tokens/t", b"3")
        await store.close()
        store = await SqliteStore.open(path, mirror=("jobs/",))
        try:
            assert await store.get("jobs/p/b") == b
            assert set(store._mirror) == {"jobs/p/a", "jobs/p/b"}, "only the mirrored prefix is held"
            assert (await store.get("tokens/t")) == Record("tokens/t", b"3", 3, 3)
            await store.delete("jobs/p/a")
            c = await store.update("jobs/p/b", b"4", b.revision)
            assert await store.get("jobs/p/a") is None
            assert await store.get("jobs/p/b") == c == Record("jobs/p/b", b"4", 5, 2)
        finally:
            await store.close()
        with pytest.raises(NodusError) as e:
            await store.get("jobs/p/b")
        assert reason(e) == "ServiceUnavailable"
    run(body)
