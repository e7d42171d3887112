"""A watch stream hands a transport every event that piled up in one batch, each event once and in
revision order, whether it is read event by event or batch by batch, and the watchers of one service
share one decode and one JSON encoding of each event (what a hundred watchers used to pay a hundred
times; bench/api.py's watch figure)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.identity import Caller, Role
from nodus.coordinator.selectors import parse_field_selector, parse_label_selector
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.watches import EventCache, WatchStream

JOBS = resolve("jobs")
ADMIN = Caller("test", "*", Role.ADMIN)


def job(name: str, team: str, n: int = 0) -> bytes:
    return orjson.dumps({"apiVersion": "nodus.dev/v1", "kind": "Job",
                         "metadata": {"name": name, "namespace": "default", "labels": {"team": team}},
                         "spec": {"n": n}})


def open_stream(store: SqliteStore, start: int, cache: EventCache, labels: str = "") -> WatchStream:
    return WatchStream(store, ADMIN, JOBS, "default", parse_label_selector(labels), parse_field_selector(""),
                       start, [], send_initial_events=False, allow_bookmarks=False, bookmark_seconds=30.0,
                       cache=cache)


def run(test: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), 30)
    return asyncio.run(bounded())


def test_events_that_piled_up_come_in_one_batch_in_order_each_once(tmp_path: Path) -> None:
    async def test() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            start = store.revision
            cache = EventCache()
            batched, single = open_stream(store, start, cache), open_stream(store, start, cache)
            for i in range(40):
                await store.create(f"jobs/default/j{i:02d}", job(f"j{i:02d}", "a"))
            record = await store.get("jobs/default/j00")
            assert record is not None
            await store.update("jobs/default/j00", job("j00", "a", 1), record.revision)
            await store.delete("jobs/default/j01", None)

            got: list[tuple[str, str]] = []
            batches = 0
            while len(got) < 42:
                batch = await batched.next_batch()
                batches += 1
                got += [(ev.type, ev.object["metadata"]["name"]) for ev in batch]
            assert batches < 42, "events that piled up while the consumer was away come together"
            assert got == [("ADDED", f"j{i:02d}") for i in range(40)] + [("MODIFIED", "j00"), ("DELETED", "j01")]
            one_by_one = [await anext(single) for _ in range(42)]
            assert [(ev.type, ev.object["metadata"]["name"]) for ev in one_by_one] == got
            revisions = [int(ev.object["metadata"]["resourceVersion"]) for ev in one_by_one]
            assert revisions == sorted(set(revisions)), "revision order, no event twice"

            # Both watchers were sent the same encoded line, and it is the event as the wire carries it.
            line = batched.json_line(one_by_one[40])
            assert line is single.json_line(one_by_one[40])
            assert orjson.loads(line) == {"type": "MODIFIED", "object": one_by_one[40].object}
            assert one_by_one[40].object["spec"] == {"n": 1}
            await batched.aclose()
            await single.aclose()
        finally:
            await store.close()
    run(test)


def test_a_label_change_enters_and_leaves_a_selection(tmp_path: Path) -> None:
    """The shared decode keeps each watcher's own selection: the object that enters team=b is ADDED
    for its watcher while the team=a watcher sees it DELETED."""
    async def test() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            cache = EventCache()
            first = await store.create("jobs/default/x", job("x", "a"))
            a, b = open_stream(store, first.revision, cache, "team=a"), open_stream(store, first.revision, cache,
                                                                                      "team=b")
            await store.update("jobs/default/x", job("x", "b"), first.revision)
            [left] = await a.next_batch()
            [entered] = await b.next_batch()
            assert (left.type, entered.type) == ("DELETED", "ADDED")
            assert entered.object["metadata"]["labels"] == {"team": "b"}
            await a.aclose()
            await b.aclose()
        finally:
            await store.close()
    run(test)


def test_an_events_previous_value_is_taken_from_the_last_event_of_its_key_only_when_the_bytes_are_the_same() -> None:
    """EventCache reuses the object of a key's last event as the next event's previous value (no second
    decode), so it must still tell ADDED, MODIFIED and DELETED apart as the labels move, and decode the
    previous value itself when events of the key were not seen (a watch catching up, a skipped write)."""
    from nodus.coordinator.store.base import Event, EventType
    from nodus.coordinator.watches import translate

    def events(cache: EventCache, selector: str, evs: list[Event]) -> list[str | None]:
        labels, fields = parse_label_selector(selector), parse_field_selector("")
        out = []
        for ev in evs:
            got = translate(ADMIN, "default", labels, fields, ev, cache)
            out.append(None if got is None else got.type)
        return out

    a, b, c = job("a", "red"), job("a", "blue"), job("a", "blue", 1)
    key = "jobs/default/a"
    evs = [Event(EventType.PUT, key, a, 1, None, 1), Event(EventType.PUT, key, b, 2, a, 1),
           Event(EventType.PUT, key, c, 3, b, 1), Event(EventType.DELETE, key, c, 4, c, 1)]
    assert events(EventCache(), "team=red", evs) == ["ADDED", "DELETED", None, None]
    assert events(EventCache(), "team=blue", evs) == [None, "ADDED", "MODIFIED", "DELETED"]
    # Events of the key skipped (a cache that saw only the first and the last): decoded, not reused.
    cache = EventCache()
    assert events(cache, "team=blue", [evs[0], evs[2]]) == [None, "MODIFIED"]
    assert events(cache, "team=red", [Event(EventType.PUT, key, a, 5, c, 1)]) == ["ADDED"]
    shared = EventCache()
    first, _ = shared.decode(evs[0])
    _, prev = shared.decode(evs[1])
    assert prev is first, "the previous value is the last event's object, not decoded again"


def test_watchers_of_one_project_and_selection_share_one_translation_and_others_get_their_own() -> None:
    """A hundred watchers of the same project and selectors are sent the event translated once; a watcher
    with other selectors (or another spelling's other meaning) gets its own, and a watch of every project
    is translated per caller, whose projects decide what it may see."""
    from nodus.coordinator.store.base import Event, EventType

    ev = Event(EventType.PUT, "jobs/default/a", job("a", "red"), 7, None, 7)
    cache = EventCache()
    red, red_again = parse_label_selector("team=red"), parse_label_selector("team=red")
    none = parse_field_selector("")
    first = cache.translated(ADMIN, "default", red, none, ev)
    assert first is not None and first.type == "ADDED"
    assert cache.translated(ADMIN, "default", red_again, none, ev) is first, "translated once for both"
    assert cache.translated(ADMIN, "default", parse_label_selector("team=blue"), none, ev) is None
    assert cache.translated(ADMIN, "default", parse_label_selector("team!=red"), none, ev) is None
    named = cache.translated(ADMIN, "default", red, parse_field_selector("metadata.name=b"), ev)
    assert named is None, "another field selector is another selection"
    outsider = Caller("someone", "other", Role.VIEWER)
    assert cache.translated(outsider, None, red, none, ev) is None, "not theirs to see across projects"
    everywhere = cache.translated(ADMIN, None, red, none, ev)
    assert everywhere is not None and everywhere.type == "ADDED"


def test_a_watch_without_bookmarks_reads_the_store_in_its_own_task_and_leaves_no_subscription(tmp_path: Path) -> None:
    """ADR 0097: no pump task and queue between the store and a watch that keeps no bookmark timer; a watch
    with bookmarks keeps its pump. Either way, closed, it leaves nothing subscribed in the store's fan-out."""
    async def test() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            start, tasks = store.revision, len(asyncio.all_tasks())
            plain = open_stream(store, start, EventCache())
            marked = WatchStream(store, ADMIN, JOBS, "default", parse_label_selector(""), parse_field_selector(""),
                                 start, [], send_initial_events=False, allow_bookmarks=True, bookmark_seconds=30.0)
            await store.create("jobs/default/a", job("a", "x"))
            [ev] = await plain.next_batch()
            assert ev.object["metadata"]["name"] == "a"
            assert len(asyncio.all_tasks()) == tasks, "a plain watch runs in its reader's task"
            [ev] = await marked.next_batch()
            assert ev.object["metadata"]["name"] == "a" and len(asyncio.all_tasks()) == tasks + 1, "the bookmark pump"
            await asyncio.gather(*(store.create(f"jobs/default/b{i}", job(f"b{i}", "x")) for i in range(20)))
            got: list[str] = []
            while len(got) < 20:
                got += [e.object["metadata"]["name"] for e in await plain.next_batch()]
            assert sorted(got) == sorted(f"b{i}" for i in range(20)), "every event once"
            await plain.aclose()
            await marked.aclose()
            await asyncio.sleep(0)
            assert not store._fanout._subscriptions, "a closed watch is unsubscribed"
        finally:
            await store.close()
    run(test)
