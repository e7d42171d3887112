"""One reader of the PostgreSQL log per process, feeding every watch of the process (ADR 0100).

Each watch used to read the log itself whenever a commit of its prefix woke it: with a hundred REST
watchers on a replica, one create cost a hundred log reads queued on a pool of four connections, and the
last watcher of a follower heard of the create a second or more after it committed. Now a watch reads
the log only to catch up (from its start revision to the head), then takes live events from the
process's `LogTail`, as SQLite's watches take them from its writer: one log read per wake-up, whatever
the number of watches, and none at all for this process's own commits while the tail is caught up.

The tail publishes every revision once, in order: it reads from its cursor, drops what it already
published, and moves the cursor to the snapshot's head. A subscription taken before a watch's catch-up
read closes the gap between them: an event the tail published before the subscription was committed
before it, so the later read's snapshot holds it; anything newer reaches the subscription.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Event, Fanout, Subscription

log = logging.getLogger(__name__)

ReadLog = Callable[[int, int], Awaitable[tuple[Sequence[Event], int]]]
"""Every key's events after a revision (at most a page of them) and the head of the same snapshot."""


def top(key: str) -> str:
    """A key's or a prefix's first segment with its slash ("jobs/" of "jobs/p/x"); "" for one without a slash
    (a watch of such a prefix is woken by every commit)."""
    cut = key.find("/")
    return key[:cut + 1] if cut >= 0 else ""


class LogTail:
    """Reads the log after `cursor` when a commit of a watched top segment wakes it (or every `poll_interval`
    regardless) and publishes the events to the subscriptions whose prefix they match."""

    def __init__(self, read: ReadLog, compacted: Callable[[], int], poll_interval: float, buffer: int,
                 page: int) -> None:
        self._read = read
        self._compacted = compacted
        self.poll_interval = poll_interval
        self.page = page
        self._fanout = Fanout(buffer)
        self._tops: Counter[str] = Counter()
        """The top segments of the live subscriptions' prefixes, counted."""
        self.cursor = 0
        """Every revision up to here has been published (or had no subscription to go to)."""
        self.reads = 0
        """Log reads made, for the tests' and the metrics' counting."""
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def watching(self) -> int:
        return sum(self._tops.values())

    def start(self, head: int) -> None:
        self.cursor = head
        self._task = asyncio.create_task(self._run())

    def subscribe(self, prefix: str, head: int) -> Subscription:
        """A subscription to every event after `head` (a revision known committed) under `prefix`."""
        if not self._tops:
            # Nothing was published while nobody watched: what is at or below `head` the watch's own
            # catch-up read (which comes after this) sees, and the tail goes on from there.
            self.cursor = max(self.cursor, head)
        self._tops[top(prefix)] += 1
        return self._fanout.subscribe(prefix)

    def unsubscribe(self, subscription: Subscription) -> None:
        self._fanout.unsubscribe(subscription)
        name = top(subscription.prefix)
        self._tops[name] -= 1
        if self._tops[name] <= 0:
            del self._tops[name]

    def committed(self, before: int, events: Sequence[Event], tops: Sequence[str]) -> None:
        """This process committed `events` on top of revision `before`. Published here at once when the
        tail has published everything up to `before`; otherwise read with what came before them."""
        if events and self.cursor == before:
            self._fanout.publish(events)
            self.cursor = events[-1].revision
        else:
            self.notified(tops)

    def notified(self, tops: Sequence[str] | None) -> None:
        """Another process committed keys under these top segments (None: unknown, any)."""
        if tops is None or "" in self._tops or any(name in self._tops for name in tops):
            self._wake.set()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._fanout.close()

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()  # cleared before the read: a commit during it wakes the next one
            if self._tops and not await self._catch_up():
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()

    async def _catch_up(self) -> bool:
        """Reads and publishes one page; False when there is more to read at once."""
        self.reads += 1
        try:
            events, head = await self._read(self.cursor, self.page)
        except NodusError as exc:
            if exc.reason == "Expired":
                # Compaction overtook the tail (a process stalled for longer than the history kept): each
                # watch goes back to the log from its own cursor, and fails Expired there if it must.
                self._fanout.overflow_all()
                self.cursor = max(self.cursor, self._compacted())
            else:
                log.warning("reading the store's log for the watches failed (retried at the next poll): %s", exc)
            return True
        except Exception as exc:  # noqa: BLE001 - a dropped connection: the pool replaces it, the poll retries
            log.warning("reading the store's log for the watches failed (retried at the next poll): %s", exc)
            return True
        fresh = [event for event in events if event.revision > self.cursor]
        if fresh:
            self._fanout.publish(fresh)
            self.cursor = fresh[-1].revision
        if len(events) >= self.page:
            return False
        self.cursor = max(self.cursor, head)
        return True

