"""What the SQL stores share: the queued write, its precondition, key ranges and revision checks.

SQLite and PostgreSQL both queue every create, update and delete for one writer that commits them in
groups; only the queue (a thread's queue, an asyncio queue) and the SQL dialect differ.
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import enum
import time
from typing import Any, Sequence

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Record, Store, prefix_end
from nodus.coordinator.store.lease import FENCE, Fence


class WriteKind(enum.Enum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclasses.dataclass(slots=True)
class Write:
    """One create, update or delete waiting for the writer."""

    kind: WriteKind
    key: str
    value: bytes
    expected: int | None
    future: asyncio.Future[Record]
    fence: Fence | None = None
    """The lease epoch this write commits under (a controller's write), or None (unfenced)."""
    together: tuple["Write", ...] = ()
    """Writes that commit with this one, after it, or fail with it (`Store.create_together`, `write_together`);
    queued as one."""

    @property
    def group(self) -> tuple["Write", ...]:
        """This write and the creates `together` with it, in commit order."""
        return (self, *self.together)


def _checked(key: str, value: bytes) -> tuple[str, bytes]:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a key is a non-empty str, not {key!r}")
    if not isinstance(value, bytes):
        raise TypeError(f"a value is bytes, not {type(value).__name__}")
    return key, value


def precondition(op: Write, revision: int | None) -> NodusError | None:
    """Why `op` cannot apply to a key at `revision` (None: the key does not exist), or None."""
    if op.kind is WriteKind.CREATE:
        return NodusError("AlreadyExists", f"{op.key} already exists") if revision is not None else None
    if revision is None:
        return NodusError("NotFound", f"{op.key} not found")
    if op.expected is not None and op.expected != revision:
        return NodusError("Conflict", f"{op.key} is at revision {revision}, not {op.expected}")
    return None


def key_range(prefix: str, start_after: str | None, column: str, mark: str, true: str) -> tuple[str, list[Any]]:
    """SQL conditions selecting keys under `prefix` after `start_after`, as a range on the index;
    `mark` is the dialect's parameter placeholder and `true` its always-true condition."""
    conditions, params = [true], []
    if prefix:
        conditions.append(f"{column} >= {mark}")
        params.append(prefix)
        end = prefix_end(prefix)
        if end is not None:
            conditions.append(f"{column} < {mark}")
            params.append(end)
    if start_after is not None:
        conditions.append(f"{column} > {mark}")
        params.append(start_after)
    return " AND ".join(conditions), params


def expired(revision: int, compacted: int) -> NodusError:
    return NodusError("Expired", f"revision {revision} has been compacted (compacted revision: {compacted})")


def check_revision(revision: int, compacted: int, head: int) -> None:
    """Refuses reading at a revision that is compacted away or not written yet."""
    if revision < compacted:
        raise expired(revision, compacted)
    if revision > head:
        # Kubernetes answers a resourceVersion from the future with 504 "Too large resource version".
        raise NodusError("Timeout", f"Too large resource version: {revision}, current: {head}")


class QueuedWriteStore(Store):
    """A Store whose writes are queued for one writer: create, update and delete check their
    arguments here and hand a `Write` to `_enqueue`, whose future the writer resolves after commit."""

    async def create(self, key: str, value: bytes) -> Record:
        return await self._submit_write(WriteKind.CREATE, key, value, None)

    async def update(self, key: str, value: bytes, expected_revision: int | None) -> Record:
        return await self._submit_write(WriteKind.UPDATE, key, value, expected_revision)

    async def delete(self, key: str, expected_revision: int | None = None) -> Record:
        return await self._submit_write(WriteKind.DELETE, key, b"", expected_revision)

    async def create_together(self, items: Sequence[tuple[str, bytes]]) -> list[Record]:
        if not self.creates_together:
            return await super().create_together(items)
        return await self.write_together([(key, value, None) for key, value in items])

    async def write_together(self, items: Sequence[tuple[str, bytes, int | None]]) -> list[Record]:
        if not self.creates_together:
            return await super().write_together(items)
        if not items or len({key for key, _, _ in items}) != len(items):
            raise ValueError(f"writing together needs distinct keys, not {[key for key, _, _ in items]!r}")
        fence = self._fence()
        loop = asyncio.get_running_loop()
        writes = [Write(WriteKind.CREATE if expected is None else WriteKind.UPDATE, *_checked(key, value), expected,
                        loop.create_future(), fence)
                  for key, value, expected in items]
        first, rest = writes[0], tuple(writes[1:])
        first.together = rest
        self._enqueue(first)
        started = time.perf_counter()
        try:
            # One by one, not gathered: the writer resolves them all at once, so the caller resumes before the
            # watchers are told (a controller's cache takes its own writes first, as with a single write).
            return [await w.future for w in writes]
        except BaseException:
            for w in writes:
                if w.future.done() and not w.future.cancelled():
                    w.future.exception()  # the same refusal for each: retrieved, so none is logged as lost
            raise
        finally:
            if self.write_observer is not None:
                self.write_observer(time.perf_counter() - started)

    async def _submit_write(self, kind: WriteKind, key: str, value: bytes, expected: int | None) -> Record:
        key, value = _checked(key, value)
        fence = self._fence()
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        self._enqueue(Write(kind, key, value, expected, future, fence))
        # A caller cancelled here may still find its write committed, as with any database.
        started = time.perf_counter()
        try:
            return await future
        finally:
            if self.write_observer is not None:
                self.write_observer(time.perf_counter() - started)

    def _fence(self) -> Fence | None:
        fence = FENCE.get()
        if fence is not None:
            self._check_fence(fence)
        return fence

    def _check_fence(self, fence: Fence) -> None:
        """Refuses (LeaderDeposed) a write whose fence no longer holds. In one process's store the
        in-memory lease decides at once; an engine shared by several processes checks in the write's
        own transaction instead and overrides this to do nothing here."""
        self._local_leases().check(fence)

    @abc.abstractmethod
    def _enqueue(self, write: Write) -> None:
        """Queue `write` for the writer; NodusError("ServiceUnavailable") once the store is closed."""
