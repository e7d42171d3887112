"""The PostgreSQL store's leases and its fence check (docs/adr/0043-leader-lease-and-fencing.md,
docs/adr/0110-a-renewal-off-the-loop-and-off-the-fences-lock.md).

A lease is a row of `lease`, claimed and renewed on the database's clock, on a connection of its own
driven by a thread of its own: a claim never queues behind reads for the pool, and its round trips never
wait for a turn of a busy event loop. The write batch (pg_writer.py) reads `FENCE_EPOCHS` inside its
transaction, after the revision row lock.

The locks, and why a renewal does not wait for a write batch: a batch reads the epochs `FOR KEY SHARE`.
That mode conflicts only with `FOR UPDATE`, which a takeover takes before it raises the epoch, so a
deposed leader's write still either commits before the takeover or sees the new epoch. A renewal by the
holder changes only `expires` (an UPDATE of non-key columns: `FOR NO KEY UPDATE`), which a key-share lock
lets through: the leader's renewal no longer waits for every write batch in flight to commit.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from ..errors import NodusError
from .lease import Lease
from .writes import Write

SyncConn = psycopg.Connection[Any]
T = TypeVar("T")

_RETURNING = "RETURNING holder, epoch, extract(epoch FROM expires - clock_timestamp())"
_RENEW = ("UPDATE lease SET expires = clock_timestamp() + make_interval(secs => %(duration)s) "
          f"WHERE name = %(name)s AND holder = %(holder)s {_RETURNING}")
"""The holder's renewal: keeps the epoch, and takes no lock a write batch's fence check holds."""
_READ = "SELECT holder, epoch, extract(epoch FROM expires - clock_timestamp()) FROM lease WHERE name = %s"
_LOCK = "SELECT holder, expires <= clock_timestamp() FROM lease WHERE name = %s FOR UPDATE"
"""A takeover's first step: waits for every write batch that read the epoch to commit."""
_TAKE = ("UPDATE lease SET holder = %(holder)s, epoch = epoch + 1, "
         f"expires = clock_timestamp() + make_interval(secs => %(duration)s) WHERE name = %(name)s {_RETURNING}")
_INSERT = ("INSERT INTO lease (name, holder, epoch, expires) "
           "VALUES (%(name)s, %(holder)s, 1, clock_timestamp() + make_interval(secs => %(duration)s)) "
           f"ON CONFLICT (name) DO NOTHING {_RETURNING}")
_RELEASE = "UPDATE lease SET expires = clock_timestamp() - interval '1 second' WHERE name = %s AND holder = %s"


FENCE_EPOCHS = "SELECT name, epoch FROM lease WHERE name = ANY(%s) FOR KEY SHARE"
"""The current epoch of the leases a batch's fenced writes name, key-share-locked until the batch commits:
a takeover's `FOR UPDATE` waits for the batch, so the batch sees the epoch that holds at commit."""


def fenced_leases(writes: Sequence[Write]) -> list[str]:
    """The leases the batch's fenced writes name (none: the batch reads no epoch)."""
    return sorted({op.fence.lease for first in writes for op in first.group if op.fence is not None})


def _lease(name: str, row: Sequence[Any]) -> Lease:
    return Lease(name, row[0], int(row[1]), float(row[2]))


def claim_on(conn: SyncConn, name: str, holder: str, duration: float) -> Lease:
    """One claim on an autocommit connection: the holder's renewal is one statement; another holder's
    live lease is one read more; only a lease that ran out (or none) is taken in a locked transaction."""
    params = {"name": name, "holder": holder, "duration": duration}
    row = conn.execute(_RENEW, params).fetchone()
    if row is None:
        row = conn.execute(_READ, (name,)).fetchone()
        if row is None or float(row[2]) <= 0:
            with conn.transaction():
                locked = conn.execute(_LOCK, (name,)).fetchone()
                if locked is None:
                    row = conn.execute(_INSERT, params).fetchone()
                elif locked[0] == holder:  # its own lease, run out and not taken over: the epoch stays
                    row = conn.execute(_RENEW, params).fetchone()
                elif locked[1]:
                    row = conn.execute(_TAKE, params).fetchone()
                else:  # renewed meanwhile, or taken by a third replica
                    row = None
                if row is None:
                    row = conn.execute(_READ, (name,)).fetchone()
    assert row is not None
    return _lease(name, row)


class PgLeases:
    """The store's lease statements, run one at a time on one thread and one connection of their own."""

    def __init__(self, url: str, connect: dict[str, Any], statement_timeout: float = 10.0) -> None:
        self.url = url
        self._connect = {**connect, "autocommit": True,
                         "options": f"-c statement_timeout={int(statement_timeout * 1000)}"}
        self._conn: SyncConn | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nodus-lease")
        self._closed = False

    async def claim(self, name: str, holder: str, duration: float) -> Lease:
        return await self._run(claim_on, name, holder, duration)

    async def read(self, name: str) -> Lease | None:
        def read(conn: SyncConn) -> Lease | None:
            row = conn.execute(_READ, (name,)).fetchone()
            return None if row is None else _lease(name, row)
        return await self._run(read)

    async def release(self, name: str, holder: str) -> None:
        def release(conn: SyncConn) -> None:
            conn.execute(_RELEASE, (name, holder))
        await self._run(release)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._drop)  # after any statement still running
        self._thread.shutdown(wait=False)

    async def _run(self, statement: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise NodusError("ServiceUnavailable", "the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(self._on_connection, statement, *args))

    def _on_connection(self, statement: Callable[..., T], *args: Any) -> T:
        """Runs on the lease thread: the connection, opened again after the server dropped it; one that
        failed mid-statement is closed, never reused."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            try:
                conn = self._conn = psycopg.Connection.connect(self.url, **self._connect)
            except psycopg.Error as exc:
                raise NodusError("ServiceUnavailable",
                                 f"cannot reach the PostgreSQL store for the lease: {exc}") from exc
        try:
            return statement(conn, *args)
        except psycopg.Error as exc:
            self._drop()
            raise NodusError("ServiceUnavailable", f"the lease statement failed: {exc}") from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
