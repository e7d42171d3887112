"""The S3 store for real, against moto's server mode started here: multipart with parallel parts,
listing, latest, retention, deletion, garbage, abort on failure; and the CLI against it."""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from nodus.checkpoint import ArchiveTooLarge, DigestMismatch, StoreError
from nodus.checkpoint.archive import CHUNK
from nodus.checkpoint.stores.s3 import S3Store
from motoserver import moto_server
from test_checkpoint_cli import NODUS

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
PART = 64 * 1024
"""Forced part size for tests; moto is started with S3_UPLOAD_PART_MIN_SIZE below it (AWS's is 5 MiB)."""


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto"), {**AWS_ENV, "S3_UPLOAD_PART_MIN_SIZE": "1024"}) as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def client(moto_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def bucket(client: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


class Spy:
    """The real client, with upload_part watched (and optionally failing on one part)."""

    def __init__(self, real: Any, fail_part: int | None = None) -> None:
        self.real = real
        self.fail_part = fail_part
        self.parts: list[int] = []
        self.threads: set[int] = set()
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    def upload_part(self, **kw: Any) -> Any:
        with self.lock:
            self.parts.append(kw["PartNumber"])
            self.threads.add(threading.get_ident())
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            time.sleep(0.02)  # long enough that parallel parts overlap
            if kw["PartNumber"] == self.fail_part:
                raise ConnectionError("injected failure uploading one part")
            return self.real.upload_part(**kw)
        finally:
            with self.lock:
                self.inflight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _state(base: Path, size: int = 1 << 20, name: str = "state") -> Path:
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "blob").write_bytes(os.urandom(size))
    (d / "note.txt").write_text("hello " * 1000)
    return d


