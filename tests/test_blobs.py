"""The blob store: content-addressed blobs and append-only logs, as a unit and as BlobService over gRPC."""
from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Iterator, TypeVar

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import Coordinator
from e2e import agent_md
from nodus.coordinator.blobs import BlobStore
from nodus.coordinator.blobs.base import Append, LogState, plan_append
from nodus.coordinator.errors import NodusError
from nodus.v1 import blob_pb2, blob_pb2_grpc

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# ---- blobs -----------------------------------------------------------------------------------------

def test_put_get_stat_and_layout(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(3 * (1 << 20) + 17)

    async def go() -> tuple[Any, bool, bytes, Any]:
        ref, created = await store.put(chunks(data[:1000], data[1000:]), sha(data), len(data))
        got = b"".join([c async for c in store.read(ref.sha256)])
        return ref, created, got, await store.stat(ref.sha256)

    ref, created, got, stat = run(go())
    assert created and ref.sha256 == sha(data) and ref.size == len(data)
    assert ref.uri == f"blob://sha256/{sha(data)}"
    assert got == data and stat == ref
    assert store.path(ref.sha256) == tmp_path / "blobs" / "sha256" / ref.sha256[:2] / ref.sha256[2:]
    assert list((tmp_path / "blobs" / "tmp").iterdir()) == [], "no temp file is left behind"
    assert run(store.stat("0" * 64)) is None
    tail = run(_collect(store.read(ref.sha256, len(data) - 5)))
    assert tail == data[-5:]


async def _collect(it: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in it])


