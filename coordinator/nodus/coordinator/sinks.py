"""Output sinks: a committed output loaded into a table of the customer's PostgreSQL (issue 16 item 4).

`spec.outputs[i].sink` {connection, table, mode} names a Postgres Connection of the project. Once an
index commits that output, the loader reads it from the blob store (a JSON Lines, CSV or Parquet file,
by the output path's extension) and loads it in one transaction: `Append` adds the rows, `Replace`
deletes the table's rows first, so a reader sees the old rows or the new ones, never a mix. Columns
are the file's (JSON keys in first-seen order, the CSV header, the Parquet schema); the table must
exist. The outcome goes into `status.outputs[].sink` {phase Pending → Loading → Loaded | Failed, rows,
message}: the Job controller writes Pending when the output is committed, Loading is written before the
load starts, so a coordinator that stops mid-load finds it and loads again. Every load is exactly once:
the transaction that copies the rows also records the load (`_nodus_sink_loads` beside the table: the
Job's uid, index, output, rank and the output's sha256), and a load that finds its record commits
nothing and answers the rows it recorded, so an Append that committed just before a crash, or a pass
that saw its own Loading again, is never repeated (ADR 0042).

A directory output (the agent archives it as tar.zst) loads every .jsonl, .ndjson, .csv and .parquet file
in it, in path order, each with its own columns, in the same one transaction; a directory with none of
them fails naming the formats.

Level-triggered: the cache's Job events mark the Jobs with a sink to load (`pending` is the pure
decision), a start and a resync every RESYNC_SECONDS mark every stored one (a finished Job may never
change again, so a pass that failed before its outcome was written, such as a store write refused, is
retried there), and each marked Job is loaded in turn.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import csv
import io
import logging
import tarfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence

import orjson
import zstandard

from .api.connection import POSTGRES_KEYS
from .controllers.cache import JOBS, Cache, job_key
from .controllers.objects import Objects
from .errors import NodusError
from .vault import Vault

log = logging.getLogger("nodus.sinks")

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LOADS_TABLE = "_nodus_sink_loads"
"""The table, in the sink table's schema, where every load records itself in the load's own transaction."""
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
RESYNC_SECONDS = 60.0
"""How often every Job with a sink still Pending or Loading is looked at again without an event."""


class Blobs(Protocol):
    """What the loader needs of the embedded blob store (blobs.BlobStore)."""

    async def read_all(self, sha256: str) -> bytes: ...


# -- the decision (pure) --------------------------------------------------------------------------------

def pending(job: dict[str, Any]) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(position in status.outputs, the committed output, its declared sink) of each committed output
    whose sink has not been loaded or failed yet (Pending, or Loading left by a stopped coordinator)."""
    declared = {o.get("name"): o.get("sink") for o in (job.get("spec") or {}).get("outputs") or []
                if isinstance(o, dict) and o.get("sink")}
    if not declared:
        return []
    out = []
    for i, committed in enumerate((job.get("status") or {}).get("outputs") or []):
        sink = declared.get(committed.get("name"))
        if sink and ((committed.get("sink") or {}).get("phase") or "Pending") in ("Pending", "Loading"):
            out.append((i, committed, sink))
    return out


def format_of(path: str) -> str | None:
    return FORMATS.get(Path(path).suffix.lower())


# -- reading the file -----------------------------------------------------------------------------------

def rows_of(data: bytes, fmt: str) -> tuple[list[str], Iterator[Sequence[Any]]]:
    """(columns, rows) of an output file. Raises ValueError naming the line or the problem."""
    if fmt == "jsonl":
        docs = []
        for n, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"line {n} is not JSON: {e}") from None
            if not isinstance(doc, dict):
                raise ValueError(f"line {n} is not a JSON object")
            docs.append(doc)
        columns = list(dict.fromkeys(k for d in docs for k in d))
        return columns, (tuple(_cell(d.get(c)) for c in columns) for d in docs)
    if fmt == "csv":
        reader = csv.reader(io.StringIO(data.decode("utf-8")))
        header = next(reader, None)
        if not header:
            raise ValueError("the CSV file has no header row")
        width = len(header)
        return header, (tuple(r) + (None,) * (width - len(r)) for r in reader if r)
    import pyarrow.parquet as pq  # noqa: PLC0415 - only sinks of Parquet files need it

    table = pq.read_table(io.BytesIO(data))
    return list(table.column_names), (tuple(_cell(v) for v in row.values()) for row in table.to_pylist())


