"""Watches of the resource API: the store's events as Kubernetes watch events (ADDED, MODIFIED,
DELETED, BOOKMARK), filtered by the caller's project and selectors, with the initial-events bookmark
of `sendInitialEvents`. The resource service starts one; the transports (REST, gRPC) send them."""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Sequence

import orjson

from .api.kinds import KindInfo
from .identity import Caller, Role
from .selectors import FieldSelector, LabelSelector
from .store.base import Event, EventType, Store

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""
    object: dict[str, Any]


def bookmark(info: KindInfo, revision: int, initial_end: bool = False) -> WatchEvent:
    meta: dict[str, Any] = {"resourceVersion": str(revision)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return WatchEvent("BOOKMARK", {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta})

INITIAL_BATCH = 256
"""Initial ADDED events go out in batches of at most this many."""
LIVE_BATCH = 512
"""At most this many live events are taken into one batch."""


class WatchStream:
    """One watch: `initial` as ADDED events, then the store's events under the kind's prefix after
    `start`, as the caller may see them through its selectors; a BOOKMARK after each quiet
    `bookmark_seconds` when asked for.

    Read it event by event (`async for`) or batch by batch (`next_batch`): a batch is every event
    that is ready when it is asked for, so a transport can send what piled up while it was busy in one
    write (with a hundred watchers, one TLS write per event and watcher is what held the loop).
    Either way each event comes exactly once, in revision order."""

    def __init__(self, store: Store, caller: Caller, info: KindInfo, project: str | None, labels: LabelSelector,
                 fields: FieldSelector, start: int, initial: list[dict[str, Any]], *, send_initial_events: bool,
                 allow_bookmarks: bool, bookmark_seconds: float, cache: EventCache | None = None) -> None:
        self._cache = cache or EventCache()
        self._batches = self._run(store, caller, info, project, labels, fields, start, initial,
                                  send_initial_events, allow_bookmarks, bookmark_seconds, self._cache)
        self._pending: deque[WatchEvent] = deque()

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            self._pending.extend(await self._batches.__anext__())
        return self._pending.popleft()

    async def next_batch(self) -> list[WatchEvent]:
        """Every event ready now (at least one); raises StopAsyncIteration at the end."""
        if self._pending:
            out = list(self._pending)
            self._pending.clear()
            return out
        return await self._batches.__anext__()

    def json_line(self, ev: WatchEvent) -> bytes:
        """`ev` as a line of a JSON watch stream (shared by every watcher of the service)."""
        return self._cache.json_line(ev)

    async def aclose(self) -> None:
        await self._batches.aclose()

    @staticmethod
    async def _run(store: Store, caller: Caller, info: KindInfo, project: str | None, labels: LabelSelector,
                   fields: FieldSelector, start: int, initial: list[dict[str, Any]], send_initial_events: bool,
                   allow_bookmarks: bool, bookmark_seconds: float,
                   cache: EventCache) -> AsyncGenerator[list[WatchEvent], None]:
        for i in range(0, len(initial), INITIAL_BATCH):
            yield [WatchEvent("ADDED", obj) for obj in initial[i:i + INITIAL_BATCH]]
        if send_initial_events:
            yield [bookmark(info, start, initial_end=True)]
        prefix = f"{info.plural}/{project}/" if project else f"{info.plural}/"
        name = fields.name()

        def seen(got: Sequence[Event]) -> list[WatchEvent]:
            """The events the caller sees, as watch events."""
            out = []
            for ev in got:
                if name and not ev.key.endswith("/" + name):
                    continue
                translated = cache.translated(caller, project, labels, fields, ev)
                if translated is not None:
                    out.append(translated)
            return out
        batches = None if allow_bookmarks else store.watch_batches(prefix, start)
        if batches is not None:
            # No timer to keep: the store's batches are read in this task, with no pump task and queue between
            # (per watcher and commit, a wake-up of the pump and a queue hand-off less: ADR 0097).
            try:
                async for got in batches:
                    if out := seen(got):
                        yield out
            finally:
                await batches.aclose()
            return
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1024)
        events = store.watch(prefix, start)

        async def pump() -> None:
            try:
                async for ev in events:
                    await queue.put(ev)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                await queue.put(e)

        task = asyncio.create_task(pump())
        last = start
        try:
            while True:
                if not queue.empty() or not allow_bookmarks:
                    got = [await queue.get()]  # no timer to arm and cancel per batch when none is due
                else:
                    try:
                        async with asyncio.timeout(bookmark_seconds):
                            got = [await queue.get()]
                    except TimeoutError:
                        yield [bookmark(info, last)]
                        continue
                while len(got) < LIVE_BATCH and not queue.empty():
                    got.append(queue.get_nowait())
                ready: list[Event] = []
                error: BaseException | None = None
                for ev in got:
                    if isinstance(ev, BaseException):
                        error = ev  # the pump's end: what came before it goes out first
                        break
                    ready.append(ev)
                if ready:
                    last = ready[-1].revision
                if out := seen(ready):
                    yield out
                if error is not None:
                    raise error
        finally:
            task.cancel()
            try:
                await events.aclose()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                pass