def test_put_without_declared_digest_names_the_content(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref, created = run(store.put(chunks(b"abc", b"def")))
    assert created and ref.sha256 == sha(b"abcdef") and ref.size == 6
    again, created_again = run(store.put(chunks(b"abcdef")))
    assert again == ref and not created_again, "putting what exists is cheap and succeeds"


@pytest.mark.parametrize("declared", [{"sha256": "ab" * 32}, {"size": 5}, {"size": 100}])
def test_mismatch_is_data_loss_and_stores_nothing(tmp_path: Path, declared: dict[str, Any]) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(NodusError) as info:
        run(store.put(chunks(b"0123456789"), declared.get("sha256", ""), declared.get("size", 0)))
    assert info.value.reason == "DigestMismatch" and info.value.code.grpc == "DATA_LOSS"
    assert "nothing was stored" in info.value.message
    assert files_under(tmp_path / "blobs") == []


def test_concurrent_puts_of_the_same_content(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(2 << 20)

    async def go() -> list[Any]:
        return await asyncio.gather(*(store.put(chunks(data[:4096], data[4096:]), sha(data)) for _ in range(8)))

    results = run(go())
    assert {ref for ref, _ in results} == {results[0][0]}
    assert sum(created for _, created in results) >= 1
    assert files_under(tmp_path / "blobs") == [store.path(sha(data))]
    assert store.path(sha(data)).read_bytes() == data


def test_gc_seam_lists_and_deletes(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    a, b = run(store.put_bytes(b"a")), run(store.put_bytes(b"b"))
    assert {r.sha256 for r in run(store.list_blobs())} == {a.sha256, b.sha256}
    assert run(store.delete(a.sha256)) is True
    assert run(store.delete(a.sha256)) is False
    assert run(store.stat(a.sha256)) is None and run(store.list_blobs()) == [b]


def test_bad_digests_are_refused(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    for bad in ("../../etc/passwd", "xyz", "A" * 65):
        with pytest.raises(NodusError) as info:
            run(store.stat(bad))
        assert info.value.reason == "BadRequest"


def test_stale_temp_files_are_swept_at_start(tmp_path: Path) -> None:
    BlobStore(tmp_path)
    stale = tmp_path / "blobs" / "tmp" / "put-crashed"
    stale.write_bytes(b"half")
    BlobStore(tmp_path)
    assert not stale.exists()


# ---- logs ------------------------------------------------------------------------------------------

def test_log_appends_are_offset_idempotent(tmp_path: Path) -> None:
    logs = BlobStore(tmp_path).logs

    async def go() -> None:
        assert (await logs.append("att-1", 0, b"hello ")).size == 6
        assert (await logs.append("att-1", 0, b"hello ")).size == 6, "a resent chunk is not written twice"
        assert (await logs.append("att-1", 3, b"lo world")).size == 11, "an overlapping chunk adds its new tail"
        assert (await logs.append("att-1", 11, b"!", eof=True)).size == 12
        assert (await logs.append("att-1", 11, b"!", eof=True)).size == 12, "the last chunk may be resent"
        state = await logs.state("att-1")
        assert state.size == 12 and state.eof

    run(go())
    assert (tmp_path / "logs" / "att-1.log").read_bytes() == b"hello world!"
    assert (tmp_path / "logs" / "att-1.eof").exists()


def test_append_log_syncs_only_the_logs_that_did_not_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The append that ends a log made it durable (ADR 0094): AppendLog's own sync at the stream's end is
    for the logs that go on, and an attempt's whole log in one chunk with eof costs one fsync'd write."""
    from types import SimpleNamespace

    from nodus.coordinator.blob_api import BlobServicer
    from nodus.coordinator.blobs.files import LogStore

    blobs = BlobStore(tmp_path)
    synced: list[str] = []
    real_sync = LogStore.sync

    async def counting(self: LogStore, attempt_id: str) -> None:
        synced.append(attempt_id)
        await real_sync(self, attempt_id)
    monkeypatch.setattr(LogStore, "sync", counting)

    async def peer(context: Any) -> Any:
        return SimpleNamespace(node="node-a")

    class Context:
        async def send_initial_metadata(self, md: Any) -> None:
            pass

    servicer = BlobServicer(blobs, None, node_peer=peer)  # type: ignore[arg-type]

    async def stream(*chunks: Any) -> AsyncIterator[Any]:
        for chunk in chunks:
            yield chunk

    async def go() -> None:
        ack = await servicer.AppendLog(stream(blob_pb2.LogChunk(attempt_id="ended", offset=0, data=b"all\n", eof=True),
                                              blob_pb2.LogChunk(attempt_id="going", offset=0, data=b"more\n")),
                                       Context())  # type: ignore[arg-type]
        assert ack.size == 5
    run(go())
    assert synced == ["going"]
    assert (tmp_path / "logs" / "ended.log").read_bytes() == b"all\n" and (tmp_path / "logs" / "ended.eof").exists()


def test_log_gap_is_failed_precondition_with_the_size(tmp_path: Path) -> None:
    logs = BlobStore(tmp_path).logs
    run(logs.append("att-2", 0, b"abc"))
    with pytest.raises(NodusError) as info:
        run(logs.append("att-2", 10, b"xyz"))
    assert info.value.reason == "OffsetMismatch" and info.value.code.grpc == "FAILED_PRECONDITION"
    assert info.value.extra["size"] == 3
    run(logs.append("att-2", 0, b"", eof=True))
    with pytest.raises(NodusError) as closed:
        run(logs.append("att-2", 3, b"more"))
    assert closed.value.reason == "OffsetMismatch" and closed.value.extra["size"] == 3


def test_a_log_that_ends_empty_reads_as_ended_and_is_listed_and_deleted(tmp_path: Path) -> None:
    """ADR 0112: an empty log that ends is stored as its eof mark alone (a trivial index's log); it reads,
    follows and is collected like any other."""
    logs = BlobStore(tmp_path).logs
    state = run(logs.append("att-empty", 0, b"", eof=True))
    assert state.size == 0 and state.eof
    assert not (tmp_path / "logs" / "att-empty.log").exists()
    fresh = BlobStore(tmp_path).logs  # a restarted coordinator reads it from the disk
    assert run(fresh.state("att-empty")).eof and run(fresh.read("att-empty", 0)) == b""
    assert run(fresh.wait("att-empty", 0, 5)).eof
    with pytest.raises(NodusError):
        run(fresh.append("att-empty", 0, b"late"))
    assert run(fresh.list()) == ["att-empty"]
    assert run(fresh.delete("att-empty")) and run(fresh.list()) == []


def test_plan_append_is_the_offset_rules_every_log_engine_applies() -> None:
    """blobs.base.plan_append, which the file and S3 log stores both call (each engine's tests cover it
    end to end): what of a chunk is new, whether it ends the log, and the refusals with the stored size."""
    going, ended = LogState(5, False), LogState(5, True)
    assert plan_append("a", going, 0, b"12345", False) == Append(b"", False), "a resent chunk writes nothing"
    assert plan_append("a", going, 3, b"45678", False) == Append(b"678", False), "an overlap writes its tail"
    assert plan_append("a", going, 5, b"", True) == Append(b"", True), "eof alone ends the log"
    assert plan_append("a", ended, 5, b"", True) == Append(b"", False), "a resent eof ends nothing again"
    assert plan_append("a", ended, 2, b"345", True) == Append(b"", False), "an ended log's last chunk may be resent"
    for stored, offset, data in ((going, 6, b"x"), (ended, 5, b"x"), (ended, 4, b"5x")):
        with pytest.raises(NodusError) as info:
            plan_append("a", stored, offset, data, False)
        assert info.value.reason == "OffsetMismatch" and info.value.extra == {"size": 5}
    with pytest.raises(NodusError) as negative:
        plan_append("a", going, -1, b"x", False)
    assert negative.value.reason == "BadRequest" and "offset -1 is negative" in str(negative.value)


def test_log_state_survives_a_restart(tmp_path: Path) -> None:
    run(BlobStore(tmp_path).logs.append("att-3", 0, b"12345"))
    logs = BlobStore(tmp_path).logs
    with pytest.raises(NodusError):
        run(logs.append("att-3", 6, b"x"))
    assert run(logs.append("att-3", 5, b"6", eof=True)).size == 6
    assert run(BlobStore(tmp_path).logs.state("att-3")).eof


def test_log_ids_cannot_leave_the_directory(tmp_path: Path) -> None:
    logs = BlobStore(tmp_path).logs
    for bad in ("../x", "a/b", "", ".hidden", "a..b"):
        with pytest.raises(NodusError):
            run(logs.append(bad, 0, b"x"))


def test_follow_waits_for_data_and_ends_at_eof(tmp_path: Path) -> None:
    logs = BlobStore(tmp_path).logs

    async def go() -> bytes:
        got: list[bytes] = []
        reading = asyncio.Event()

        async def reader() -> None:
            async for data in logs.follow("att-4", 0, poll=30):
                got.append(data)
                reading.set()

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        await logs.append("att-4", 0, b"one\n")
        await asyncio.wait_for(reading.wait(), 5)
        assert not task.done(), "a follower waits for more until eof"
        await logs.append("att-4", 4, b"two\n")
        await logs.append("att-4", 8, b"three\n", eof=True)
        await asyncio.wait_for(task, 5)  # ends at eof without waiting for a poll
        return b"".join(got)

    assert run(go()) == b"one\ntwo\nthree\n"


def test_follow_stops_when_asked_without_eof(tmp_path: Path) -> None:
    logs = BlobStore(tmp_path).logs

    async def go() -> bytes:
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


# ---- BlobService over gRPC -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """A --grpc-insecure coordinator, where nodes hold no certificates and the join token is every node's
    credential: these tests drive the protocol itself. On a TLS coordinator a node reaches only its own
    attempts' blobs and logs (tests/test_node_scope_e2e.py, docs/adr/0045)."""
    with Coordinator(tmp_path_factory.mktemp("coord") / "data").start(extra_args=("--grpc-insecure",)) as plain:
        yield plain


@pytest.fixture(scope="module")
def stub(c: Coordinator) -> Iterator[blob_pb2_grpc.BlobServiceStub]:
    with c.channel() as channel:
        yield blob_pb2_grpc.BlobServiceStub(channel)


def put_requests(data: bytes, sha256: str = "", size: int = 0, chunk: int = 1 << 20) -> Iterator[Any]:
    yield blob_pb2.PutRequest(header=blob_pb2.PutHeader(sha256=sha256, size=size, media_type="application/zstd"))
    for i in range(0, len(data), chunk):
        yield blob_pb2.PutRequest(data=data[i:i + chunk])


def error_info(e: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo")


def test_grpc_put_stat_get(c: Coordinator, stub: Any) -> None:
    data = os.urandom((5 << 20) // 2)
    ref = stub.Put(put_requests(data, sha(data), len(data)), metadata=agent_md(c))
    assert ref.sha256 == sha(data) and ref.size == len(data) and ref.uri == f"blob://sha256/{sha(data)}"
    assert stub.Stat(blob_pb2.StatBlobRequest(sha256=ref.sha256), metadata=agent_md(c)) == ref
    got = b"".join(ch.data for ch in stub.Get(blob_pb2.GetBlobRequest(sha256=ref.sha256), metadata=agent_md(c)))
    assert got == data
    tail = b"".join(ch.data for ch in stub.Get(blob_pb2.GetBlobRequest(sha256=ref.sha256, offset=len(data) - 10),
                                                   metadata=agent_md(c)))
    assert tail == data[-10:]
    blob = c.data_dir / "blobs" / "sha256" / ref.sha256[:2] / ref.sha256[2:]
    assert blob.read_bytes() == data
    again = stub.Put(put_requests(data), metadata=agent_md(c))
    assert again == ref


def test_grpc_mismatch_is_data_loss(c: Coordinator, stub: Any) -> None:
    data = b"what the agent uploaded"
    with pytest.raises(grpc.RpcError) as info:
        stub.Put(put_requests(data, sha(b"something else"), len(data)), metadata=agent_md(c))
    assert info.value.code() == grpc.StatusCode.DATA_LOSS
    assert error_info(info.value).reason == "DigestMismatch"
    with pytest.raises(grpc.RpcError) as missing:
        stub.Stat(blob_pb2.StatBlobRequest(sha256=sha(data)), metadata=agent_md(c))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND, "nothing was stored"


def test_grpc_put_needs_the_header_first(c: Coordinator, stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Put(iter([blob_pb2.PutRequest(data=b"x")]), metadata=agent_md(c))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_get_missing_blob(c: Coordinator, stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Get(blob_pb2.GetBlobRequest(sha256="f" * 64), metadata=agent_md(c)))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_refuses_customers_and_strangers(c: Coordinator, stub: Any) -> None:
    request = blob_pb2.StatBlobRequest(sha256="0" * 64)
    with pytest.raises(grpc.RpcError) as customer:
        stub.Stat(request, metadata=(("authorization", f"Bearer {c.token}"),))
    assert customer.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "REST" in error_info(customer.value).metadata["fix"]
    with pytest.raises(grpc.RpcError) as nobody:
        stub.Stat(request)
    assert nobody.value.code() == grpc.StatusCode.UNAUTHENTICATED
    forged = "Bearer nodusjoin_000000000000_" + "x" * 43
    with pytest.raises(grpc.RpcError) as fake:
        list(stub.Get(blob_pb2.GetBlobRequest(sha256="0" * 64), metadata=(("authorization", forged),)))
    assert fake.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_grpc_append_log_idempotent_and_gap(c: Coordinator, stub: Any) -> None:
    md = agent_md(c)

    def chunk(offset: int, data: bytes, eof: bool = False) -> Any:
        return blob_pb2.LogChunk(attempt_id="grpc-att-1", offset=offset, data=data, eof=eof)

    ack = stub.AppendLog(iter([chunk(0, b"line 1\n"), chunk(7, b"line 2\n")]), metadata=md)
    assert ack.size == 14
    ack = stub.AppendLog(iter([chunk(7, b"line 2\n"), chunk(14, b"line 3\n")]), metadata=md)
    assert ack.size == 21, "the resent chunk after a reconnect is recognised"
    with pytest.raises(grpc.RpcError) as gap:
        stub.AppendLog(iter([chunk(30, b"lost?\n")]), metadata=md)
    assert gap.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(gap.value.trailing_metadata())["x-log-size"] == "21"
    assert error_info(gap.value).metadata["size"] == "21"
    ack = stub.AppendLog(iter([chunk(21, b"", eof=True)]), metadata=md)
    assert ack.size == 21
    assert (c.data_dir / "logs" / "grpc-att-1.log").read_bytes() == b"line 1\nline 2\nline 3\n"


def test_blob_service_is_reflected_and_serving(c: Coordinator) -> None:
    services = c.run("grpcurl", *c.grpcurl_tls(), c.grpc, "list").stdout.split()
    assert "nodus.v1.BlobService" in services
    out = c.run("grpcurl", *c.grpcurl_tls(), "-d", '{"service": "nodus.v1.BlobService"}', c.grpc,
                "grpc.health.v1.Health/Check").stdout
    assert "SERVING" in out and "NOT_SERVING" not in out


def test_concurrent_grpc_puts(c: Coordinator, stub: Any) -> None:
    data = os.urandom(1 << 20)
    refs: list[Any] = []
    errors: list[BaseException] = []

    def put() -> None:
        try:
            refs.append(stub.Put(put_requests(data, chunk=64 * 1024), metadata=agent_md(c)))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=put) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({r.sha256 for r in refs}) == 1 and len(refs) == 6
    assert list((c.data_dir / "blobs" / "tmp").iterdir()) == []