Part = tuple[list[str], Iterable[Sequence[Any]]]
"""One file's (columns, rows): a file output is one part, a directory output one per loadable file."""


def parts_of(data: bytes, path: str, output: str) -> list[Part]:
    """The parts a committed output loads: a file by its path's extension, a directory (a tar.zst
    archive) as each of its loadable files in path order. Raises ValueError naming what cannot load."""
    if not data.startswith(ZSTD_MAGIC):
        fmt = format_of(path)
        if fmt is None:
            raise ValueError(f"output {output} ({path}) is not a .jsonl, .ndjson, .csv or .parquet file "
                             "nor a directory holding some: a sink loads those")
        return [rows_of(data, fmt)]
    files: list[tuple[str, bytes]] = []
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as raw, \
                tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                fmt = format_of(member.name)
                if member.isfile() and fmt is not None:
                    f = tar.extractfile(member)
                    files.append((member.name, f.read() if f else b""))
    except (zstandard.ZstdError, tarfile.TarError) as e:
        raise ValueError(f"output {output} ({path}) is not a readable directory archive: {e}") from None
    if not files:
        raise ValueError(f"output {output} is a directory ({path}) with no .jsonl, .ndjson, .csv or .parquet "
                         "file in it: write the rows to such a file there, or name the file as the output")
    out: list[Part] = []
    for name, body in sorted(files):
        try:
            out.append(rows_of(body, str(format_of(name))))
        except ValueError as e:
            raise ValueError(f"{name.removeprefix('./')}: {e}") from None
    return out


def _cell(value: Any) -> Any:
    """A value COPY can write: nested JSON as its JSON text."""
    return orjson.dumps(value).decode() if isinstance(value, (dict, list)) else value


