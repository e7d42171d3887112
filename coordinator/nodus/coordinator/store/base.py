"""The store interface: one ordered keyspace for every kind, with a store-wide revision.

Shaped after etcd's MVCC API because the API layers speak Kubernetes semantics (resourceVersion,
compare-and-swap, watch from a revision, 410 Gone after compaction) and those semantics were
designed around etcd. Keys are opaque strings ordered by code point (callers build them, such as
`jobs/default/train`); values are bytes the caller encoded. SQLite implements this now
(`sqlite.py`); PostgreSQL will implement the same class, so nothing above the store knows the engine.

`Fanout` lives here, not in an engine, because every engine delivers live events the same way: in
process, after commit, with a bounded buffer per watcher (see its docstring).
"""
from __future__ import annotations

import abc
import asyncio
import collections
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from nodus.coordinator.errors import NodusError

from .lease import Lease, LocalLeases


@dataclass(frozen=True, slots=True)
class Record:
    """One key's value as stored."""

    key: str
    value: bytes
    revision: int
    """Revision of the last write of this key: the object's resourceVersion. In the record that
    `Store.delete` returns, the revision of the delete itself."""
    create_revision: int
    """Revision at which this incarnation of the key was created (a re-created key gets a new one)."""


class EventType(enum.Enum):
    """What an event did to its key."""

    PUT = "PUT"  # the key was created (prev_value is None) or updated
    DELETE = "DELETE"  # the key was deleted; the event's value is the value it had when deleted


@dataclass(frozen=True, slots=True)
class Event:
    """One committed write, as watch delivers it."""

    type: EventType
    key: str
    value: bytes
    """The new value; for DELETE, the value as it was when deleted."""
    revision: int
    """The revision of this event; every write gets its own, store-wide."""
    prev_value: bytes | None
    """The value before this event: None for a create; for DELETE, the deleted value."""
    create_revision: int
    """The create revision of the key this event wrote (for DELETE, of the incarnation it ended)."""


Events = list[Event]
"""Events in revision order, as one commit or one page of history delivers them."""


@dataclass(frozen=True, slots=True)
class ListResult:
    """One page of a list."""

    records: tuple[Record, ...]
    revision: int
    """The snapshot the page was read at: pass it back as `revision` for the next page, and watch
    from it to follow changes after the list."""
    more: bool
    """True when keys after the last record match too (continue with start_after=last key)."""


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with `prefix` (None: no bound).

    Lets an engine turn a prefix into a key range, which an ordered index serves without a scan.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code == 0xD800:  # surrogates cannot be encoded; the next valid code point follows them
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class Store(abc.ABC):
    """An async key-value store with a store-wide revision, CAS, watch and compaction.

    Every method is safe to call concurrently from the one asyncio loop that opened the store.
    A write is acknowledged only after it is durable. Errors are `NodusError`s with the reasons
    AlreadyExists, NotFound, Conflict (stale expected revision) and Expired (compacted revision).
    """

    write_observer: Callable[[float], None] | None = None
    """Called with each write's seconds from submit to durable (or refused): the store latency metric."""

    @abc.abstractmethod
    async def create(self, key: str, value: bytes) -> Record:
        """Create `key`; NodusError("AlreadyExists") if it exists."""

    creates_together = False
    """Whether `create_together` is available: several creates in one commit, or none (ADR 0108)."""

    async def create_together(self, items: Sequence[tuple[str, bytes]]) -> list[Record]:
        """Creates every (key, value) of `items` in one commit, with consecutive revisions in their order (a
        watcher sees them in that order, in one batch), or none of them: NodusError("AlreadyExists") naming the
        first key that exists. Only where `creates_together` is True."""
        raise NotImplementedError(f"{type(self).__name__} cannot create keys together")

    async def write_together(self, items: Sequence[tuple[str, bytes, int | None]]) -> list[Record]:
        """As `create_together`, with updates: each (key, value, expected) is a create where `expected` is None
        and a compare-and-swap update on revision `expected` otherwise; all in one commit, in their order, or none
        of them, each refused with the first refusal (AlreadyExists, NotFound, Conflict; LeaderDeposed for a
        fenced write). Only where `creates_together` is True (ADR 0127)."""
        raise NotImplementedError(f"{type(self).__name__} cannot write keys together")

    @abc.abstractmethod
    async def update(self, key: str, value: bytes, expected_revision: int | None) -> Record:
        """Replace `key`'s value. With `expected_revision`, only if the key's revision still equals
        it (NodusError("Conflict") otherwise); None writes unconditionally. NotFound if missing."""

    @abc.abstractmethod
    async def delete(self, key: str, expected_revision: int | None = None) -> Record:
        """Delete `key` and return what was deleted: its last value and create revision, with
        `revision` set to the delete's own revision. NotFound if missing; Conflict if stale."""

    @abc.abstractmethod
    async def get(self, key: str) -> Record | None:
        """The current record of `key`, or None."""

    @abc.abstractmethod
    async def list(self, prefix: str, *, limit: int = 0, start_after: str | None = None,
                   revision: int | None = None) -> ListResult:
        """Records whose key starts with `prefix`, in key order, after `start_after`, at most `limit`
        (0: all). revision=None reads the current state; a given revision reads the state as of
        that revision, so that paging stays on one snapshot (NodusError("Expired") if compacted)."""

    @abc.abstractmethod
    def watch(self, prefix: str, from_revision: int) -> AsyncIterator[Event]:
        """Every event on keys under `prefix` with revision > from_revision, in revision order, then
        live events, without gap or duplicate. Raises NodusError("Expired") on the first iteration if
        from_revision is below the compacted revision. The caller stops it with `aclose()`; it ends
        when the store closes."""

    def watch_batches(self, prefix: str, from_revision: int) -> AsyncGenerator[Events, None] | None:
        """`watch` as the lists of events at hand at once (a commit's, a page of history), for an engine that
        has them without a task of its own; None where it does not (the caller then batches `watch` itself)."""
        return None

    @abc.abstractmethod
    async def compact(self, revision: int) -> None:
        """Drop history at or below `revision`; current values stay. Watches and lists from below
        it fail with Expired afterwards. The coordinator decides when (the policy is not here)."""

    @property
    @abc.abstractmethod
    def revision(self) -> int:
        """The revision of the latest committed write (0 for an empty store)."""

    @property
    @abc.abstractmethod
    def compacted_revision(self) -> int:
        """History at or below this revision is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish the writes already submitted, end the watches, release the files."""

    # -- leases (store/lease.py): engines shared by several processes override these -------------

    def _local_leases(self) -> LocalLeases:
        table = self.__dict__.get("_lease_table")
        if table is None:
            table = self.__dict__["_lease_table"] = LocalLeases()
        return table

    async def claim_lease(self, name: str, holder: str, duration: float) -> Lease:
        """Take lease `name` for `duration` seconds if it is free, ran out, or is `holder`'s already
        (a renewal keeps the epoch; a takeover raises it). Returns the lease as it stands after,
        whoever holds it. In one process's store (the default here) the lease lives in memory."""
        return self._local_leases().claim(name, holder, duration)

    async def read_lease(self, name: str) -> Lease | None:
        return self._local_leases().read(name)

    async def release_lease(self, name: str, holder: str) -> None:
        """Let `holder`'s lease run out now, so that another replica takes over without waiting."""
        self._local_leases().release(name, holder)

    async def watch_lag(self) -> int:
        """Revisions committed that this process's watches have not read yet. An in-process engine
        delivers every commit to its watches as it commits: 0."""
        return 0


