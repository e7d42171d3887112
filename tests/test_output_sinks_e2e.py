"""Output sinks through the daemons, into a real PostgreSQL (a throwaway cluster, tests/postgres.py):
a Job's JSON Lines, CSV and Parquet outputs are loaded into the tables their `sink` names once its
index commits them, Append adding rows and Replace swapping them in one transaction, with
status.outputs[].sink saying Loaded and how many rows; a directory output loads every such file in
it; a table that does not exist says Failed and why, and the Job's own outcome is untouched. An Append
whose database commit landed just before a kill -9 of the coordinator is not repeated by the next one."""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg

from conftest import Coordinator
from agent_double import wait_for
from e2e import NS, create, ended, start_agent, wait_job
from nodus.coordinator.sinks import LOADS_TABLE
from postgres import PostgresCluster, postgres_cluster  # noqa: F401 - the session fixture

PROGRAM = r"""
import csv, json, sys
import pyarrow, pyarrow.parquet
out = sys.argv[1]
with open(f"{out}/metrics.jsonl", "w") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "loss": 1.0 / step, "tags": {"run": "a"}}) + "\n")
with open(f"{out}/results.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["name", "score"])
    w.writerows([["new-1", "0.9"], ["new-2", "0.8"]])
pyarrow.parquet.write_table(pyarrow.table({"id": [1, 2, 3, 4], "label": ["w", "x", "y", "z"]}), f"{out}/rows.parquet")
with open(f"{out}/orphan.jsonl", "w") as f:
    f.write(json.dumps({"a": 1}) + "\n")
import os
os.makedirs(f"{out}/shards/part")
for i, shard in enumerate(("shards/b.jsonl", "shards/part/a.jsonl")):
    with open(f"{out}/{shard}", "w") as f:
        f.write(json.dumps({"shard": shard, "n": i}) + "\n" + json.dumps({"shard": shard, "n": i + 10}) + "\n")
with open(f"{out}/shards/c.csv", "w") as f:
    f.write("n,shard\n7,shards/c.csv\n")
with open(f"{out}/shards/README.txt", "w") as f:
    f.write("not rows: skipped\n")
os.makedirs(f"{out}/notes")
with open(f"{out}/notes/notes.txt", "w") as f:
    f.write("no rows here\n")
"""


def post(c: Coordinator, plural: str, body: dict[str, Any]) -> None:
    r = c.session().post(c.url(f"{NS}/{plural}"), json={"apiVersion": "nodus.dev/v1", **body})
    assert r.status_code == 201, r.text


def warehouse(c: Coordinator, url: str) -> None:
    """The Connection `warehouse` to the PostgreSQL database at `url`, with its Secret `pg`."""
    where = urlsplit(url)
    post(c, "secrets", {"kind": "Secret", "metadata": {"name": "pg"},
                        "stringData": {"user": where.username or "", "password": "NODUS-TEST-SECRET-unused-with-trust"}})
    post(c, "connections", {"kind": "Connection", "metadata": {"name": "warehouse"}, "spec": {
        "type": "Postgres", "postgres": {"host": where.hostname, "port": where.port, "database": where.path[1:],
                                         "secret": "pg", "sslMode": "disable"}}})


