"""The PostgreSQL store: the same contract as the SQLite one, on psycopg 3 (docs/adr/0030-postgresql-store.md).

Writes: one writer task gathers every waiting operation into one batch and commits it on a connection of
its own in one transaction of two pipelined round trips (group commit, each operation its own revision;
pg_writer.py, ADR 0110). The transaction first locks the `meta` revision row
(`SELECT … FOR UPDATE`), so writers from any process are serialised and revisions are handed out in
commit order: a snapshot that sees revision N sees every revision below it, and a watcher never sees
a gap that later fills (no gap rows, unlike kine).

Watch: a watch reads `log` after its start revision to catch up, then takes live events from the
process's one `LogTail` (pg_tail.py, ADR 0100), which reads the log once per wake-up for every watch. A
commit in this process reaches the tail at once; a commit elsewhere wakes it through LISTEN/NOTIFY; and
a poll every `poll_interval` seconds wakes it regardless, so correctness never depends on a notification
arriving. A NOTIFY names the first segments ("jobs/" of "jobs/p/x") of the keys its commit wrote, and
wakes the tail only when a watch follows one of them (ADR 0087). Reads run on an async pool of autocommit
connections: a log page with the head it is checked against, and a get, are one statement each (one
snapshot, one round trip, ADR 0091); a list, which reads twice, runs in one REPEATABLE READ transaction.

Leases and fencing (docs/adr/0043-leader-lease-and-fencing.md): a lease is a row of `lease`, claimed
and renewed on the database's clock by a thread and connection of its own (pg_lease.py, ADR 0110). A
batch holding fenced writes reads the epochs they name `FOR KEY SHARE` inside its own transaction, after
the revision row lock, and refuses each fenced write whose epoch moved: a takeover's `FOR UPDATE` of the
lease row waits for that lock, so a deposed leader's write either commits before the takeover or sees the
new epoch; the holder's renewal (a non-key UPDATE) does not wait for it.
A connection the server dropped (pg_terminate_backend, a restart) is replaced on the next use.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Event, Events, EventType, ListResult, Record, follow_log
from nodus.coordinator.store.lease import Fence, Lease
from nodus.coordinator.store.pg_batch import DELETE as _DELETE, PUT as _PUT
from nodus.coordinator.store.pg_lease import PgLeases
from nodus.coordinator.store.pg_schema import migrate
from nodus.coordinator.store.pg_tail import LogTail, top
from nodus.coordinator.store.pg_writer import BatchWriter
from nodus.coordinator.store.writes import QueuedWriteStore, Write, check_revision, expired, key_range

CHANNEL = "nodus_store"
"""The NOTIFY channel a commit signals on; the payload names the top segments of the keys it wrote."""

_TYPES = {_PUT: EventType.PUT, _DELETE: EventType.DELETE}
_LOG_COLUMNS = "revision, key, type, value, prev_value, create_revision"
_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
_READ_LOG = ("SELECT h.value, c.value, l.revision, l.key, l.type, l.value, l.prev_value, l.create_revision "
             "FROM meta AS h JOIN meta AS c ON c.name = 'compacted' LEFT JOIN LATERAL "
             f"(SELECT {_LOG_COLUMNS} FROM log "
             "WHERE revision > %s AND {where} ORDER BY revision LIMIT %s) AS l ON TRUE "
             "WHERE h.name = 'revision' ORDER BY l.revision")
"""A watch's page and the head and compacted revisions it was read at, from one snapshot (one statement):
a row per event, or one row of NULL events when the page is empty."""

Conn = psycopg.AsyncConnection[Any]
T = TypeVar("T")


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

    creates_together = True
    """A group of creates is one queued write that the batch's plan applies whole or refuses whole, fenced like
    the rest of the batch (pg_batch.py, ADR 0118)."""
    LOG_PAGE = 500
    COMPACT_CHUNK = 5000

    def __init__(self, url: str, pool: psycopg_pool.AsyncConnectionPool[Any], writer: BatchWriter, max_batch: int,
                 poll_interval: float, loop: asyncio.AbstractEventLoop, connect: dict[str, Any],
                 watch_buffer: int = 4096) -> None:
        self.url = url
        self._connect = connect
        """Keyword arguments of every connection this store opens (its application_name)."""
        self.max_batch = max_batch
        self.poll_interval = poll_interval
        self._pool = pool
        self._writer = writer
        self._loop = loop
        self._queue: asyncio.Queue[Write | None] = asyncio.Queue()
        self._tail = LogTail(self._read_tail, lambda: self._compacted, poll_interval, watch_buffer, self.LOG_PAGE)
        self._closed = False
        self._head = 0
        self._compacted = 0
        self._writer_task: asyncio.Task[None] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._listener: Conn | None = None
        self._leases = PgLeases(url, connect)

    @classmethod
    async def open(cls, url: str, *, max_batch: int = 1000, poll_interval: float = 1.0, listen: bool = True,
                   pool_size: int = 4, application_name: str = "nodus-coordinator",
                   watch_buffer: int = 4096) -> PostgresStore:
        """Open the store at `url` (postgresql://…), migrating its schema. listen=False skips
        LISTEN (watches then see other processes' commits on the poll alone). `application_name`
        names this process's connections in pg_stat_activity. `watch_buffer`: the live events a watch
        may fall behind by before it goes back to reading the log."""
        if not _parses(url):
            raise NodusError("BadRequest", f"{url.split('@')[-1]!r} is not a PostgreSQL connection URL "
                                           "(postgresql://USER@HOST:PORT/DBNAME)")
        connect: dict[str, Any] = {"application_name": application_name, "connect_timeout": 10}
        try:
            setup = await psycopg.AsyncConnection.connect(url, **connect)
        except psycopg.Error as exc:
            raise _connect_error(url, exc) from exc
        writer = BatchWriter(url, connect, CHANNEL)
        # No `check` (a round trip before every read): a read the server's dropped connection failed runs again
        # (`_pooled`), as a get, a list, a log read and a compaction may (ADR 0119).
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": True, **connect})
        try:
            await migrate(setup)
            await writer.connect()
            await pool.open(wait=True, timeout=10)
            store = cls(url, pool, writer, max_batch, poll_interval, asyncio.get_running_loop(), connect,
                        watch_buffer)
            async with setup.transaction():
                store._head, store._compacted = await _meta(setup)
            await setup.close()
            store._tail.start(store._head)
            if listen:
                store._listener = await store._listen()
                store._listen_task = asyncio.create_task(store._listen_loop())
        except BaseException as exc:
            await setup.close()
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
        async def read(conn: Conn) -> Any:  # one statement: one snapshot, one round trip
            cursor = await conn.execute("SELECT value, revision, create_revision FROM kv WHERE key = %s", (key,))
            return await cursor.fetchone()
        row = await self._pooled(read)
        return None if row is None else Record(key, bytes(row[0]), row[1], row[2])

    async def list(self, prefix: str, *, limit: int = 0, start_after: str | None = None,
                   revision: int | None = None) -> ListResult:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        return await self._pooled(lambda conn: self._list(conn, prefix, limit, start_after, revision), snapshot=True)

    async def _list(self, conn: Conn, prefix: str, limit: int, start_after: str | None,
                    revision: int | None) -> ListResult:
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
        async with contextlib.aclosing(self.watch_batches(prefix, from_revision)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    def watch_batches(self, prefix: str, from_revision: int) -> AsyncGenerator[Events, None]:
        """Catch up from the log, then follow the tail's live events (base.follow_log). Subscribing hands
        the tail the head known committed, so it goes on from there (pg_tail.py)."""
        return follow_log(
            from_revision, self.LOG_PAGE, subscribe=lambda: self._tail.subscribe(prefix, self._head),
            unsubscribe=self._tail.unsubscribe, closed=lambda: self._closed,
            read_log=lambda after: self._read_log(prefix, after, self.LOG_PAGE))

    async def compact(self, revision: int) -> None:
        await self._pooled(lambda conn: self._compact(conn, revision))  # idempotent: run again if dropped

    async def _compact(self, conn: Conn, revision: int) -> None:
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

    async def watch_lag(self) -> int:
        """The store's head now (read from the database) less the newest revision up to which this
        process's watches have read the log; 0 while none is open."""
        if not self._tail.watching:
            return 0
        head, _ = self._seen(*await self._pooled(_meta, snapshot=True))
        return max(0, head - self._tail.cursor)

    # -- leases ----------------------------------------------------------------------------------

    async def claim_lease(self, name: str, holder: str, duration: float) -> Lease:
        return await self._leases.claim(name, holder, duration)

    async def read_lease(self, name: str) -> Lease | None:
        return await self._leases.read(name)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._leases.release(name, holder)

    def _check_fence(self, fence: Fence) -> None:
        """Nothing here: the write's own transaction checks the epoch (`_commit_batch`)."""

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._queue.put(None)
        if self._listen_task is not None:
            self._listen_task.cancel()
        await asyncio.gather(*(t for t in (self._writer_task, self._listen_task) if t), return_exceptions=True)
        await self._tail.close()
        if self._listener is not None:
            await self._listener.close()
        await self._writer.close()
        await self._leases.close()
        await self._pool.close()

    # -- reads ---------------------------------------------------------------------------------

    def _seen(self, head: int, compacted: int) -> tuple[int, int]:
        """Note what a snapshot saw (another process may have written) and pass it on."""
        self._head = max(self._head, head)
        self._compacted = max(self._compacted, compacted)
        return head, compacted

    async def _pooled(self, work: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False) -> T:
        """`work` (a read, or compaction: idempotent) on a pooled connection: outside any transaction (the pool's
        are autocommit; one statement is one snapshot), or with `snapshot` in one REPEATABLE READ transaction. Work
        whose connection the server dropped (pg_terminate_backend, a restart) runs again after the pool has tested its
        idle connections, rather than every read paying a round trip for that test (ADR 0119)."""
        for again in (True, False):
            if self._closed:
                raise NodusError("ServiceUnavailable", "the store is closed")
            async with self._pool.connection() as conn:
                try:
                    if not snapshot:
                        return await work(conn)
                    async with conn.transaction():
                        await conn.execute(_SNAPSHOT)
                        return await work(conn)
                except psycopg.Error:
                    if not (again and conn.broken):
                        raise
            await self._pool.check()  # the others the server dropped with it are replaced, not handed out
        raise AssertionError("unreachable: the second try raises")

    async def _read_tail(self, after: int, limit: int) -> tuple[Sequence[Event], int]:
        """The tail's read: every key's events after `after` (pg_tail.py)."""
        return await self._query_log("", after, limit)

    async def _read_log(self, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        """A watch's catch-up read: the prefix's events after `after` and the head of the same snapshot."""
        return await self._query_log(prefix, after, limit)

    async def _query_log(self, prefix: str, after: int, limit: int) -> tuple[Sequence[Event], int]:
        """The prefix's events after `after` and the head, in ONE statement: PostgreSQL runs a statement
        on one snapshot, so the head and the page agree as they did in a REPEATABLE READ transaction, in one
        round trip instead of five (BEGIN, SET TRANSACTION, the meta row, the page, COMMIT) (ADR 0091)."""
        where, params = key_range(prefix, None, "key", "%s", "TRUE")

        async def read(conn: Conn) -> list[Any]:
            cursor = await conn.execute(_READ_LOG.format(where=where).encode(), [after, *params, limit])
            return await cursor.fetchall()
        rows = await self._pooled(read)
        if not rows:
            raise NodusError("InternalError", "the PostgreSQL store has no meta rows: was its schema dropped?")
        head, compacted = self._seen(int(rows[0][0]), int(rows[0][1]))
        if after < compacted:
            raise expired(after, compacted)
        return [_event(row[2:]) for row in rows if row[2] is not None], head

    async def _listen(self) -> Conn:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self._connect)
        await conn.execute(f"LISTEN {CHANNEL}")
        return conn

    async def _listen_loop(self) -> None:
        """Wakes the watches on every NOTIFY; a dropped LISTEN connection is opened again (the poll
        covers the gap, and a wake-up after reconnecting covers what was sent meanwhile)."""
        while not self._closed:
            conn = self._listener
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    async for note in conn.notifies():
                        if note.pid != self._writer.backend_pid:  # our own commits reached the tail
                            self._tail.notified(note.payload.split() or None)  # an older replica names none
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
                self._listener = None
            await asyncio.sleep(self.poll_interval)
            with contextlib.suppress(psycopg.Error):
                self._listener = await self._listen()
                self._tail.notified(None)

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
                await self._commit_batch(writes)

    async def _commit_batch(self, writes: Sequence[Write]) -> None:
        """Commits `writes` on the writer's connection, publishes the batch's events to this process's
        watches, then answers its writers."""
        batch = await self._writer.commit(writes)
        if batch.revision:
            self._head = max(self._head, batch.revision)
            events = [_event((r, k, t, v, p, c)) for r, k, t, v, p, _, c, _ in batch.log]
            self._tail.committed(batch.before, events, batch.tops)
        _resolve(batch.outcomes)


def _resolve(outcomes: Sequence[tuple[asyncio.Future[Record], Record | None, NodusError | None]]) -> None:
    for future, result, error in outcomes:
        if future.done():
            continue  # the caller was cancelled; its write may still have committed
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

