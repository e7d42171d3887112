"""The PostgreSQL store: the same contract as the SQLite one, on psycopg 3 (docs/adr/0030-postgresql-store.md).

Writes: one writer task owns one connection and commits every waiting operation in one transaction
(group commit, each operation its own revision). The transaction first locks the `meta` revision row
(`SELECT … FOR UPDATE`), so writers from any process are serialised and revisions are handed out in
commit order: a snapshot that sees revision N sees every revision below it, and a watcher never sees
a gap that later fills (no gap rows, unlike kine).

Watch: the watcher reads `log` after its cursor, then waits for a wake-up and reads again. A commit
in this process wakes it at once; a commit elsewhere wakes it through LISTEN/NOTIFY; and a poll
every `poll_interval` seconds wakes it regardless, so correctness never depends on a notification
arriving. Reads run on an async pool, each in one REPEATABLE READ snapshot.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import psycopg_pool

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Event, EventType, ListResult, Record
from nodus.coordinator.store.pg_schema import migrate
from nodus.coordinator.store.writes import QueuedWriteStore, Write, WriteKind, check_revision, expired, key_range, \
    precondition

CHANNEL = "nodus_store"
"""The NOTIFY channel a commit signals on; the payload is the new head revision."""

_PUT, _DELETE = 1, 2
_TYPES = {_PUT: EventType.PUT, _DELETE: EventType.DELETE}
_LOG_COLUMNS = "revision, key, type, value, prev_value, create_revision"
_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

Conn = psycopg.AsyncConnection[Any]


class _Wakeup:
    """Wakes every watcher waiting on the current generation; take `current()` before reading."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


def _event(row: Sequence[Any]) -> Event:
    revision, key, type_, value, prev_value, create_revision = row
    return Event(_TYPES[type_], key, bytes(value), revision, None if prev_value is None else bytes(prev_value),
                 create_revision)


async def _meta(conn: Conn) -> tuple[int, int]:
    cursor = await conn.execute("SELECT name, value FROM meta WHERE name IN ('revision', 'compacted')")
    rows = dict(await cursor.fetchall())
    return int(rows["revision"]), int(rows["compacted"])


def _connect_error(url: str, exc: BaseException) -> NodusError:
    safe = psycopg.conninfo.conninfo_to_dict(url) if _parses(url) else {}
    where = f"{safe.get('host', 'localhost')}:{safe.get('port', 5432)}/{safe.get('dbname', '')}"
    return NodusError("ServiceUnavailable", f"cannot open the PostgreSQL store at {where}: {exc}")


def _parses(url: str) -> bool:
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return False
    return True


