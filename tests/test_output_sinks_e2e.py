"""Output sinks through the daemons, into a real PostgreSQL (a throwaway cluster, tests/postgres.py):
a Job's JSON Lines, CSV and Parquet outputs are loaded into the tables their `sink` names once its
index commits them, Append adding rows and Replace swapping them in one transaction, with
status.outputs[].sink saying Loaded and how many rows; a table that does not exist says Failed and
why, and the Job's own outcome is untouched."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from conftest import Coordinator
from e2e import NS, create, ended, start_agent, wait_job
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
"""


def post(c: Coordinator, plural: str, body: dict[str, Any]) -> None:
    r = c.session().post(c.url(f"{NS}/{plural}"), json={"apiVersion": "nodus.dev/v1", **body})
    assert r.status_code == 201, r.text


def test_outputs_load_into_the_tables_their_sinks_name(coordinator: Coordinator, postgres_cluster: PostgresCluster,
                                                       tmp_path: Path) -> None:
    url = postgres_cluster.database()
    where = urlsplit(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE metrics (step int, loss double precision, tags jsonb)")
        conn.execute("CREATE TABLE results (name text, score numeric)")
        conn.execute("INSERT INTO results VALUES ('old', 0.1)")
        conn.execute("CREATE TABLE rows_seen (id bigint, label text)")
    post(coordinator, "secrets", {"kind": "Secret", "metadata": {"name": "pg"},
                                  "stringData": {"user": where.username or "", "password": "NODUS-TEST-SECRET-unused-with-trust"}})
    post(coordinator, "connections", {"kind": "Connection", "metadata": {"name": "warehouse"}, "spec": {
        "type": "Postgres", "postgres": {"host": where.hostname, "port": where.port, "database": where.path[1:],
                                         "secret": "pg", "sslMode": "disable"}}})
    out = tmp_path / "out"
    out.mkdir()
    sink = {"connection": "warehouse"}
    create(coordinator, "loader", command=[sys.executable, "-c", PROGRAM, str(out)], outputs=[
        {"name": "metrics", "path": f"{out}/metrics.jsonl", "sink": {**sink, "table": "metrics"}},
        {"name": "results", "path": f"{out}/results.csv", "sink": {**sink, "table": "results", "mode": "Replace"}},
        {"name": "rows", "path": f"{out}/rows.parquet", "sink": {**sink, "table": "public.rows_seen"}},
        {"name": "orphan", "path": f"{out}/orphan.jsonl", "sink": {**sink, "table": "no_such_table"}}])
    with start_agent(coordinator, tmp_path / "agent"):
        assert ended(coordinator, "loader")["status"]["phase"] == "Succeeded"

        def settled(j: dict[str, Any]) -> bool:
            outs = j["status"].get("outputs") or []
            return len(outs) == 4 and all((o.get("sink") or {}).get("phase") in ("Loaded", "Failed") for o in outs)
        job = wait_job(coordinator, "loader", settled, what="every sink to settle")
    sinks = {o["name"]: o["sink"] for o in job["status"]["outputs"]}
    assert sinks["metrics"] == {"phase": "Loaded", "rows": 3}
    assert sinks["results"] == {"phase": "Loaded", "rows": 2}
    assert sinks["rows"] == {"phase": "Loaded", "rows": 4}
    assert sinks["orphan"]["phase"] == "Failed" and "no_such_table" in sinks["orphan"]["message"], sinks["orphan"]
    assert job["status"]["phase"] == "Succeeded", "a sink that fails does not change how the Job ended"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT step, loss, tags->>'run' FROM metrics ORDER BY step").fetchall() == [
            (1, 1.0, "a"), (2, 0.5, "a"), (3, 1.0 / 3, "a")]
        assert conn.execute("SELECT name FROM results ORDER BY name").fetchall() == [("new-1",), ("new-2",)], \
            "Replace swapped the old rows for the new ones"
        assert conn.execute("SELECT count(*), min(label) FROM rows_seen").fetchone() == (4, "w")


def test_a_load_runs_once_even_when_asked_again(postgres_cluster: PostgresCluster) -> None:
    """What a coordinator killed after the database committed an Append (and before it wrote Loaded)
    does when it starts again: the same load, asked a second time, adds no row and answers the first's count."""
    from nodus.coordinator.sinks import LOADS_TABLE, load

    url = postgres_cluster.database()
    where = urlsplit(url)
    dsn = {"host": where.hostname, "port": where.port, "dbname": where.path[1:], "user": where.username or "",
           "sslmode": "disable"}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE appended (n int)")
    rows = [(1,), (2,), (3,)]
    assert load(dsn, "appended", "Append", ["n"], iter(rows), "job-uid/0/metrics/0/" + "a" * 64) == 3
    assert load(dsn, "appended", "Append", ["n"], iter(rows), "job-uid/0/metrics/0/" + "a" * 64) == 3
    assert load(dsn, "appended", "Append", ["n"], iter(rows[:1]), "job-uid/0/metrics/0/" + "b" * 64) == 1
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
