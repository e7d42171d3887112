"""The embedded store: one SQLite file in WAL mode, written with group commit (docs/adr/0002-store.md).

Why group commit: a durable commit costs an fsync, so one transaction per write caps throughput at
the disk's fsync rate. One writer thread owns the write connection; it takes every operation that is
waiting, applies them in one transaction (each its own revision), commits once, and only then
resolves each caller's future and publishes the events. A failing operation (AlreadyExists,
Conflict, NotFound) is checked before it writes, so it fails alone and the batch commits.

Tables: `kv` holds current values; `log` holds one row per revision (the event, with the previous
value and revision) for watch replay and list-at-revision; `meta` holds the head and compacted
revisions, written in the same transaction as the rows they describe, so a reader's snapshot is
always self-consistent and revisions survive restart even when compaction empties the log.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import sqlite3
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Event, Events, EventType, Fanout, ListResult, Record, follow_log
from nodus.coordinator.store.writes import QueuedWriteStore, Write, WriteKind, check_revision, expired, key_range, \
    precondition

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value BLOB NOT NULL, revision INTEGER NOT NULL, create_revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log (
    revision INTEGER PRIMARY KEY, key TEXT NOT NULL, type INTEGER NOT NULL, value BLOB NOT NULL,
    prev_value BLOB, prev_revision INTEGER, create_revision INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS log_by_key ON log (key, revision);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('revision', 0), ('compacted', 0), ('schema', 1);
"""

_PUT, _DELETE = 1, 2
_TYPES = {_PUT: EventType.PUT, _DELETE: EventType.DELETE}
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_LOG_COLUMNS = "revision, key, type, value, prev_value, create_revision"


@dataclasses.dataclass(slots=True)
class _Compact:
    revision: int
    future: asyncio.Future[None]


_STOP = object()
T = TypeVar("T")

_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]
"""A caller's future with the result or the error to give it, on the loop."""


def _event(row: tuple[Any, ...]) -> Event:
    revision, key, type_, value, prev_value, create_revision = row
    return Event(_TYPES[type_], key, value, revision, prev_value, create_revision)


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly what we say.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