class PostgresStore(QueuedWriteStore):
    """The PostgreSQL engine. Open with `await PostgresStore.open(url)` inside the loop that uses it."""

    LOG_PAGE = 500
    COMPACT_CHUNK = 5000

    def __init__(self, url: str, pool: psycopg_pool.AsyncConnectionPool[Any], writer: Conn, max_batch: int,
                 poll_interval: float, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.max_batch = max_batch
        self.poll_interval = poll_interval
        self._pool = pool
        self._writer_conn = writer
        self._loop = loop
        self._queue: asyncio.Queue[Write | None] = asyncio.Queue()
        self._wakeup = _Wakeup()
        self._closed = False
        self._head = 0
        self._compacted = 0
        self._writer_task: asyncio.Task[None] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._listener: Conn | None = None

    @classmethod
    async def open(cls, url: str, *, max_batch: int = 1000, poll_interval: float = 1.0, listen: bool = True,
                   pool_size: int = 4) -> PostgresStore:
        """Open the store at `url` (postgresql://…), migrating its schema. listen=False skips
        LISTEN (watches then see other processes' commits on the poll alone)."""
        if not _parses(url):
            raise NodusError("BadRequest", f"{url.split('@')[-1]!r} is not a PostgreSQL connection URL "
                                           "(postgresql://USER@HOST:PORT/DBNAME)")
        try:
            writer = await psycopg.AsyncConnection.connect(url, connect_timeout=10)
        except psycopg.Error as exc:
            raise _connect_error(url, exc) from exc
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": False})
        try:
            await migrate(writer)
            await pool.open(wait=True, timeout=10)
            store = cls(url, pool, writer, max_batch, poll_interval, asyncio.get_running_loop())
            async with writer.transaction():
                store._head, store._compacted = await _meta(writer)
            if listen:
                store._listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
                await store._listener.execute(f"LISTEN {CHANNEL}")
                store._listen_task = asyncio.create_task(store._listen_loop(store._listener))
        except BaseException as exc:
            await writer.close()
            await pool.close()
            if isinstance(exc, (psycopg.Error, psycopg_pool.PoolTimeout)):
                raise _connect_error(url, exc) from exc
            raise
        store._writer_task = asyncio.create_task(store._write_loop())
        return store

    # -- the public interface ------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._head

    @property
    def compacted_revision(self) -> int:
        return self._compacted

    async def get(self, key: str) -> Record | None:
        async with self._snapshot() as conn:
            cursor = await conn.execute("SELECT value, revision, create_revision FROM kv WHERE key = %s", (key,))
            row = await cursor.fetchone()
        return None if row is None else Record(key, bytes(row[0]), row[1], row[2])

    async def list(self, prefix: str, *, limit: int = 0, start_after: str | None = None,
                   revision: int | None = None) -> ListResult:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        async with self._snapshot() as conn:
            head, compacted = self._seen(*await _meta(conn))
            where, params = key_range(prefix, start_after, "key", "%s", "TRUE")
            if revision is None or revision == head:
                at = head
                sql = f"SELECT key, value, revision, create_revision FROM kv WHERE {where} ORDER BY key"
            else:
                check_revision(revision, compacted, head)
                lwhere, lparams = key_range(prefix, start_after, "l.key", "%s", "TRUE")
                at = revision
                sql = (f"SELECT key, value, revision, create_revision FROM kv WHERE {where} AND revision <= %s "
                       "UNION ALL SELECT l.key, l.prev_value, l.prev_revision, l.create_revision FROM log AS l "
                       f"WHERE l.revision > %s AND {lwhere} AND l.prev_value IS NOT NULL AND l.revision = "
                       "(SELECT MIN(f.revision) FROM log AS f WHERE f.key = l.key AND f.revision > %s) "
                       "ORDER BY 1")
                params = [*params, revision, revision, *lparams, revision]
            if limit:
                sql += " LIMIT %s"
                params.append(limit + 1)
            cursor = await conn.execute(sql.encode(), params)
            rows = await cursor.fetchall()
        more = bool(limit) and len(rows) > limit
        records = tuple(Record(k, bytes(v), r, c) for k, v, r, c in (rows[:limit] if more else rows))
        return ListResult(records, at, more)

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[Event]:
        """Read the log after the cursor; when a read comes back short, wait for a wake-up (a local
        commit, a NOTIFY, or the poll) and read again. The wake-up is taken before the read, so a
        commit that lands during the read is never slept through."""
        cursor = from_revision
        while not self._closed:
            wakeup = self._wakeup.current()
            try:
                events, head = await self._read_log(prefix, cursor, self.LOG_PAGE)
            except NodusError:
                if self._closed:
                    return
                raise
            for event in events:
                yield event
                cursor = event.revision
            if len(events) == self.LOG_PAGE:
                continue
            cursor = max(cursor, head)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), self.poll_interval)

    async def compact(self, revision: int) -> None:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        async with self._pool.connection() as conn:
            async with conn.transaction():
                cursor = await conn.execute("SELECT name, value FROM meta WHERE name IN ('revision', 'compacted') "
                                            "ORDER BY name FOR UPDATE")
                rows = dict(await cursor.fetchall())
                head, compacted = int(rows["revision"]), int(rows["compacted"])
                if revision > head:
                    raise NodusError("BadRequest", f"cannot compact at revision {revision}: "
                                                   f"the store is at revision {head}")
                if revision <= compacted:
                    return
                # Raise the bar first, in its own commit: a reader then fails Expired rather than
                # seeing a log with holes in it.
                await conn.execute("UPDATE meta SET value = %s WHERE name = 'compacted'", (revision,))
            self._compacted = max(self._compacted, revision)
            while True:
                async with conn.transaction():
                    cursor = await conn.execute(
                        "DELETE FROM log WHERE revision IN (SELECT revision FROM log WHERE revision <= %s "
                        "ORDER BY revision LIMIT %s)", (revision, self.COMPACT_CHUNK))
                if cursor.rowcount < self.COMPACT_CHUNK:
                    return

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._queue.put(None)
        if self._listen_task is not None:
            self._listen_task.cancel()
        await asyncio.gather(*(t for t in (self._writer_task, self._listen_task) if t), return_exceptions=True)
        self._wakeup.fire()
        if self._listener is not None:
            await self._listener.close()
        await self._writer_conn.close()
        await self._pool.close()

    # -- reads ---------------------------------------------------------------------------------

    def _seen(self, head: int, compacted: int) -> tuple[int, int]:
        """Note what a snapshot saw (another process may have written) and pass it on."""
        self._head = max(self._head, head)
        self._compacted = max(self._compacted, compacted)
        return head, compacted

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Conn]:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        async with self._pool.connection() as conn:
            async with conn.transaction():
                await conn.execute(_SNAPSHOT)
                yield conn

    async def _read_log(self, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        async with self._snapshot() as conn:
            head, compacted = self._seen(*await _meta(conn))
            if after < compacted:
                raise expired(after, compacted)
            where, params = key_range(prefix, None, "key", "%s", "TRUE")
            cursor = await conn.execute(f"SELECT {_LOG_COLUMNS} FROM log WHERE revision > %s AND {where} "
                                        "ORDER BY revision LIMIT %s".encode(), [after, *params, limit])
            rows = await cursor.fetchall()
        return [_event(row) for row in rows], head

    async def _listen_loop(self, conn: Conn) -> None:
        with contextlib.suppress(psycopg.Error):
            async for _ in conn.notifies():
                self._wakeup.fire()

    # -- writes ----------------------------------------------------------------------------------

    def _enqueue(self, write: Write) -> None:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        self._queue.put_nowait(write)

    async def _write_loop(self) -> None:
        stopping = False
        while not stopping:
            ops = [await self._queue.get()]
            while len(ops) < self.max_batch and not self._queue.empty():
                ops.append(self._queue.get_nowait())
            stopping = None in ops
            writes = [op for op in ops if op is not None]
            if writes:
                await self._commit_batch(self._writer_conn, writes)

    async def _commit_batch(self, conn: Conn, writes: Sequence[Write]) -> None:
        outcomes: list[tuple[asyncio.Future[Record], Record | None, NodusError | None]] = []
        try:
            async with conn.transaction():
                cursor = await conn.execute("SELECT value FROM meta WHERE name = 'revision' FOR UPDATE")
                row = await cursor.fetchone()
                assert row is not None
                revision = int(row[0])
                for op in writes:
                    cursor = await conn.execute(
                        "SELECT value, revision, create_revision FROM kv WHERE key = %s", (op.key,))
                    current = await cursor.fetchone()
                    error = precondition(op, None if current is None else current[1])
                    if error is not None:
                        outcomes.append((op.future, None, error))
                        continue
                    revision += 1
                    record = await _apply(conn, op, current, revision)
                    outcomes.append((op.future, record, None))
                if any(record is not None for _, record, _ in outcomes):
                    await conn.execute("UPDATE meta SET value = %s WHERE name = 'revision'", (revision,))
                    await conn.execute(f"NOTIFY {CHANNEL}")
        except psycopg.Error as exc:
            failure = NodusError("InternalError", f"store write failed: {exc}")
            outcomes = [(op.future, None, failure) for op in writes]
        else:
            self._head = max(self._head, revision)
            self._wakeup.fire()
        for future, result, error in outcomes:
            if future.done():
                continue  # the caller was cancelled; its write may still have committed
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]


