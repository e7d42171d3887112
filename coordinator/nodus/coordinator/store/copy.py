"""`nodus-coordinator store copy`: move an embedded SQLite store into an empty PostgreSQL one.

Everything is copied as stored: each key's value, revision and create revision, the history the
SQLite store still holds (so lists and watches from any revision above the compacted one keep
working), and the head and compacted revisions, so every object's resourceVersion reads back
identical. Values are copied as bytes, so Secrets stay encrypted under the vault key, which is not in
the store but in the data dir (`secret.key`): start the coordinator on the copy with the same
--data-dir, or copy that file into the new one (docs/adr/0030-postgresql-store.md).

The source is read in one read transaction (a consistent snapshot; stop the coordinator first so
that nothing is written after it). The target is written in one transaction, after checking that it
is empty, so a failed copy leaves it empty.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.pg_schema import migrate


@dataclass(frozen=True)
class Copied:
    keys: int
    history: int
    revision: int
    compacted: int


def _read_sqlite(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int, int]:
    if not path.is_file():
        raise NodusError("NotFound", f"--from: no SQLite store at {path} (expected DIR/store.db of a data dir)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        conn.execute("BEGIN")
        kv = conn.execute("SELECT key, value, revision, create_revision FROM kv ORDER BY key").fetchall()
        log = conn.execute("SELECT revision, key, type, value, prev_value, prev_revision, create_revision "
                           "FROM log ORDER BY revision").fetchall()
        meta = dict(conn.execute("SELECT name, value FROM meta WHERE name IN ('revision', 'compacted')"))
        conn.execute("COMMIT")
    finally:
        conn.close()
    last_logged = log[-1][0] if log else 0
    return kv, log, max(meta["revision"], last_logged, meta["compacted"]), meta["compacted"]


async def copy_sqlite_to_postgres(source: Path, url: str) -> Copied:
    """Copy the SQLite store file `source` into the empty PostgreSQL store at `url`."""
    kv, log, head, compacted = _read_sqlite(source)
    async with await psycopg.AsyncConnection.connect(url, connect_timeout=10) as conn:
        await migrate(conn)
        async with conn.transaction():
            cursor = await conn.execute("SELECT value FROM meta WHERE name = 'revision' FOR UPDATE")
            row = await cursor.fetchone()
            cursor = await conn.execute("SELECT count(*) FROM kv")
            count = await cursor.fetchone()
            if (row and row[0]) or (count and count[0]):
                raise NodusError("AlreadyExists", "--to: the PostgreSQL store is not empty (revision "
                                                  f"{row[0] if row else 0}); copy only into a new database")
            async with conn.cursor().copy("COPY kv (key, value, revision, create_revision) FROM STDIN") as copy:
                for record in kv:
                    await copy.write_row(record)
            async with conn.cursor().copy("COPY log (revision, key, type, value, prev_value, prev_revision, "
                                          "create_revision) FROM STDIN") as copy:
                for entry in log:
                    await copy.write_row(entry)
            await conn.execute("UPDATE meta SET value = %s WHERE name = 'revision'", (head,))
            await conn.execute("UPDATE meta SET value = %s WHERE name = 'compacted'", (compacted,))
    return Copied(len(kv), len(log), head, compacted)