class SqliteStore(QueuedWriteStore):
    """The SQLite engine. Open with `await SqliteStore.open(path)` inside the loop that will use it."""

    creates_together = True
    """A group of creates is one queued write that the writer applies whole or refuses whole (ADR 0108)."""
    READ_THREADS = 4
    """Reads run on their own connections in this many threads, so they never wait for the writer."""
    LOG_PAGE = 500
    """Events read from the log per query while a watch catches up."""
    COMPACT_CHUNK = 5000
    """Log rows deleted per transaction, so compaction never stalls writes for long."""

    def __init__(self, path: Path, synchronous: str, max_batch: int, watch_buffer: int,
                 loop: asyncio.AbstractEventLoop, mirror: Sequence[str] = ()) -> None:
        self.path = path
        self.mirror = tuple(mirror)
        """Key prefixes whose current values are also kept in memory, read on the loop (`get`)."""
        self._mirror: dict[str, tuple[bytes, int, int]] = {}
        """Every key under `mirror`: (value, revision, create revision), as of the last batch resolved on
        the loop. A tuple of bytes and ints, which the collector stops tracking, not a Record."""
        self.synchronous = synchronous
        self.max_batch = max_batch
        self._loop = loop
        self._fanout = Fanout(watch_buffer)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._head = 0  # last committed revision; written by the writer thread only
        self._compacted = 0
        self._readers = concurrent.futures.ThreadPoolExecutor(self.READ_THREADS, "nodus-store-read")
        self._local = threading.local()
        self._read_conns: list[sqlite3.Connection] = []
        self._read_conns_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="nodus-store-write", daemon=True)
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Compaction in progress: target revision and the callers waiting for it.
        self._compacting: tuple[int, list[asyncio.Future[None]]] | None = None

    @classmethod
    async def open(cls, path: Path | str, *, synchronous: str = "FULL", max_batch: int = 1000,
                   watch_buffer: int = 4096, mirror: Sequence[str] = ()) -> SqliteStore:
        """Open (creating if needed) the store at `path`. synchronous=FULL makes every acknowledged
        write survive a crash; NORMAL trades the last commits on power loss for speed.

        `mirror`: key prefixes (the objects the API reads most) whose current values are loaded at open
        and kept up to date on the loop as each batch is resolved, so that `get` of such a key answers
        at once, without a trip to a reader thread: the latest value acknowledged to any writer, which
        is what a reader thread would read (this process is the store's only writer)."""
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        store = cls(Path(path), synchronous, max_batch, watch_buffer, asyncio.get_running_loop(), mirror)
        store._writer.start()
        try:
            await asyncio.wrap_future(store._ready)
        except BaseException:
            store._readers.shutdown(wait=False)
            raise
        return store

    # -- the public interface ------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._head

    @property
    def compacted_revision(self) -> int:
        return self._compacted

    async def get(self, key: str) -> Record | None:
        if self.mirror and key.startswith(self.mirror):
            if self._closed:
                raise NodusError("ServiceUnavailable", "the store is closed")
            held = self._mirror.get(key)
            return None if held is None else Record(key, *held)
        row = await self._read(lambda c: c.execute(
            "SELECT value, revision, create_revision FROM kv WHERE key = ?", (key,)).fetchone())
        return None if row is None else Record(key, row[0], row[1], row[2])

    async def list(self, prefix: str, *, limit: int = 0, start_after: str | None = None,
                   revision: int | None = None) -> ListResult:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        return await self._read(lambda c: self._list(c, prefix, limit, start_after, revision))

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[Event]:
        async with contextlib.aclosing(self.watch_batches(prefix, from_revision)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    def watch_batches(self, prefix: str, from_revision: int) -> AsyncGenerator[Events, None]:
        """Catch up from the log, then follow live events (base.follow_log)."""
        return follow_log(
            from_revision, self.LOG_PAGE, subscribe=lambda: self._fanout.subscribe(prefix),
            unsubscribe=self._fanout.unsubscribe, closed=lambda: self._closed,
            read_log=lambda after: self._read(lambda c: self._read_log(c, prefix, after, self.LOG_PAGE)))

    async def compact(self, revision: int) -> None:
        future: asyncio.Future[None] = self._loop.create_future()
        self._submit(_Compact(revision, future))
        await future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.to_thread(self._writer.join)
        self._fanout.close()
        await asyncio.to_thread(self._readers.shutdown, True)
        with self._read_conns_lock:
            for conn in self._read_conns:
                conn.close()
            self._read_conns.clear()

    # -- reads: on the reader threads, each on its own connection ---------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        return await self._loop.run_in_executor(self._readers, self._in_read_txn, fn)

    def _in_read_txn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path, self.synchronous)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._read_conns_lock:
                self._read_conns.append(conn)
        conn.execute("BEGIN")  # one snapshot for every statement of `fn`
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")

    @staticmethod
    def _meta(conn: sqlite3.Connection) -> tuple[int, int]:
        rows = dict(conn.execute("SELECT name, value FROM meta WHERE name IN ('revision', 'compacted')"))
        return rows["revision"], rows["compacted"]

    def _list(self, conn: sqlite3.Connection, prefix: str, limit: int, start_after: str | None,
              revision: int | None) -> ListResult:
        head, compacted = self._meta(conn)
        where, params = key_range(prefix, start_after, "key", "?", "1")
        if revision is None or revision == head:
            at, sql = head, f"SELECT key, value, revision, create_revision FROM kv WHERE {where} ORDER BY key"
        else:
            check_revision(revision, compacted, head)
            # State at R: keys unchanged since R as they are now, plus, for each key changed after R,
            # what its first change after R replaced (nothing, if that change created it).
            lwhere, lparams = key_range(prefix, start_after, "l.key", "?", "1")
            at = revision
            sql = (f"SELECT key, value, revision, create_revision FROM kv WHERE {where} AND revision <= ? "
                   "UNION ALL SELECT l.key, l.prev_value, l.prev_revision, l.create_revision FROM log AS l "
                   f"WHERE l.revision > ? AND {lwhere} AND l.prev_value IS NOT NULL AND l.revision = "
                   "(SELECT MIN(f.revision) FROM log AS f WHERE f.key = l.key AND f.revision > ?) "
                   "ORDER BY 1")
            params = [*params, revision, revision, *lparams, revision]
        if limit:
            sql += " LIMIT ?"
            params.append(limit + 1)
        rows = conn.execute(sql, params).fetchall()
        more = bool(limit) and len(rows) > limit
        records = tuple(Record(*row) for row in (rows[:limit] if more else rows))
        return ListResult(records, at, more)

    @staticmethod
    def _read_log(conn: sqlite3.Connection, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        head, compacted = SqliteStore._meta(conn)
        if after < compacted:
            raise expired(after, compacted)
        where, params = key_range(prefix, None, "key", "?", "1")
        rows = conn.execute(f"SELECT {_LOG_COLUMNS} FROM log WHERE revision > ? AND {where} "
                            "ORDER BY revision LIMIT ?", [after, *params, limit]).fetchall()
        return [_event(row) for row in rows], head

    # -- writes: queued for the one writer thread -----------------------------------------------

    def _enqueue(self, write: Write) -> None:
        self._submit(write)

    def _submit(self, op: Any) -> None:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        self._queue.put(op)

    def _write_loop(self) -> None:
        try:
            conn = _connect(self.path, self.synchronous)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise RuntimeError(f"SQLite refused WAL mode (got {mode!r}) for {self.path}")
            conn.executescript(SCHEMA)
            head, self._compacted = self._meta(conn)
            last_logged = conn.execute("SELECT MAX(revision) FROM log").fetchone()[0] or 0
            self._head = max(head, last_logged, self._compacted)
            for prefix in self.mirror:  # before any write is taken: the loop only reads it after _ready
                where, params = key_range(prefix, None, "key", "?", "1")
                for key, value, revision, create_revision in conn.execute(
                        f"SELECT key, value, revision, create_revision FROM kv WHERE {where}", params):
                    self._mirror[key] = (value, revision, create_revision)
        except BaseException as exc:  # noqa: BLE001 - handed to the opener
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        stopping = False
        while not stopping:
            ops = self._take_batch(block=self._compacting is None)
            writes = [op for op in ops if isinstance(op, Write)]
            stopping = any(op is _STOP for op in ops)
            if writes:
                self._commit_batch(conn, writes)
            for op in ops:
                if isinstance(op, _Compact):
                    self._start_compaction(conn, op)
            if self._compacting is not None:
                while self._compact_chunk(conn) and stopping:
                    pass  # when stopping, finish the compaction before closing
        conn.close()

    def _take_batch(self, block: bool) -> Sequence[Any]:
        ops: list[Any] = []
        try:
            ops.append(self._queue.get(block=block))
            while len(ops) < self.max_batch:
                ops.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return ops

    def _commit_batch(self, conn: sqlite3.Connection, writes: Sequence[Write]) -> None:
        outcomes: list[_Outcome] = []
        events: list[Event] = []
        revision = self._head
        try:
            conn.execute("BEGIN IMMEDIATE")
            for first in writes:
                ops = (first, *first.together)  # written together: all of them or none (write_together)
                rows = [conn.execute("SELECT value, revision, create_revision FROM kv WHERE key = ?",
                                     (op.key,)).fetchone() for op in ops]
                error = next((e for op, row in zip(ops, rows)
                              if (e := precondition(op, None if row is None else row[1])) is not None), None)
                if error is not None:
                    outcomes.extend((op.future, None, error) for op in ops)
                    continue
                for op, row in zip(ops, rows):
                    revision += 1
                    event = _apply(conn, op, row, revision)
                    events.append(event)
                    outcomes.append((op.future, Record(op.key, event.value, revision, event.create_revision), None))
            if events:
                conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - the writer thread must outlive any one batch
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite rolled back already, or the connection is gone; the batch failed either way
            error = NodusError("InternalError", f"store write failed: {exc}")
            outcomes = [(op.future, None, error) for first in writes for op in (first, *first.together)]
            events = []
        else:
            self._head = revision
        self._deliver(outcomes, events)

    def _start_compaction(self, conn: sqlite3.Connection, op: _Compact) -> None:
        try:
            self._raise_compacted(conn, op)
        except Exception as exc:  # noqa: BLE001 - the writer thread must outlive a failed compaction
            error = exc if isinstance(exc, NodusError) else NodusError("InternalError", f"compaction failed: {exc}")
            self._deliver([(op.future, None, error)], [])
            return
        waiting = self._compacting[1] if self._compacting else []
        self._compacting = (self._compacted, [*waiting, op.future])

    def _raise_compacted(self, conn: sqlite3.Connection, op: _Compact) -> None:
        if op.revision > self._head:
            raise NodusError("BadRequest", f"cannot compact at revision {op.revision}: "
                                           f"the store is at revision {self._head}")
        if op.revision > self._compacted:
            # Raise the bar first, in its own commit: a reader then fails Expired rather than seeing
            # a log with holes in it.
            conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (op.revision,))
            self._compacted = op.revision

    def _compact_chunk(self, conn: sqlite3.Connection) -> bool:
        """Delete one chunk of compacted log rows; True while more remain."""
        assert self._compacting is not None
        target, waiting = self._compacting
        try:
            deleted = conn.execute(
                "DELETE FROM log WHERE revision IN (SELECT revision FROM log WHERE revision <= ? "
                "ORDER BY revision LIMIT ?)", (target, self.COMPACT_CHUNK)).rowcount
        except Exception as exc:  # noqa: BLE001 - leftover rows are harmless: reads honour `compacted`
            self._compacting = None
            error = NodusError("InternalError", f"compaction failed: {exc}")
            self._deliver([(future, None, error) for future in waiting], [])
            return False
        if deleted >= self.COMPACT_CHUNK:
            return True
        self._compacting = None
        self._deliver([(future, None, None) for future in waiting], [])
        return False

    def _deliver(self, outcomes: Sequence[_Outcome], events: Sequence[Event]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._resolve, outcomes, events)
        except RuntimeError:
            pass  # the loop is gone; nobody is waiting any more

    def _resolve(self, outcomes: Sequence[_Outcome], events: Sequence[Event]) -> None:
        # The writers first, then the watchers: a controller resumed by its acknowledgement puts its write
        # in its cache before the cache's own watch reaches the event, which then skips decoding it. The
        # mirror before both: an acknowledged writer's next get reads its own write.
        if self.mirror:
            for event in events:
                if event.key.startswith(self.mirror):
                    if event.type is EventType.DELETE:
                        self._mirror.pop(event.key, None)
                    else:
                        self._mirror[event.key] = (event.value, event.revision, event.create_revision)
        for future, result, error in outcomes:
            if future.done():
                continue  # the caller was cancelled
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if events:
            self._fanout.publish(events)