class EventCache:
    """Every store event decoded once for all the watchers that see it (a hundred watchers of one kind
    parsed each object a hundred times). Keyed by revision, which is store-wide and never reused; the
    decoded objects are shared, so watch consumers read them and never change them."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[int, tuple[dict[str, Any], dict[str, Any] | None]] = OrderedDict()
        self._lines: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._translated: OrderedDict[tuple[Any, ...], WatchEvent | None] = OrderedDict()
        """Per (revision, project, selectors): the event as the watchers of that project and selection see
        it, translated once for all of them (the caller only matters to a watch of every project)."""
        self._latest: OrderedDict[str, tuple[int, bytes, dict[str, Any]]] = OrderedDict()
        """Per key, the newest event's (revision, stored bytes, object): the next event's previous value is
        usually those bytes, and then its object, not a second decode (only matched against selectors)."""

    def decode(self, ev: Event) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The event's object (its resourceVersion set to the event's revision) and the one before it
        (its resourceVersion may be set: it is read only to match selectors, which never name it)."""
        hit = self._entries.get(ev.revision)
        if hit is not None:
            return hit
        obj = orjson.loads(ev.value)
        obj["metadata"]["resourceVersion"] = str(ev.revision)
        prev: dict[str, Any] | None = None
        if ev.prev_value is not None:
            last = self._latest.get(ev.key)
            prev = last[2] if last is not None and last[1] == ev.prev_value else orjson.loads(ev.prev_value)
        entry = obj, prev
        self._entries[ev.revision] = entry
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)
        last = self._latest.get(ev.key)
        if last is None or last[0] < ev.revision:
            if ev.type is EventType.DELETE:
                self._latest.pop(ev.key, None)
            else:
                self._latest[ev.key] = (ev.revision, ev.value, obj)
                self._latest.move_to_end(ev.key)
                if len(self._latest) > self._size:
                    self._latest.popitem(last=False)
        return entry

    def translated(self, caller: Caller, project: str | None, labels: LabelSelector, fields: FieldSelector,
                   ev: Event) -> WatchEvent | None:
        """`translate`, once per event for every watcher of one project with the same selectors."""
        if not project:
            return translate(caller, project, labels, fields, ev, self)
        key = ev.revision, project, labels.text, fields.requirements
        try:
            return self._translated[key]
        except KeyError:
            pass
        out = self._translated[key] = translate(caller, project, labels, fields, ev, self)
        if len(self._translated) > self._size:
            self._translated.popitem(last=False)
        return out

    def json_line(self, ev: WatchEvent) -> bytes:
        """The event as one line of a JSON watch stream, encoded once for every watcher sent it."""
        if ev.type == "BOOKMARK":
            return _line(ev)
        key = ev.type, str(ev.object["metadata"].get("resourceVersion", ""))
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _line(ev)
            if len(self._lines) > self._size:
                self._lines.popitem(last=False)
        return line


def _line(ev: WatchEvent) -> bytes:
    return orjson.dumps({"type": ev.type, "object": ev.object}) + b"\n"


def translate(caller: Caller, project: str | None, labels: LabelSelector, fields: FieldSelector,
              ev: Event, cache: EventCache) -> WatchEvent | None:
    """One store event as a watch event of the caller's selection (None: not theirs to see): an object
    that enters the selection is ADDED, one that leaves it DELETED."""
    obj, prev = cache.decode(ev)
    if not project and not caller.can(obj["metadata"]["namespace"], Role.VIEWER):
        return None
    now_match = labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)
    prev_match = prev is not None and labels.matches(prev["metadata"].get("labels")) and fields.matches(prev)
    if ev.type is EventType.DELETE:
        return WatchEvent("DELETED", obj) if (now_match or prev_match) else None
    if now_match and prev_match:
        return WatchEvent("MODIFIED", obj)
    if now_match:
        return WatchEvent("ADDED", obj)
    if prev_match:
        return WatchEvent("DELETED", obj)
    return None