def _keys(client: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _no_incomplete_uploads(client: Any, bucket: str) -> bool:
    return not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_multipart_with_parallel_parts_round_trips(tmp_path: Path, client: Any, bucket: str) -> None:
    spy = Spy(client)
    store = S3Store(bucket, "jobs/train/0", client=spy, part_size=PART, max_workers=4)
    state = _state(tmp_path, 1536 * 1024)
    m = store.save(["state"], root=tmp_path, attempt="train-0-a1", epoch=1)
    assert len(spy.parts) >= 20 and sorted(spy.parts) == list(range(1, len(spy.parts) + 1))
    assert spy.max_inflight > 1 and len(spy.threads) > 1, "parts were not uploaded in parallel"
    assert _no_incomplete_uploads(client, bucket)
    assert sorted(_keys(client, bucket)) == [f"jobs/train/0/{m.archive}", "jobs/train/0/0000000001.manifest.json"]
    store.restore(tmp_path / "out")
    assert (tmp_path / "out" / "state" / "blob").read_bytes() == (state / "blob").read_bytes()
    assert store.verify()[1].sha256 == m.sha256


def test_small_archive_is_one_put(tmp_path: Path, client: Any, bucket: str) -> None:
    spy = Spy(client)
    store = S3Store(bucket, "p", client=spy)
    m = store.save([_state(tmp_path, 1000)])
    assert spy.parts == [] and store.latest() == m


def test_list_latest_delete_and_seq(tmp_path: Path, client: Any, bucket: str) -> None:
    store = S3Store(bucket, "a/b", client=client, part_size=PART)
    other = S3Store(bucket, "a/bc", client=client)  # a sibling prefix is another store
    other.save([_state(tmp_path, 10, "x")], root=tmp_path)
    for i in range(3):
        (_state(tmp_path, 100_000) / "i").write_text(str(i))
        store.save(["state"], root=tmp_path)
    assert [m.seq for m in store.list()] == [1, 2, 3] and store.latest().seq == 3
    store.restore(tmp_path / "r1", seq=1)
    assert (tmp_path / "r1" / "state" / "i").read_text() == "0"
    archive2 = store.get(2).archive
    store.delete(2)
    assert [m.seq for m in store.list()] == [1, 3]
    assert f"a/b/{archive2}" not in _keys(client, bucket)
    assert [m.seq for m in other.list()] == [1]


def test_retention(tmp_path: Path, client: Any, bucket: str) -> None:
    now = [datetime(2026, 3, 1, tzinfo=timezone.utc)]
    store = S3Store(bucket, "r", client=client, clock=lambda: now[0])
    for _ in range(3):
        store.save([_state(tmp_path, 1000)])
        now[0] += timedelta(hours=1)
    assert store.prune(older_than=timedelta(minutes=90)) == [1, 2]
    finished = now[0]
    now[0] = finished + timedelta(hours=168)
    assert store.expire(finished_at=finished, retain_after_finish=timedelta(hours=168)) == [3]
    assert _keys(client, bucket) == []


def test_a_failed_part_aborts_the_upload(tmp_path: Path, client: Any, bucket: str) -> None:
    spy = Spy(client, fail_part=3)
    store = S3Store(bucket, "f", client=spy, part_size=PART, max_workers=4)
    with pytest.raises(StoreError, match="injected failure"):
        store.save([_state(tmp_path, 1 << 20)])
    assert _no_incomplete_uploads(client, bucket)
    assert _keys(client, bucket) == [] and store.latest() is None


def test_max_size_stops_the_upload_before_it_completes(tmp_path: Path, client: Any, bucket: str) -> None:
    store = S3Store(bucket, "m", client=client, part_size=PART)
    with pytest.raises(ArchiveTooLarge, match="nothing was committed") as e:
        store.save([_state(tmp_path, 12 << 20)], max_size=1 << 20)
    passed = int(re.search(r"after (\d+) compressed bytes", str(e.value)).group(1))  # type: ignore[union-attr]
    assert (1 << 20) < passed <= (1 << 20) + CHUNK  # stopped at the first chunk past the limit, not at the end
    assert _no_incomplete_uploads(client, bucket) and _keys(client, bucket) == []


def test_replaced_archive_is_refused(tmp_path: Path, client: Any, bucket: str) -> None:
    store = S3Store(bucket, "d", client=client)
    m = store.save([_state(tmp_path, 5000)])
    client.put_object(Bucket=bucket, Key=f"d/{m.archive}", Body=b"x" * m.size)
    into = tmp_path / "into"
    into.mkdir()
    (into / "sentinel").write_text("s")
    with pytest.raises(DigestMismatch, match="nothing was extracted"):
        store.restore(into)
    assert sorted(p.name for p in into.iterdir()) == ["sentinel"]


def test_garbage_collection_aborts_stale_uploads(tmp_path: Path, client: Any, bucket: str) -> None:
    now = [datetime.now(timezone.utc)]
    store = S3Store(bucket, "g", client=client, clock=lambda: now[0])
    m = store.save([_state(tmp_path, 1000)])
    client.create_multipart_upload(Bucket=bucket, Key="g/0000000002-aaaaaaaaaaaa.tar.zst")
    client.put_object(Bucket=bucket, Key="g/0000000003-bbbbbbbbbbbb.tar.zst", Body=b"orphan")
    assert store.collect_garbage(grace=timedelta(hours=1)) == []
    now[0] += timedelta(hours=2)
    assert store.collect_garbage(grace=timedelta(hours=1)) == ["0000000003-bbbbbbbbbbbb.tar.zst"]
    assert _no_incomplete_uploads(client, bucket)
    assert sorted(_keys(client, bucket)) == [f"g/{m.archive}", "g/0000000001.manifest.json"]


def test_purge_empties_an_owners_store_and_finishes_an_interrupted_one(tmp_path: Path, client: Any,
                                                                        bucket: str) -> None:
    store = S3Store(bucket, "p", client=client)
    m1, m2 = store.save([_state(tmp_path, 1000)]), store.save([_state(tmp_path, 1000)])
    client.create_multipart_upload(Bucket=bucket, Key="p/0000000003-cccccccccccc.tar.zst")  # a torn save
    client.put_object(Bucket=bucket, Key="q/0000000001.manifest.json", Body=b"{}")  # another owner's
    client.delete_object(Bucket=bucket, Key="p/0000000001.manifest.json")  # a purge stopped half-way
    assert store.purge() == [2]
    assert _keys(client, bucket) == ["q/0000000001.manifest.json"] and _no_incomplete_uploads(client, bucket)
    assert store.purge() == [] and store.latest() is None
    assert m1.archive != m2.archive


def test_refused_keys_are_not_worth_retrying(tmp_path: Path, client: Any) -> None:
    store = S3Store(f"missing-{uuid.uuid4().hex[:8]}", "x", client=client)
    with pytest.raises(StoreError, match="NoSuchBucket") as e:
        store.save([_state(tmp_path, 1000)])
    assert e.value.retryable is False
    assert StoreError("a timeout").retryable, "anything else may pass later"


# -- the CLI against S3 ---------------------------------------------------------------------------

def test_cli_against_s3(tmp_path: Path, moto_endpoint: str, bucket: str) -> None:
    nodus = NODUS
    env = {**os.environ, **AWS_ENV, "AWS_ENDPOINT_URL": moto_endpoint}

    def run(*args: str, ok: bool = True, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*nodus, *args], capture_output=True, text=True, env={**env, **(extra_env or {})},
                           cwd=tmp_path)
        assert (r.returncode == 0) == ok, r.stdout + r.stderr
        return r

    _state(tmp_path, 300_000)
    url = f"s3://{bucket}/cli/run1"
    assert "checkpoint 1" in run("save", "state", "--out", url).stdout
    assert "checkpoint 2" in run("save", "state", "--out", url, "--attempt", "a7").stdout
    table = run("ls", url).stdout.splitlines()
    assert table[0].split() == ["SEQ", "TIME", "SIZE", "FILES", "SHA256", "ATTEMPT"]
    assert [r.split()[0] for r in table[1:]] == ["1", "2"] and table[2].split()[-1] == "a7"
    assert "ok" in run("verify", url).stdout
    out = run("restore", url, "--into", "back", "--seq", "1").stdout
    assert "checkpoint 1" in out and "sha256 verified" in out
    assert (tmp_path / "back" / "state" / "blob").read_bytes() == (tmp_path / "state" / "blob").read_bytes()
    # --endpoint-url works without the variable
    no_var = {**env}
    no_var.pop("AWS_ENDPOINT_URL")
    r = subprocess.run([*nodus, "ls", url, "--endpoint-url", moto_endpoint], capture_output=True, text=True,
                       env=no_var, cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stderr
    r = run("save", "state", "--out", url, "--max-size", "10Ki", ok=False)
    assert "maxSize" in r.stderr and "fix: raise --max-size" in r.stderr
    r = run("restore", f"s3://{bucket}/cli/empty", "--into", "x", ok=False)
    assert "no committed checkpoint" in r.stderr