def _apply(conn: sqlite3.Connection, op: Write, row: tuple[bytes, int, int] | None, revision: int) -> Event:
    """Write one operation whose precondition holds; return its event."""
    insert_log = ("INSERT INTO log (revision, key, type, value, prev_value, prev_revision, create_revision) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)")
    if row is None:  # create
        conn.execute("INSERT INTO kv VALUES (?, ?, ?, ?)", (op.key, op.value, revision, revision))
        conn.execute(insert_log, (revision, op.key, _PUT, op.value, None, None, revision))
        return Event(EventType.PUT, op.key, op.value, revision, None, revision)
    prev_value, prev_revision, create_revision = row
    if op.kind is WriteKind.UPDATE:
        conn.execute("UPDATE kv SET value = ?, revision = ? WHERE key = ?", (op.value, revision, op.key))
        conn.execute(insert_log, (revision, op.key, _PUT, op.value, prev_value, prev_revision, create_revision))
        return Event(EventType.PUT, op.key, op.value, revision, prev_value, create_revision)
    conn.execute("DELETE FROM kv WHERE key = ?", (op.key,))
    conn.execute(insert_log, (revision, op.key, _DELETE, prev_value, prev_value, prev_revision, create_revision))
    return Event(EventType.DELETE, op.key, prev_value, revision, prev_value, create_revision)