def load(dsn: dict[str, Any], table: str, mode: str, parts: Sequence[Part], load_id: str) -> int:
    """Loads every part's rows into `table` in one transaction (Replace: its rows are deleted first) that
    also records `load_id`; the rows loaded. A load whose id is recorded already loads nothing and answers
    its rows."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    names = table.split(".", 1)
    name = sql.Identifier(*names)
    loads = sql.Identifier(*(names[:-1] + [LOADS_TABLE]))  # beside the table, in its schema
    count = 0
    with psycopg.connect(**dsn, connect_timeout=10, autocommit=False) as conn:
        with conn.transaction(), conn.cursor() as cur:
            # Two passes of one load at once (an old leader's and the new one's, ADR 0043) take turns from
            # here: the second then finds the first's record instead of failing on its primary key (or on
            # creating the record's table beside it).
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (load_id,))
            cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (load_id text PRIMARY KEY, rows bigint NOT NULL, "
                                "loaded_at timestamptz NOT NULL DEFAULT now())").format(loads))
            cur.execute(sql.SQL("SELECT rows FROM {} WHERE load_id = %s").format(loads), (load_id,))
            done = cur.fetchone()
            if done is not None:
                return int(done[0])  # loaded before (a crash before its Loaded, or a second pass): once only
            if mode == "Replace":
                cur.execute(sql.SQL("DELETE FROM {}").format(name))
            for columns, rows in parts:
                if not columns:
                    continue  # an empty file: nothing to copy
                copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
                    name, sql.SQL(", ").join(map(sql.Identifier, columns)))
                with cur.copy(copy_sql) as copy:
                    for row in rows:
                        copy.write_row(row)
                        count += 1
            cur.execute(sql.SQL("INSERT INTO {} (load_id, rows) VALUES (%s, %s)").format(loads), (load_id, count))
    return count


# -- the executor ---------------------------------------------------------------------------------------

class SinkLoader:
    def __init__(self, cache: Cache, objects: Objects, blobs: Blobs | None, vault: Vault,
                 resync_seconds: float = RESYNC_SECONDS) -> None:
        self.cache, self.objects, self.blobs, self.vault = cache, objects, blobs, vault
        self.resync_seconds = resync_seconds
        self._marked: set[str] = set()
        self._wake = asyncio.Event()
        cache.listen(JOBS, self._on_job)

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and pending(new):
            self._marked.add(key)
            self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # one round per resync: every Job with a sink still Pending or Loading is marked
            self._marked.update(key for key, job in self.cache.under(JOBS) if pending(job))
            resync_at = loop.time() + self.resync_seconds
            while True:
                while self._marked:
                    await self._pass(self._marked.pop())
                try:  # not asyncio.wait_for: on 3.11 it can swallow a cancel racing the event (gh-86296)
                    async with asyncio.timeout_at(resync_at):
                        await self._wake.wait()
                except TimeoutError:
                    break
                self._wake.clear()

    async def _pass(self, key: str) -> None:
        job = self.cache.get(key)
        try:
            for _, committed, sink in pending(job or {}):
                await self._load_one(job or {}, committed, sink)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the Job's next change, or the next resync, marks it again
            log.exception("output sinks: loading %s failed", key)

    async def _load_one(self, job: dict[str, Any], committed: dict[str, Any], sink: dict[str, Any]) -> None:
        project, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = (committed.get("index"), committed.get("name"), committed.get("rank"))
        load_id = "/".join(str(p) for p in (job["metadata"].get("uid"), *key, committed.get("sha256")))
        await self._set(project, name, key, {"phase": "Loading"})
        try:
            rows = await self._load(project, committed, sink, load_id)
        except NodusError as e:
            await self._set(project, name, key, {"phase": "Failed", "message": e.message})
            return
        except ValueError as e:  # the file's words (parts_of, rows_of), naming the file and the line
            await self._set(project, name, key, {"phase": "Failed", "message": str(e)})
            return
        except Exception as e:  # noqa: BLE001 - the database's words, for the customer
            await self._set(project, name, key, {"phase": "Failed", "message": f"{type(e).__name__}: {e}"})
            return
        await self._set(project, name, key, {"phase": "Loaded", "rows": rows})
        log.info("job %s/%s: output %s (index %s) loaded into %s: %d rows", project, name, committed.get("name"),
                 committed.get("index"), sink["table"], rows)

    async def _load(self, project: str, committed: dict[str, Any], sink: dict[str, Any], load_id: str) -> int:
        if self.blobs is None:
            raise NodusError("ServiceUnavailable", "this coordinator keeps no blob store to read outputs from")
        data = await self.blobs.read_all(str(committed.get("sha256")))
        parts = await asyncio.to_thread(parts_of, data, str(committed.get("path") or ""), str(committed.get("name")))
        dsn = await self._dsn(project, str(sink["connection"]))
        return await asyncio.to_thread(load, dsn, str(sink["table"]), str(sink.get("mode") or "Append"), parts,
                                       load_id)

    async def _dsn(self, project: str, conn_name: str) -> dict[str, Any]:
        found = await self.objects.read(f"connections/{project}/{conn_name}")
        spec = ((found[0] if found else None) or {}).get("spec") or {}
        if spec.get("type") != "Postgres":
            raise NodusError("NotFound", f'Connection "{conn_name}" (the sink\'s connection) is not a Postgres '
                             f'Connection of project "{project}"')
        pg = spec.get("postgres") or {}
        secret_name = str(pg.get("secret") or "")
        secret = await self.objects.read(f"secrets/{project}/{secret_name}")
        version = int((((secret[0] if secret else None) or {}).get("status") or {}).get("version") or 0)
        if not version:
            raise NodusError("NotFound", f'Secret "{secret_name}" (spec.postgres.secret of Connection "{conn_name}") '
                             f'does not exist in project "{project}"')
        stored = await self.vault.get(project, secret_name, version)
        creds: dict[str, str] = {}
        for k in POSTGRES_KEYS:
            if k not in stored:
                raise NodusError("NotFound", f'Secret "{secret_name}" has no key "{k}" (a Postgres Connection\'s '
                                 f'Secret holds {" and ".join(POSTGRES_KEYS)})')
            try:
                creds[k] = base64.b64decode(stored[k], validate=True).decode()
            except (binascii.Error, ValueError):
                raise NodusError("BadRequest", f'Secret "{secret_name}": the value of "{k}" is not UTF-8 text') from None
        return {"host": pg["host"], "port": int(pg.get("port") or 5432), "dbname": pg["database"],
                "sslmode": pg.get("sslMode") or "prefer", **creds}

    async def _set(self, project: str, name: str, key: tuple[Any, Any, Any], sink_status: dict[str, Any]) -> None:
        def mutate(job: dict[str, Any]) -> dict[str, Any] | None:
            for o in (job.get("status") or {}).get("outputs") or []:
                if (o.get("index"), o.get("name"), o.get("rank")) == key:
                    o["sink"] = sink_status
                    return job
            return None
        await self.objects.mutate(job_key(project, name), mutate)