def test_outputs_load_into_the_tables_their_sinks_name(coordinator: Coordinator, postgres_cluster: PostgresCluster,
                                                       tmp_path: Path) -> None:
    url = postgres_cluster.database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE metrics (step int, loss double precision, tags jsonb)")
        conn.execute("CREATE TABLE results (name text, score numeric)")
        conn.execute("INSERT INTO results VALUES ('old', 0.1)")
        conn.execute("CREATE TABLE rows_seen (id bigint, label text)")
        conn.execute("CREATE TABLE shards (shard text, n int)")
    warehouse(coordinator, url)
    out = tmp_path / "out"
    out.mkdir()
    sink = {"connection": "warehouse"}
    create(coordinator, "loader", command=[sys.executable, "-c", PROGRAM, str(out)], outputs=[
        {"name": "metrics", "path": f"{out}/metrics.jsonl", "sink": {**sink, "table": "metrics"}},
        {"name": "results", "path": f"{out}/results.csv", "sink": {**sink, "table": "results", "mode": "Replace"}},
        {"name": "rows", "path": f"{out}/rows.parquet", "sink": {**sink, "table": "public.rows_seen"}},
        {"name": "orphan", "path": f"{out}/orphan.jsonl", "sink": {**sink, "table": "no_such_table"}},
        {"name": "shards", "path": f"{out}/shards", "sink": {**sink, "table": "shards"}},
        {"name": "notes", "path": f"{out}/notes", "sink": {**sink, "table": "shards"}}])
    with start_agent(coordinator, tmp_path / "agent"):
        assert ended(coordinator, "loader")["status"]["phase"] == "Succeeded"

        def settled(j: dict[str, Any]) -> bool:
            outs = j["status"].get("outputs") or []
            return len(outs) == 6 and all((o.get("sink") or {}).get("phase") in ("Loaded", "Failed") for o in outs)
        job = wait_job(coordinator, "loader", settled, what="every sink to settle")
    sinks = {o["name"]: o["sink"] for o in job["status"]["outputs"]}
    assert sinks["metrics"] == {"phase": "Loaded", "rows": 3}
    assert sinks["results"] == {"phase": "Loaded", "rows": 2}
    assert sinks["rows"] == {"phase": "Loaded", "rows": 4}
    assert sinks["orphan"]["phase"] == "Failed" and "no_such_table" in sinks["orphan"]["message"], sinks["orphan"]
    assert sinks["shards"] == {"phase": "Loaded", "rows": 5}, "every .jsonl and .csv file of the directory"
    assert sinks["notes"]["phase"] == "Failed" and "no .jsonl, .ndjson, .csv or .parquet file" in \
        sinks["notes"]["message"], sinks["notes"]
    assert job["status"]["phase"] == "Succeeded", "a sink that fails does not change how the Job ended"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT step, loss, tags->>'run' FROM metrics ORDER BY step").fetchall() == [
            (1, 1.0, "a"), (2, 0.5, "a"), (3, 1.0 / 3, "a")]
        assert conn.execute("SELECT name FROM results ORDER BY name").fetchall() == [("new-1",), ("new-2",)], \
            "Replace swapped the old rows for the new ones"
        assert conn.execute("SELECT count(*), min(label) FROM rows_seen").fetchone() == (4, "w")
        assert conn.execute("SELECT shard, n FROM shards ORDER BY shard, n").fetchall() == [
            ("shards/b.jsonl", 0), ("shards/b.jsonl", 10), ("shards/c.csv", 7),
            ("shards/part/a.jsonl", 1), ("shards/part/a.jsonl", 11)], "the directory's files, each with its own columns"


def test_a_load_runs_once_even_when_asked_again(postgres_cluster: PostgresCluster) -> None:
    """What a coordinator killed after the database committed an Append (and before it wrote Loaded)
    does when it starts again: the same load, asked a second time, adds no row and answers the first's count."""
    from nodus.coordinator.sinks import load

    url = postgres_cluster.database()
    where = urlsplit(url)
    dsn = {"host": where.hostname, "port": where.port, "dbname": where.path[1:], "user": where.username or "",
           "sslmode": "disable"}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE appended (n int)")
    rows = [(1,), (2,), (3,)]
    assert load(dsn, "appended", "Append", [(["n"], iter(rows))], "job-uid/0/metrics/0/" + "a" * 64) == 3
    assert load(dsn, "appended", "Append", [(["n"], iter(rows))], "job-uid/0/metrics/0/" + "a" * 64) == 3
    assert load(dsn, "appended", "Append", [(["n"], iter(rows[:1]))], "job-uid/0/metrics/0/" + "b" * 64) == 1
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM appended").fetchone() == (4,), "the repeated load added nothing"
        recorded = conn.execute(f"SELECT load_id, rows FROM {LOADS_TABLE} ORDER BY load_id").fetchall()
    assert [r[1] for r in recorded] == [3, 1]


