"""The blob store contract, run against both stores: the data dir's (files.py) and an S3-compatible
one (s3.py, s3_logs.py) on moto's server mode started here (ADR 0044). Then what only S3 has:
multipart uploads in bounded parts, nothing visible after a mismatch, a follow served by one replica
of a log another replica writes, and `--blob-url` checked at start."""
from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, TypeVar

import boto3
import pytest

from agent_double import free_port
from motoserver import moto_server
from nodus.coordinator.blobs.base import Blobs
from nodus.coordinator.blobs.open import open_blobs, shared
from nodus.coordinator.blobs.s3 import S3BlobStore
from nodus.coordinator.errors import NodusError

T = TypeVar("T")
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
PART = 64 * 1024
"""Forced part size; moto runs with S3_UPLOAD_PART_MIN_SIZE below it (AWS's minimum is 5 MiB)."""


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def collect(it: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in it])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    name = f"blobs-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


Factory = Callable[[], Awaitable[Blobs]]


@pytest.fixture(params=["file", "s3"])
def replica(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """Makes a store; every call is another replica (or a restart) over the same content."""
    if request.param == "file":
        async def files() -> Blobs:
            return await open_blobs(None, tmp_path)
        return files
    return s3_factory(request.getfixturevalue("moto_endpoint"), request.getfixturevalue("bucket"), tmp_path)


def s3_factory(endpoint: str, bucket: str, tmp_path: Path) -> Factory:
    n = iter(range(1000))

    async def s3() -> Blobs:
        return await open_blobs(f"s3://{bucket}/team/nodus", tmp_path / f"r{next(n)}", endpoint,
                                part_size=PART, log_poll=0.05)
    return s3


def keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents") or [])


# ---- blobs, on both stores ------------------------------------------------------------------------

def test_put_read_stat_ranges_and_local_copy(replica: Factory) -> None:
    data = os.urandom(3 * PART + 17)

    async def go() -> None:
        store = await replica()
        ref, created = await store.put(chunks(data[:1000], data[1000:2 * PART], data[2 * PART:]), sha(data), len(data))
        assert created and ref.sha256 == sha(data) and ref.size == len(data)
        assert await store.stat(ref.sha256) == ref
        assert await collect(store.read(ref.sha256)) == data
        assert await collect(store.read(ref.sha256, len(data) - 5)) == data[-5:]
        assert await collect(store.read(ref.sha256, 10, 20)) == data[10:20]
        assert await collect(store.read(ref.sha256, len(data))) == b""
        pieces = [c async for c in store.read(ref.sha256, chunk=PART)]
        assert max(len(p) for p in pieces) <= PART and b"".join(pieces) == data
        assert await store.head(ref.sha256, 4) == data[:4]
        async with store.local_copy(ref.sha256) as path:
            assert path.read_bytes() == data
        other = await replica()
        assert await other.stat(ref.sha256) == ref and await other.read_all(ref.sha256) == data
        assert await store.stat("0" * 64) is None
        with pytest.raises(NodusError) as info:
            await collect(store.read("0" * 64))
        assert info.value.reason == "NotFound"
        empty = await store.put_bytes(b"")
        assert empty.size == 0 and await store.head(empty.sha256, 4) == b""
        assert await collect(store.read(empty.sha256)) == b""
    run(go())


@pytest.mark.parametrize("size", [6, 2 * PART + 3])
def test_put_without_declared_digest_names_the_content(replica: Factory, size: int) -> None:
    data = os.urandom(size)

    async def go() -> None:
        store = await replica()
        ref, created = await store.put(chunks(data[:3], data[3:]))
        assert created and ref.sha256 == sha(data) and ref.size == size
        again, created_again = await store.put(chunks(data))
        assert again == ref and not created_again, "putting what exists is cheap and succeeds"
        assert await store.read_all(ref.sha256) == data
        assert await store.list_blobs() == [ref]
    run(go())


@pytest.mark.parametrize("declared", [{"sha256": "ab" * 32}, {"size": 5}, {"size": 3 * PART},
                                      {"sha256": "cd" * 32, "big": True}])
def test_mismatch_is_data_loss_and_stores_nothing(replica: Factory, declared: dict[str, Any]) -> None:
    data = os.urandom(2 * PART + 9) if declared.get("big") else b"0123456789"

    async def go() -> None:
        store = await replica()
        with pytest.raises(NodusError) as info:
            await store.put(chunks(data[:PART], data[PART:]), declared.get("sha256", ""), declared.get("size", 0))
        assert info.value.reason == "DigestMismatch" and info.value.code.grpc == "DATA_LOSS"
        assert "nothing was stored" in info.value.message
        assert await store.list_blobs() == []
        assert await store.stat(declared.get("sha256") or sha(data)) is None
    run(go())


def test_concurrent_puts_of_the_same_content(replica: Factory) -> None:
    data = os.urandom(2 * PART + 1)

    async def go() -> None:
        store = await replica()
        results = await asyncio.gather(*(store.put(chunks(data[:4096], data[4096:]), sha(data)) for _ in range(6)))
        assert {ref for ref, _ in results} == {results[0][0]}
        assert sum(created for _, created in results) >= 1
        assert await store.list_blobs() == [results[0][0]] and await store.read_all(sha(data)) == data
    run(go())


def test_retention_seam_lists_and_deletes(replica: Factory) -> None:
    async def go() -> None:
        store = await replica()
        a, b = await store.put_bytes(b"a"), await store.put_bytes(b"b")
        assert {r.sha256 for r in await store.list_blobs()} == {a.sha256, b.sha256}
        assert await store.delete(a.sha256) is True
        assert await store.delete(a.sha256) is False
        assert await store.stat(a.sha256) is None and await store.list_blobs() == [b]
        for bad in ("../../etc/passwd", "xyz", "A" * 65):
            with pytest.raises(NodusError) as info:
                await store.stat(bad)
            assert info.value.reason == "BadRequest"
    run(go())


# ---- logs, on both stores -------------------------------------------------------------------------

def test_log_appends_are_offset_idempotent_and_gaps_answer_the_size(replica: Factory) -> None:
    async def go() -> None:
        logs = (await replica()).logs
        assert (await logs.append("att-1", 0, b"hello ")).size == 6
        assert (await logs.append("att-1", 0, b"hello ")).size == 6, "a resent chunk is written once"
        assert (await logs.append("att-1", 3, b"lo world")).size == 11, "an overlap keeps only the new bytes"
        with pytest.raises(NodusError) as info:
            await logs.append("att-1", 20, b"gap")
        assert info.value.reason == "OffsetMismatch" and info.value.extra == {"size": 11}
        await logs.sync("att-1")
        assert await logs.read("att-1", 0) == b"hello world"
        assert await logs.read("att-1", 6, 3) == b"wor"
        done = await logs.append("att-1", 11, b"!", eof=True)
        assert done.size == 12 and done.eof
        assert (await logs.append("att-1", 0, b"hello", eof=True)).eof, "a resent last chunk is fine"
        with pytest.raises(NodusError) as info:
            await logs.append("att-1", 12, b"more")
        assert info.value.reason == "OffsetMismatch" and info.value.extra == {"size": 12}
        again = (await replica()).logs  # a restart, or another replica
        assert await again.state("att-1") == done and await again.read("att-1", 0) == b"hello world!"
        assert await again.state("att-none") == (await logs.state("att-none")) and not (await logs.state("x")).eof
        assert await logs.list() == ["att-1"]
        assert await again.delete("att-1") is True and await again.delete("att-1") is False
        assert await logs.list() == [] and (await (await replica()).logs.state("att-1")).size == 0
        for bad in ("../etc", "a/b", ""):
            with pytest.raises(NodusError):
                await logs.append(bad, 0, b"x")
    run(go())


def test_follow_waits_for_data_and_ends_at_eof(replica: Factory) -> None:
    async def go() -> bytes:
        logs = (await replica()).logs
        got: list[bytes] = []
        reading = asyncio.Event()

        async def reader() -> None:
            async for data in logs.follow("att-4", 0, poll=30):
                got.append(data)
                reading.set()

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        await logs.append("att-4", 0, b"one\n")
        await asyncio.wait_for(reading.wait(), 10)
        assert not task.done(), "a follower waits for more until eof"
        await logs.append("att-4", 4, b"two\n")
        await logs.append("att-4", 8, b"three\n", eof=True)
        await asyncio.wait_for(task, 10)
        return b"".join(got)

    assert run(go()) == b"one\ntwo\nthree\n"


def test_follow_stops_when_asked_without_eof(replica: Factory) -> None:
    async def go() -> bytes:
        logs = (await replica()).logs
        await logs.append("att-5", 0, b"partial")
        asked = 0

        async def stop() -> bool:
            nonlocal asked
            asked += 1
            return True

        data = b"".join([c async for c in logs.follow("att-5", 0, stop=stop, poll=0.01)])
        assert asked == 1
        return data

    assert run(go()) == b"partial"


# ---- what only S3 has -----------------------------------------------------------------------------

def test_a_replica_follows_a_log_another_replica_writes(moto_endpoint: str, bucket: str, tmp_path: Path) -> None:
    """S3 only (the data dir has one coordinator): the writer's replica never wakes the reader's, which
    sees the bytes by looking again."""
    replica = s3_factory(moto_endpoint, bucket, tmp_path)

    async def go() -> bytes:
        writer, reader = (await replica()).logs, (await replica()).logs
        got: list[bytes] = []
        follower = asyncio.create_task(collect(reader.follow("att-6", 0, poll=30)))
        for i in range(5):
            await writer.append("att-6", i * 5, f"line{i}".encode())
            while (await reader.state("att-6")).size < (i + 1) * 5:
                await asyncio.sleep(0.02)
            got.append(await reader.read("att-6", i * 5, 5))
        await writer.append("att-6", 25, b"", eof=True)
        streamed = await asyncio.wait_for(follower, 20)
        assert b"".join(got) == streamed
        return streamed

    assert run(go()) == b"line0line1line2line3line4"


def test_a_finished_log_is_compacted_into_one_object(client: Any, bucket: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from nodus.coordinator.blobs import s3_logs
    monkeypatch.setattr(s3_logs, "PART", 4096)  # several parts (moto runs with a 1 KiB minimum)
    writer, reader = (S3BlobStore(client, bucket, "c", spool_dir=tmp_path / n) for n in ("w", "r"))
    data = os.urandom(40 * 1000)

    async def go() -> None:
        for i in range(40):
            await writer.logs.append("att", i * 1000, data[i * 1000:(i + 1) * 1000])
        assert await reader.logs.read("att", 0, len(data)) == data  # the reader knows the 40 chunks
        await writer.logs.append("att", len(data), b"", eof=True)
        await writer.logs.settle()
        assert keys(client, bucket, "c/logs/") == ["c/logs/att/eof", "c/logs/att/whole"]
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads") in (None, [])
        assert await reader.logs.read("att", 0, len(data)) == data, "chunks gone: the reader finds the whole"
        cold = S3BlobStore(client, bucket, "c", spool_dir=tmp_path / "c").logs
        assert (await cold.state("att")).size == len(data) and (await cold.state("att")).eof
        assert await cold.read("att", 5, 100) == data[5:105]
        assert b"".join([d async for d in cold.follow("att", 39_000)]) == data[39_000:]
        assert (await cold.append("att", 39_000, data[39_000:], eof=True)).size == len(data), "a resend is fine"
        with pytest.raises(NodusError) as info:
            await cold.append("att", len(data), b"more")
        assert info.value.extra == {"size": len(data)}
        assert await cold.delete("att") is True and keys(client, bucket, "c/logs/") == []

        # A writer that stopped between its eof and the compaction: the eof resent elsewhere compacts.
        await writer.logs.append("att-2", 0, b"abc")
        await writer.logs.append("att-2", 3, b"def")
        client.put_object(Bucket=bucket, Key="c/logs/att-2/eof", Body=b"")
        other = S3BlobStore(client, bucket, "c", spool_dir=tmp_path / "o").logs
        assert (await other.append("att-2", 0, b"abcdef", eof=True)).size == 6
        await other.settle()
        assert keys(client, bucket, "c/logs/att-2/") == ["c/logs/att-2/eof", "c/logs/att-2/whole"]
        assert await cold.read("att-2", 0) == b"abcdef"
    run(go())


class ListsAfterEachChunk:
    """The real client; after each log chunk's PUT, before the writer's thread goes on, a follower of the
    same store looks at the log (its LIST finds the new chunk first)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.follower: Callable[[], object] = lambda: None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name == "put_object":
            def call(**kw: Any) -> Any:
                answer = attr(**kw)
                if kw["Key"].rsplit("/", 1)[-1].isdigit():
                    self.follower()
                return answer
            return call
        return attr


def test_a_follower_looking_between_a_chunks_put_and_its_record_loses_nothing(
        client: Any, bucket: str, tmp_path: Path) -> None:
    """A follower's LIST that lands between a chunk's PUT and the writer recording it used to leave a
    phantom chunk in the index: the next append then wrote only a tail, the compaction failed on the
    missing key and a follower's log lost its end."""
    racy = ListsAfterEachChunk(client)
    logs = S3BlobStore(racy, bucket, "c", spool_dir=tmp_path / "w").logs

    async def go() -> None:
        loop = asyncio.get_running_loop()
        racy.follower = lambda: asyncio.run_coroutine_threadsafe(logs.state("att"), loop).result(10)
        got: list[bytes] = []

        async def follow() -> None:
            async for data in logs.follow("att", 0, poll=30):
                got.append(data)
        task = asyncio.create_task(follow())
        assert (await logs.append("att", 0, b"one\n")).size == 4
        assert (await logs.append("att", 4, b"two\n")).size == 8
        assert (await logs.append("att", 8, b"three\n", eof=True)).size == 14
        await asyncio.wait_for(task, 10)
        await logs.settle()
        assert b"".join(got) == b"one\ntwo\nthree\n"
        assert keys(client, bucket, "c/logs/") == ["c/logs/att/eof", "c/logs/att/whole"], "compacted"
        cold = S3BlobStore(client, bucket, "c", spool_dir=tmp_path / "c").logs
        assert await cold.read("att", 0) == b"one\ntwo\nthree\n"
    run(go())


class Watch:
    """The real client, with the body of every upload call measured."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.bodies: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name in ("put_object", "upload_part"):
            def call(**kw: Any) -> Any:
                self.bodies.append((name, len(kw.get("Body") or b"")))
                return attr(**kw)
            return call
        return attr


def test_s3_layout_multipart_in_bounded_parts_and_no_leftovers(client: Any, bucket: str, tmp_path: Path) -> None:
    watch = Watch(client)
    store = S3BlobStore(watch, bucket, "p", spool_dir=tmp_path, part_size=PART)
    data = os.urandom(5 * PART + 1)

    async def go() -> None:
        ref, _ = await store.put(chunks(*(data[i:i + 10_000] for i in range(0, len(data), 10_000))), sha(data))
        assert keys(client, bucket) == [f"p/blobs/sha256/{ref.sha256[:2]}/{ref.sha256[2:]}"]
        assert [n for n, _ in watch.bodies] == ["upload_part"] * 6, "a large blob goes up as a multipart upload"
        assert max(size for _, size in watch.bodies) <= PART, "never more than a part in memory"
        watch.bodies.clear()
        undeclared, _ = await store.put(chunks(data[:3 * PART]))
        assert max(size for _, size in watch.bodies) <= PART
        assert keys(client, bucket, "p/blobs/tmp/") == [], "the temp key is gone once copied"
        assert await store.read_all(undeclared.sha256) == data[:3 * PART]
        watch.bodies.clear()
        again, created = await store.put(chunks(data), sha(data), len(data))
        assert not created and watch.bodies == [], "content already stored is not sent again"
        with pytest.raises(NodusError):
            await store.put(chunks(data, b"x"), sha(data))
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads") in (None, []), "a mismatch aborts"
        await store.logs.append("att-9", 0, b"abc")
        await store.logs.append("att-9", 3, b"def")
        assert keys(client, bucket, "p/logs/") == ["p/logs/att-9/00000000000000000000",
                                                   "p/logs/att-9/00000000000000000003"]
    run(go())


def test_blob_url_is_checked_at_start(moto_endpoint: str, bucket: str, tmp_path: Path) -> None:
    async def fails(url: str, endpoint: str | None = moto_endpoint) -> NodusError:
        with pytest.raises(NodusError) as info:
            await open_blobs(url, tmp_path, endpoint)
        assert "--blob-url" in info.value.message, info.value.message
        return info.value

    async def go() -> None:
        for url in ("s3://", "s3://Bad_Bucket", "gs://bucket", "file://relative", "s3://b/x/../y"):
            assert (await fails(url)).reason == "BadRequest"
        missing = await fails("s3://no-such-bucket-here")
        assert missing.reason == "ServiceUnavailable" and "does not exist" in missing.message
        assert "aws s3 mb" in (missing.fix or "")
        gone = await fails(f"s3://{bucket}", f"http://127.0.0.1:{free_port()}")
        assert "did not answer" in gone.message and "--blob-endpoint" in (gone.fix or "")
        assert isinstance(await open_blobs(f"s3://{bucket}/x", tmp_path, moto_endpoint), S3BlobStore)
        assert not isinstance(await open_blobs("file://", tmp_path), S3BlobStore)
        elsewhere = await open_blobs(f"file://{tmp_path}/elsewhere", tmp_path)
        ref = await elsewhere.put_bytes(b"kept elsewhere")
        assert (tmp_path / "elsewhere" / "blobs" / "sha256" / ref.sha256[:2] / ref.sha256[2:]).read_bytes() \
            == b"kept elsewhere"
        assert shared(f"s3://{bucket}/x") and not shared("file://") and not shared(None)
    run(go())


def test_the_bench_reports_each_figure_beside_its_boto3_anchor() -> None:
    """bench/blobs_s3.py --tiny, so that it does not rot (its figures are shape only)."""
    import subprocess
    import sys
    bench = Path(__file__).resolve().parent.parent / "bench" / "blobs_s3.py"
    done = subprocess.run([sys.executable, str(bench), "--tiny"], capture_output=True, text=True, timeout=240,
                          cwd=bench.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    for figure, anchor in (("blob put", "anchor upload_fileobj"), ("blob read", "anchor get_object"),
                           ("log append", "anchor put_object"), ("log read running", "anchor one object"),
                           ("log read finished", "anchor one object")):
        line = next((x for x in done.stdout.splitlines() if x.startswith(figure)), "")
        assert anchor in line and "ratio" in line, done.stdout


def test_credentials_the_store_refuses_stop_the_start(tmp_path: Path) -> None:
    """moto with its IAM checks on (INITIAL_NO_AUTH_ACTION_COUNT=0) knows no key, so it refuses ours."""
    with moto_server(tmp_path, {**AWS_ENV, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        with pytest.raises(NodusError) as info:
            run(open_blobs("s3://some-bucket/p", tmp_path, endpoint))
    assert info.value.reason == "ServiceUnavailable"
    assert info.value.message.startswith("--blob-url s3://some-bucket/p/: access denied"), info.value.message
    assert "AWS_ACCESS_KEY_ID" in (info.value.fix or "") and "s3:PutObject" in (info.value.fix or "")
