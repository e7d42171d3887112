"""Watches of the resource API: the store's events as Kubernetes watch events (ADDED, MODIFIED,
DELETED, BOOKMARK), filtered by the caller's project and selectors, with the initial-events bookmark
of `sendInitialEvents`. The resource service starts one; the transports (REST, gRPC) send them."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

import orjson

from .api.kinds import KindInfo
from .identity import Caller, Role
from .selectors import FieldSelector, LabelSelector
from .store.base import EventType, Store

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

async def stream(store: Store, caller: Caller, info: KindInfo, project: str | None, labels: LabelSelector,
                 fields: FieldSelector, start: int, initial: list[dict[str, Any]], *, send_initial_events: bool,
                 allow_bookmarks: bool, bookmark_seconds: float) -> AsyncIterator[WatchEvent]:
    """`initial` as ADDED events, then the store's events under the kind's prefix after `start`,
    as the caller may see them through its selectors; a BOOKMARK after each quiet `bookmark_seconds`
    when asked for."""
    for obj in initial:
        yield WatchEvent("ADDED", obj)
    if send_initial_events:
        yield bookmark(info, start, initial_end=True)
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1024)
    events = store.watch(f"{info.plural}/{project}/" if project else f"{info.plural}/", start)

    async def pump() -> None:
        try:
            async for ev in events:
                await queue.put(ev)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await queue.put(e)

    task = asyncio.create_task(pump())
    last = start
    name = fields.name()
    try:
        while True:
            try:
                ev = await asyncio.wait_for(queue.get(), bookmark_seconds)
            except asyncio.TimeoutError:
                if allow_bookmarks:
                    yield bookmark(info, last)
                continue
            if isinstance(ev, BaseException):
                raise ev
            last = ev.revision
            if name and not ev.key.endswith("/" + name):
                continue
            out = translate(caller, project, labels, fields, ev)
            if out is not None:
                yield out
    finally:
        task.cancel()
        try:
            await events.aclose()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            pass

def translate(caller: Caller, project: str | None, labels: LabelSelector, fields: FieldSelector,
              ev: Any) -> WatchEvent | None:
    """One store event as a watch event of the caller's selection (None: not theirs to see): an object
    that enters the selection is ADDED, one that leaves it DELETED."""
    obj = orjson.loads(ev.value)
    obj["metadata"]["resourceVersion"] = str(ev.revision)
    if not project and not caller.can(obj["metadata"]["namespace"], Role.VIEWER):
        return None
    now_match = labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)
    prev_match = False
    if ev.prev_value is not None:
        prev = orjson.loads(ev.prev_value)
        prev_match = labels.matches(prev["metadata"].get("labels")) and fields.matches(prev)
    if ev.type is EventType.DELETE:
        return WatchEvent("DELETED", obj) if (now_match or prev_match) else None
    if now_match and prev_match:
        return WatchEvent("MODIFIED", obj)
    if now_match:
        return WatchEvent("ADDED", obj)
    if prev_match:
        return WatchEvent("DELETED", obj)
    return None