def test_a_committed_sink_output_starts_pending_and_the_loader_owns_it_after() -> None:
    from nodus.coordinator.controllers.job_status import committed_outputs
    from nodus.coordinator.controllers.views import AttemptView

    a = AttemptView.from_object({"metadata": {"name": "j-0-1"}, "spec": {"index": 0}, "status": {
        "phase": "Succeeded", "outputs": [{"name": "m", "sha256": "a" * 64, "size": 1}, {"name": "x", "sha256": "b" * 64}]}})
    outs = committed_outputs([], [a], 1, sinks=frozenset({"m"}))
    assert {o["name"]: o.get("sink") for o in outs} == {"m": {"phase": "Pending"}, "x": None}
    loading = [{**o, "sink": {"phase": "Loading"}} if o["name"] == "m" else o for o in outs]
    assert {o["name"]: o.get("sink") for o in committed_outputs(loading, [a], 1, sinks=frozenset({"m"}))} == {
        "m": {"phase": "Loading"}, "x": None}


def _stored_sink(data_dir: Path, name: str) -> dict[str, Any] | None:
    """status.outputs[0].sink of Job `name` as the coordinator's store holds it (read with the daemon down)."""
    with sqlite3.connect(data_dir / "store.db") as db:
        row = db.execute("SELECT value FROM kv WHERE key = ?", (f"jobs/{NS.rsplit('/', 1)[-1]}/{name}",)).fetchone()
    outputs = (orjson.loads(row[0]).get("status") or {}).get("outputs") or [{}]
    sink: dict[str, Any] | None = outputs[0].get("sink")
    return sink


def _sink_phases(data_dir: Path, name: str) -> list[str]:
    """The phases status.outputs[0].sink of Job `name` went through, oldest first, from the store's history."""
    with sqlite3.connect(data_dir / "store.db") as db:
        rows = db.execute("SELECT value FROM log WHERE key = ? ORDER BY revision", (f"jobs/default/{name}",)).fetchall()
    phases: list[str] = []
    for (value,) in rows:
        outputs = (orjson.loads(value).get("status") or {}).get("outputs") or [{}] if value else [{}]
        phase = (outputs[0].get("sink") or {}).get("phase")
        if phase and phase not in phases[-1:]:
            phases.append(phase)
    return phases


def _loads_recorded(conn: psycopg.Connection[Any]) -> int:
    """The loads PostgreSQL has committed (none while the table that records them is not committed yet)."""
    if conn.execute("SELECT to_regclass(%s)", (LOADS_TABLE,)).fetchone() == (None,):
        return 0
    found = conn.execute(f"SELECT count(*) FROM {LOADS_TABLE}").fetchone()
    return int(found[0]) if found else 0


def test_an_append_committed_before_a_kill_9_is_not_repeated(postgres_cluster: PostgresCluster, tmp_path: Path) -> None:
    """The coordinator is killed (SIGKILL) after PostgreSQL committed its Append and before it could write
    Loaded: the table's lock holds the load until the coordinator's store is locked too, so the Loaded
    write waits, and the kill lands in exactly that gap. The next coordinator finds the sink Loading,
    loads again, and the table keeps one copy of the rows."""
    url = postgres_cluster.database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE appended (n int)")
    c = Coordinator(tmp_path / "data").start()
    held = psycopg.connect(url)  # holds the table so the load waits inside its transaction
    store: sqlite3.Connection | None = None
    try:
        held.execute("LOCK TABLE appended IN ACCESS EXCLUSIVE MODE")
        warehouse(c, url)
        out = tmp_path / "out"
        out.mkdir()
        program = "import sys; open(sys.argv[1], 'w').write(''.join('{\"n\": %d}\\n' % i for i in range(3)))"
        create(c, "append", command=[sys.executable, "-c", program, str(out / "rows.jsonl")], outputs=[
            {"name": "rows", "path": f"{out}/rows.jsonl", "sink": {"connection": "warehouse", "table": "appended"}}])
        with start_agent(c, tmp_path / "agent"):
            wait_job(c, "append", lambda j: ((j["status"].get("outputs") or [{}])[0].get("sink") or {}).get("phase")
                     == "Loading", what="the sink to start loading")
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                                             "'appended'::regclass").fetchone() == (1,), 30,
                     what="the load to wait for the table inside its transaction")
            store = sqlite3.connect(c.data_dir / "store.db", isolation_level=None, timeout=30)
            store.execute("BEGIN IMMEDIATE")  # the coordinator's next write (Loaded) now waits for us
            held.commit()  # the load goes on and commits in PostgreSQL
            wait_for(lambda: _loads_recorded(watcher) == 1, 30, what="the Append to commit in PostgreSQL")
            c.kill()
            store.rollback()
            store.close()
            store = None
            assert watcher.execute("SELECT count(*) FROM appended").fetchone() == (3,)
        assert _stored_sink(c.data_dir, "append") == {"phase": "Loading"}, "the kill landed before Loaded"
        assert _sink_phases(c.data_dir, "append") == ["Pending", "Loading"], "Pending is written when committed"
        c.start()
        job = wait_job(c, "append", lambda j: j["status"]["outputs"][0].get("sink", {}).get("phase") == "Loaded",
                       what="the restarted coordinator to settle the sink")
        assert job["status"]["outputs"][0]["sink"] == {"phase": "Loaded", "rows": 3}
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM appended").fetchone() == (3,), "the Append ran once"
    finally:
        if store is not None:
            store.close()
        held.close()
        c.stop()


