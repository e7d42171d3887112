"""The PostgreSQL store's group commit, on a connection of its own, in two pipelined round trips
(docs/adr/0110-a-renewal-off-the-loop-and-off-the-fences-lock.md; the plan itself is pg_batch.py).

A batch holds the `meta` revision row lock, which serialises every replica's writers, and the fence's
key-share lock on the lease row, from its first statement to its commit. The batch used to be sent from
the event loop one statement at a time (BEGIN, the lock, the fence, the keys, the log rows, the kv rows,
the head, the NOTIFY, COMMIT): about eight round trips, each resumed only when the loop came round to
it, so on a busy replica every other replica's writes waited behind a lock held across loop turns. Now
the batch goes as two pipelines: the lock, the fence and the keys' rows in one; the rows, the head, the
NOTIFY and the COMMIT in the other: two loop turns while the locks are held instead of about eight. (A
thread of its own was tried and measured worse in the fleet burst, ADR 0110.)
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.base import Record
from nodus.coordinator.store.pg_batch import plan
from nodus.coordinator.store.pg_lease import FENCE_EPOCHS, fenced_leases
from nodus.coordinator.store.pg_tail import top
from nodus.coordinator.store.writes import Write

Conn = psycopg.AsyncConnection[Any]
Outcome = tuple[asyncio.Future[Record], Record | None, NodusError | None]

_UPSERT_KV = ("INSERT INTO kv AS k VALUES (%s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, "
              "revision = EXCLUDED.revision, create_revision = EXCLUDED.create_revision")
_INSERT_LOG = ("INSERT INTO log (revision, key, type, value, prev_value, prev_revision, create_revision, epoch) "
               "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")


@dataclass(slots=True)
class Committed:
    """What a batch did: its writes' outcomes, and (when it committed) the log rows it appended."""

    outcomes: list[Outcome]
    before: int = 0
    """The head the batch started from."""
    revision: int = 0
    """The head after it (0: nothing committed)."""
    log: list[tuple[Any, ...]] = field(default_factory=list)
    tops: list[str] = field(default_factory=list)


class _Dropped(Exception):
    """The connection was found dropped before the batch took the revision lock: nothing committed."""


class BatchWriter:
    """Commits batches one at a time (the store's writer task calls it); the connection is opened again
    when the server dropped it, and a batch whose connection turned out dead before it took the lock is
    sent once more."""

    def __init__(self, url: str, connect: dict[str, Any], channel: str) -> None:
        self.url = url
        self._connect = connect
        self._channel = channel
        self._conn: Conn | None = None

    @property
    def backend_pid(self) -> int | None:
        """The server process of the writer's connection (its own NOTIFYs come from it)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    async def connect(self) -> None:
        await self._connection()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _connection(self) -> Conn:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            # autocommit: the batch sends its own BEGIN and COMMIT inside its one pipeline (`_try`)
            conn = self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self._connect)
        return conn

    async def commit(self, writes: Sequence[Write]) -> Committed:
        for retry in (True, False):
            try:
                conn = await self._connection()
            except psycopg.Error as exc:
                where = self.url.split("@")[-1].split("?")[0]
                failure = NodusError("ServiceUnavailable", f"cannot open the PostgreSQL store at {where}: {exc}")
                return Committed([(op.future, None, failure) for first in writes for op in first.group])
            try:
                return await self._try(conn, writes, retry)
            except _Dropped:
                continue
        raise AssertionError("unreachable: the second try does not raise _Dropped")

    async def _try(self, conn: Conn, writes: Sequence[Write], retry: bool) -> Committed:
        locked = False
        try:
            # BEGIN and COMMIT as statements of the pipeline, not `conn.transaction()`: inside a pipeline that
            # nests two more pipelines, each synced on entry and exit, so a batch was four round trips, not two.
            async with conn.pipeline():
                await conn.execute("BEGIN")
                head = await conn.execute("SELECT value FROM meta WHERE name = 'revision' FOR UPDATE")
                names = fenced_leases(writes)
                fence = await conn.execute(FENCE_EPOCHS, (names,)) if names else None
                keys = sorted({op.key for first in writes for op in first.group})
                rows = await conn.execute(
                    "SELECT key, value, revision, create_revision FROM kv WHERE key = ANY(%s)", (keys,))
                row = await head.fetchone()  # the first round trip: the lock, the fence, the keys
                assert row is not None
                locked = True
                before = int(row[0])
                epochs = {} if fence is None else {n: int(e) for n, e in await fence.fetchall()}
                stored = {k: (bytes(v), int(r), int(c)) for k, v, r, c in await rows.fetchall()}
                batch = plan(writes, stored, before, epochs)
                if not batch.changed:
                    await conn.execute("ROLLBACK")  # sent as the pipeline ends
                    return Committed(batch.outcomes)
                tops = sorted({top(key) for key in keys})
                async with conn.cursor() as many:
                    await many.executemany(_INSERT_LOG, batch.log)
                    if batch.deletes:
                        await many.execute("DELETE FROM kv WHERE key = ANY(%s)", (batch.deletes,))
                    if batch.upserts:
                        await many.executemany(_UPSERT_KV, batch.upserts)
                    await many.execute("UPDATE meta SET value = %s WHERE name = 'revision'", (batch.revision,))
                    await many.execute("SELECT pg_notify(%s, %s)", (self._channel, " ".join(tops)))
                await conn.execute("COMMIT")
            # the second round trip: the rows, the head, the NOTIFY and the COMMIT, sent as the pipeline ends
        except psycopg.Error as exc:
            if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):  # the failed batch's transaction, left open by the error
                    await conn.execute("ROLLBACK")
            if retry and not locked and conn.broken:
                raise _Dropped() from exc
            failure = NodusError("InternalError", f"store write failed: {exc}")
            return Committed([(op.future, None, failure) for first in writes for op in first.group])
        return Committed(batch.outcomes, before, batch.revision, batch.log, tops)
