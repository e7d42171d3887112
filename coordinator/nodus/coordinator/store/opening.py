"""Opening the store `--store-url` names: SQLite in the data dir by default, or PostgreSQL
(docs/adr/0030-postgresql-store.md); several coordinators share one PostgreSQL store (ADR 0043)."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import NodusError
from .base import Store
from .postgres import PostgresStore
from .sqlite import SqliteStore

MIRRORED = ("jobs/", "attempts/", "sweeps/", "trainingjobs/")
"""What the embedded store keeps in memory beside the file (SqliteStore's `mirror`): the objects the API
and the controllers read one by one most, so that a GET of one is answered on the loop, never behind a
reader thread (bench/backlog.py's GETs during a burst of creates)."""


async def open_store(url: str, data_dir: Path) -> Store:
    """The store, or SystemExit naming `--store-url` and what is wrong with it."""
    if not url:
        return await SqliteStore.open(data_dir / "store.db", mirror=MIRRORED)
    if not url.startswith(("postgresql://", "postgres://")):
        raise SystemExit(f"--store-url: {url.split('@')[-1]!r} is not a postgresql://USER@HOST:PORT/DBNAME URL "
                         "(leave it unset for the embedded SQLite store in the data dir)")
    try:  # the pid names this replica's sessions in pg_stat_activity (application_name)
        return await PostgresStore.open(url, application_name=f"nodus-coordinator pid={os.getpid()}")
    except NodusError as e:
        raise SystemExit(f"--store-url: {e.message}; check the URL and that the server is up") from e