_INSERT_LOG = ("INSERT INTO log (revision, key, type, value, prev_value, prev_revision, create_revision) "
               "VALUES (%s, %s, %s, %s, %s, %s, %s)")


async def _apply(conn: Conn, op: Write, row: Sequence[Any] | None, revision: int) -> Record:
    """Write one operation whose precondition holds; return the record its caller gets."""
    if row is None:  # create
        await conn.execute("INSERT INTO kv VALUES (%s, %s, %s, %s)", (op.key, op.value, revision, revision))
        await conn.execute(_INSERT_LOG, (revision, op.key, _PUT, op.value, None, None, revision))
        return Record(op.key, op.value, revision, revision)
    prev_value, prev_revision, create_revision = bytes(row[0]), row[1], row[2]
    if op.kind is WriteKind.UPDATE:
        await conn.execute("UPDATE kv SET value = %s, revision = %s WHERE key = %s", (op.value, revision, op.key))
        await conn.execute(_INSERT_LOG, (revision, op.key, _PUT, op.value, prev_value, prev_revision, create_revision))
        return Record(op.key, op.value, revision, create_revision)
    await conn.execute("DELETE FROM kv WHERE key = %s", (op.key,))
    await conn.execute(_INSERT_LOG, (revision, op.key, _DELETE, prev_value, prev_value, prev_revision, create_revision))
    return Record(op.key, prev_value, revision, create_revision)
