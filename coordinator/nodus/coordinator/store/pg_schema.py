"""The PostgreSQL store's schema and its versioned migrations (docs/adr/0030-postgresql-store.md).

Migrations run at open, in one transaction that first takes a transaction-scoped advisory lock, so
two coordinators starting at once apply each migration exactly once; `schema_version` records the
last one applied. A store written by a newer release (a version above ours) is refused rather than
guessed at.
"""
from __future__ import annotations

import psycopg

MIGRATION_LOCK = 0x6E6F647573  # "nodus": the advisory lock key held while migrating

MIGRATIONS: tuple[str, ...] = (
    # 1: current values, the history of every revision, the head and compacted revisions.
    # Keys collate "C" so that they order by code point (UTF-8 byte order), as the Store contract says.
    """
    CREATE TABLE kv (
        key TEXT COLLATE "C" PRIMARY KEY, value BYTEA NOT NULL,
        revision BIGINT NOT NULL, create_revision BIGINT NOT NULL
    );
    CREATE TABLE log (
        revision BIGINT PRIMARY KEY, key TEXT COLLATE "C" NOT NULL, type SMALLINT NOT NULL,
        value BYTEA NOT NULL, prev_value BYTEA, prev_revision BIGINT, create_revision BIGINT NOT NULL
    );
    CREATE INDEX log_by_key ON log (key, revision);
    CREATE TABLE meta (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
    INSERT INTO meta VALUES ('revision', 0), ('compacted', 0);
    """,
    # 2: leases (the controllers' leader lease, docs/adr/0043-leader-lease-and-fencing.md), and the
    # epoch each fenced write committed under, so a term's writes can be told apart afterwards.
    """
    CREATE TABLE lease (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch BIGINT NOT NULL, expires TIMESTAMPTZ NOT NULL
    );
    ALTER TABLE log ADD COLUMN epoch BIGINT;
    """,
)


async def migrate(conn: psycopg.AsyncConnection[object]) -> int:
    """Bring the schema to the latest version; return it. Runs inside one transaction."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        cursor = await conn.execute("SELECT max(version) FROM schema_version")
        row = await cursor.fetchone()
        current = int(row[0]) if row and row[0] is not None else 0  # type: ignore[index]
        if current > len(MIGRATIONS):
            raise RuntimeError(f"the PostgreSQL store is at schema version {current}, newer than this "
                               f"release's {len(MIGRATIONS)}: upgrade nodus-coordinator")
        for version in range(current + 1, len(MIGRATIONS) + 1):
            await conn.execute(MIGRATIONS[version - 1].encode())
            await conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))
    return len(MIGRATIONS)