def test_a_pass_that_could_not_write_its_outcome_is_retried_by_the_resync(tmp_path: Path) -> None:
    """A finished Job may never change again: when the loader's first write (Loading) is refused, no event
    comes back to mark the Job, and only the loader's resync brings its sink to an outcome (here Failed:
    this loader has no blob store to read the output from)."""
    import asyncio

    from nodus.coordinator.controllers.cache import Cache, job_key
    from nodus.coordinator.controllers.objects import Objects
    from nodus.coordinator.errors import NodusError
    from nodus.coordinator.sinks import SinkLoader
    from nodus.coordinator.store import SqliteStore

    class Refusing(Objects):
        refused = 0

        async def mutate(self, key: str, mutation: Any) -> dict[str, Any] | None:
            if not self.refused:
                self.refused += 1
                raise NodusError("ServiceUnavailable", "the store refused the write (as a busy disk does)")
            return await super().mutate(key, mutation)

    async def go() -> dict[str, Any]:
        store = await SqliteStore.open(tmp_path / "store.db")
        cache = Cache(store)
        await cache.start()
        objects = Refusing(store, cache)
        await objects.create(job_key("default", "j"), {
            "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default", "uid": "u"},
            "spec": {"outputs": [{"name": "rows", "path": "/o/rows.jsonl", "sink": {"connection": "w", "table": "t"}}]},
            "status": {"phase": "Succeeded", "outputs": [{"index": 0, "name": "rows", "sha256": "a" * 64,
                                                          "sink": {"phase": "Pending"}}]}})
        await cache.synced.wait()
        loader = SinkLoader(cache, objects, None, None, resync_seconds=0.05)  # type: ignore[arg-type]
        task = asyncio.create_task(loader.run())
        try:
            for _ in range(600):
                job = cache.get(job_key("default", "j")) or {}
                if job["status"]["outputs"][0]["sink"]["phase"] == "Failed":
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await cache.stop()
            await store.close()
        assert objects.refused == 1
        return job
    job = asyncio.run(go())
    assert job["status"]["outputs"][0]["sink"]["phase"] == "Failed", job["status"]
    assert "no blob store" in job["status"]["outputs"][0]["sink"]["message"]


def test_two_passes_of_one_load_at_once_load_it_once_and_both_say_so(postgres_cluster: PostgresCluster) -> None:
    """An old leader still loading while the new one starts the same load (ADR 0043's handover): both
    wait on the table (held here), then one copies, and the other answers its rows, not a key violation."""
    from concurrent.futures import ThreadPoolExecutor

    from nodus.coordinator.sinks import load

    url = postgres_cluster.database()
    where = urlsplit(url)
    dsn = {"host": where.hostname, "port": where.port, "dbname": where.path[1:], "user": where.username or "",
           "sslmode": "disable"}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE twice (n int)")  # and no table of loads yet: both would create it
    held = psycopg.connect(url)
    try:
        held.execute("LOCK TABLE twice IN ACCESS EXCLUSIVE MODE")
        with ThreadPoolExecutor(2) as pool, psycopg.connect(url, autocommit=True) as watcher:
            passes = [pool.submit(load, dsn, "twice", "Append", [(["n"], iter([(1,), (2,)]))], "same-load")
                      for _ in range(2)]
            wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone() == (2,),
                     30, what="both passes to wait inside their transactions")
            held.commit()
            assert [f.result(timeout=60) for f in passes] == [2, 2]
            assert watcher.execute("SELECT count(*) FROM twice").fetchone() == (2,)
    finally:
        held.close()