class Subscription:
    """One watcher's bounded buffer of live events.

    A watcher that falls `limit` events behind is not allowed to grow memory: its buffer is dropped
    and `next()` returns None, and the watch catches up from the durable history instead, then
    subscribes afresh. So a slow watcher costs reads, not memory, and fails (Expired) only if
    compaction overtakes it.
    """

    __slots__ = ("prefix", "limit", "_events", "_wakeup", "overflowed", "closed")

    def __init__(self, prefix: str, limit: int) -> None:
        self.prefix = prefix
        self.limit = limit
        self._events: collections.deque[Event] = collections.deque()
        self._wakeup = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def offer(self, event: Event) -> None:
        if self.overflowed or self.closed:
            return
        if len(self._events) >= self.limit:
            self.overflowed = True
            self._events.clear()
        else:
            self._events.append(event)
        self._wakeup.set()

    def overflow(self) -> None:
        """Drop the buffer: the watcher goes back to the durable history (its publisher lost the thread)."""
        self.overflowed = True
        self._events.clear()
        self._wakeup.set()

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()

    async def next(self) -> Event | None:
        """The next buffered event; None once overflowed or closed (check which)."""
        while True:
            if self.overflowed or self.closed:
                return None
            if self._events:
                return self._events.popleft()
            self._wakeup.clear()
            await self._wakeup.wait()

    async def next_batch(self) -> Events | None:
        """Every buffered event (at least one); None once overflowed or closed (check which)."""
        while True:
            if self.overflowed or self.closed:
                return None
            if self._events:
                out = list(self._events)
                self._events.clear()
                return out
            self._wakeup.clear()
            await self._wakeup.wait()


class Fanout:
    """In-process delivery of committed events to the live subscriptions whose prefix matches."""

    def __init__(self, buffer: int) -> None:
        self.buffer = buffer
        self._subscriptions: set[Subscription] = set()

    def subscribe(self, prefix: str) -> Subscription:
        subscription = Subscription(prefix, self.buffer)
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

    def publish(self, events: Iterable[Event]) -> None:
        """Call on the loop, in commit order, only after the events are durable."""
        for subscription in self._subscriptions:
            prefix = subscription.prefix
            for event in events:
                if event.key.startswith(prefix):
                    subscription.offer(event)

    def overflow_all(self) -> None:
        for subscription in self._subscriptions:
            subscription.overflow()

    def close(self) -> None:
        for subscription in self._subscriptions:
            subscription.close()
        self._subscriptions.clear()


async def follow_log(from_revision: int, page: int, *, subscribe: Callable[[], Subscription],
                     unsubscribe: Callable[[Subscription], None],
                     read_log: Callable[[int], Awaitable[tuple[Sequence[Event], int]]],
                     closed: Callable[[], bool]) -> AsyncGenerator[Events, None]:
    """`Store.watch_batches` for an engine with a durable log and in-process live events: catch up from
    the log (`read_log(after)`: up to `page` events after a revision and the head of that snapshot), a
    page at a time, then follow the live subscription (what is buffered at each wake-up, at once); back
    to the log after an overflow.

    Subscribing before reading the log is what closes the gap: an event published before the
    subscription was committed before it, so the log read (which starts later) sees it; an event
    published after is in the buffer. Buffered events at or below the cursor are duplicates.
    """
    cursor = from_revision
    while not closed():
        subscription = subscribe()
        try:
            while True:
                try:
                    events, head = await read_log(cursor)
                except NodusError:
                    if closed():
                        return
                    raise
                if events:
                    cursor = events[-1].revision
                    yield list(events)
                if len(events) < page:
                    # The page held every matching event of that snapshot, whose head is `head`.
                    cursor = max(cursor, head)
                    break
            while (live := await subscription.next_batch()) is not None:
                fresh = [event for event in live if event.revision > cursor]
                if fresh:
                    cursor = fresh[-1].revision
                    yield fresh
            if subscription.closed:
                return
        finally:
            unsubscribe(subscription)
