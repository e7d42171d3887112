"""`nodus-coordinator store copy` through the real entry point: a coordinator populated on SQLite over
REST is stopped, copied into PostgreSQL, and started on the copy (same data dir, so the vault key in
secret.key is the same): every Job and Secret reads back identical, resourceVersions included, and
the Secret's value decrypts to what was written. A second copy into the now non-empty store is refused.
"""
from __future__ import annotations

import asyncio
import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodus.coordinator.store.postgres import PostgresStore
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key

from conftest import BIN, Coordinator, job
from postgres import PostgresCluster, postgres_cluster  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow

NS = "/apis/nodus.dev/v1/namespaces/default"


def read_all(c: Coordinator) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    s = c.session()
    jobs = s.get(c.url(f"{NS}/jobs"))
    assert jobs.status_code == 200, jobs.text
    secret = s.get(c.url(f"{NS}/secrets/hf"))
    assert secret.status_code == 200, secret.text
    return jobs.json()["items"], secret.json(), int(jobs.json()["metadata"]["resourceVersion"])


def copy(data_dir: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "nodus-coordinator"), "store", "copy", "--from", f"sqlite://{data_dir}",
                           "--to", url], capture_output=True, text=True, timeout=120, check=False)


def heads(data_dir: Path, url: str) -> tuple[int, int]:
    """The store-wide revision of the SQLite source and of the PostgreSQL copy, read from the stores."""
    async def read() -> tuple[int, int]:
        source = await SqliteStore.open(data_dir / "store.db")
        copied = await PostgresStore.open(url)
        try:
            return source.revision, copied.revision
        finally:
            await source.close()
            await copied.close()
    return asyncio.run(read())


def read_secret(url: str, data_dir: Path) -> dict[str, str]:
    async def read() -> dict[str, str]:
        store = await PostgresStore.open(url)
        try:
            versions = (await store.list("_secrets/default/hf/")).records
            assert len(versions) == 1
            vault = Vault(store, load_or_create_key(data_dir / "secret.key"))
            return await vault.get("default", "hf", int(versions[0].key.rsplit("/", 1)[1]))
        finally:
            await store.close()
    return asyncio.run(read())


def test_store_copy_moves_every_object_and_secret_to_postgresql(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_cluster: PostgresCluster) -> None:
    monkeypatch.setenv("NODUS_CONTROLLERS", "off")  # no status writes between the two reads
    with Coordinator(tmp_path / "data").start() as c:
        s = c.session()
        for i in range(5):
            assert s.post(c.url(f"{NS}/jobs"), json=job(f"train-{i}")).status_code == 201
        patched = s.patch(c.url(f"{NS}/jobs/train-1"), json={"metadata": {"labels": {"team": "a"}}},
                          headers={"Content-Type": "application/merge-patch+json"})
        assert patched.status_code == 200, patched.text
        assert s.delete(c.url(f"{NS}/jobs/train-4")).status_code == 200
        secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "hf"},
                  "stringData": {"HF_TOKEN": "hf_s3cr3t"}}
        assert s.post(c.url(f"{NS}/secrets"), json=secret).status_code == 201
        before = read_all(c)
    assert len(before[0]) == 4

    url = postgres_cluster.database()
    done = copy(tmp_path / "data", url)
    assert done.returncode == 0, done.stderr
    assert "copied" in done.stdout

    source_head, copied_head = heads(tmp_path / "data", url)
    assert copied_head == source_head >= before[2]  # the store-wide revision goes on from the source's

    with Coordinator(tmp_path / "data").start(extra_args=("--store-url", url)) as c:
        items, secret, revision = read_all(c)
        assert (items, secret) == before[:2]  # every object and the Secret, resourceVersions included
        # The list's revision is the store's: a coordinator's start writes its replica record (ADR 0098).
        assert revision >= copied_head
        # Writes continue from the copied revision, never reusing one.
        created = c.session().post(c.url(f"{NS}/jobs"), json=job("after-copy"))
        assert created.status_code == 201, created.text
        assert int(created.json()["metadata"]["resourceVersion"]) > before[2]

    # The REST API never shows a Secret's values; the coordinator's own Vault, on the copy and with the
    # data dir's key, decrypts them as it does when it hands them to a Job.
    assert read_secret(url, tmp_path / "data") == {"HF_TOKEN": base64.b64encode(b"hf_s3cr3t").decode()}

    refused = copy(tmp_path / "data", url)
    assert refused.returncode != 0
    assert "not empty" in refused.stderr and "--to" in refused.stderr
