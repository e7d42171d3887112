"""The PostgreSQL store's leases and its fence check (docs/adr/0043-leader-lease-and-fencing.md).

A lease is a row of `lease`, claimed and renewed in its own short transaction on the database's clock,
on a connection of its own so that a claim never queues behind reads for the pool. The write batch
(postgres.py) calls `fence_epochs` inside its transaction, after the revision row lock.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg

from ..errors import NodusError
from .lease import Lease
from .writes import Write

Conn = psycopg.AsyncConnection[Any]

# A renewal by the holder keeps the epoch; a takeover (another holder, the lease ran out) raises it.
# The database's clock decides expiry, so replicas' clocks need not agree.
_CLAIM = """
INSERT INTO lease (name, holder, epoch, expires)
VALUES (%(name)s, %(holder)s, 1, clock_timestamp() + make_interval(secs => %(duration)s))
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN lease.holder = EXCLUDED.holder THEN lease.epoch ELSE lease.epoch + 1 END,
    holder = EXCLUDED.holder, expires = EXCLUDED.expires
WHERE lease.holder = EXCLUDED.holder OR lease.expires <= clock_timestamp()
RETURNING holder, epoch, extract(epoch FROM expires - clock_timestamp())
"""
_READ = "SELECT holder, epoch, extract(epoch FROM expires - clock_timestamp()) FROM lease WHERE name = %s"
_RELEASE = "UPDATE lease SET expires = clock_timestamp() - interval '1 second' WHERE name = %s AND holder = %s"


async def fence_epochs(conn: Conn, writes: Sequence[Write]) -> dict[str, int]:
    """The current epoch of every lease the batch's fenced writes name, share-locked until commit: a
    takeover's UPDATE of the row waits for the batch, so the batch sees the epoch that holds at commit."""
    names = sorted({op.fence.lease for op in writes if op.fence is not None})
    if not names:
        return {}
    cursor = await conn.execute("SELECT name, epoch FROM lease WHERE name = ANY(%s) FOR SHARE", (names,))
    return {name: int(epoch) for name, epoch in await cursor.fetchall()}


def _lease(name: str, row: Sequence[Any]) -> Lease:
    return Lease(name, row[0], int(row[1]), float(row[2]))


class PgLeases:
    def __init__(self, url: str, connect: dict[str, Any]) -> None:
        self.url = url
        self._connect = connect
        self._conn: Conn | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def claim(self, name: str, holder: str, duration: float) -> Lease:
        async with self._connection() as conn:
            async with conn.transaction():
                cursor = await conn.execute(_CLAIM, {"name": name, "holder": holder, "duration": duration})
                row = await cursor.fetchone()
                if row is None:  # held by another holder whose lease has not run out
                    cursor = await conn.execute(_READ, (name,))
                    row = await cursor.fetchone()
        assert row is not None
        return _lease(name, row)

    async def read(self, name: str) -> Lease | None:
        async with self._connection() as conn:
            async with conn.transaction():
                cursor = await conn.execute(_READ, (name,))
                row = await cursor.fetchone()
        return None if row is None else _lease(name, row)

    async def release(self, name: str, holder: str) -> None:
        async with self._connection() as conn:
            async with conn.transaction():
                await conn.execute(_RELEASE, (name, holder))

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """The connection, opened again after the server dropped it; one that failed or was cancelled
        mid-statement (a claim slower than the renew interval) is closed, never reused."""
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                try:
                    conn = self._conn = await psycopg.AsyncConnection.connect(self.url, **self._connect)
                except psycopg.Error as exc:
                    raise NodusError("ServiceUnavailable", f"cannot reach the PostgreSQL store for the lease: "
                                                           f"{exc}") from exc
            try:
                yield conn
            except BaseException as exc:
                self._conn = None
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
                if isinstance(exc, psycopg.Error):
                    raise NodusError("ServiceUnavailable", f"the lease statement failed: {exc}") from exc
                raise
