"""What the S3 blob store (`--blob-url s3://…`, ADR 0044) costs beside plain boto3, in the same run.

One moto server on loopback (what the tests use; a real S3 answers slower per call but the ratios say
where our overhead is). For each figure, the anchor is the plainest boto3 call doing the same work:
- blob put: `S3BlobStore.put` of SIZE MiB streamed in 1 MiB pieces (hashed, 8 MiB multipart parts,
  completed after the digest check) vs `upload_fileobj` of the same bytes (s3transfer, 8 MiB parts
  sent by 10 threads, no hashing);
- blob read: `S3BlobStore.read` in 1 MiB pieces vs one `get_object().read()`;
- log appends: `S3LogStore.append` of CHUNKS chunks of 4 KiB (a LIST then a PUT each) vs a loop of
  bare `put_object` calls of the same sizes;
- log read, running: the REST route's loop (`Logs.read` in 1 MiB windows) on a cold replica over those
  CHUNKS objects vs one `get_object` of an object holding the same bytes;
- log read, finished: the same once eof compacted the chunks into one object.

    .venv/bin/python bench/blobs_s3.py [--size-mib 64] [--chunks 500] [--tiny] [--save]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import record

ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


@contextlib.contextmanager
def moto(log_dir: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "moto_server"
    with open(log_dir / "moto.log", "wb") as out:
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((log_dir / "moto.log").read_text()) from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


async def pieces(data: bytes, size: int = 1 << 20) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def mib_s(n: int, seconds: float) -> str:
    return f"{n / (1 << 20) / seconds:8.1f} MiB/s"


async def run(args: argparse.Namespace, endpoint: str, spool: Path) -> None:
    from nodus.coordinator.blobs.open import open_blobs, s3_client
    from nodus.coordinator.blobs.s3 import S3BlobStore

    s3 = s3_client(endpoint, "us-east-1")
    s3.create_bucket(Bucket="bench")
    store = await open_blobs("s3://bench/nodus", spool, endpoint)
    assert isinstance(store, S3BlobStore)
    data = os.urandom(args.size_mib << 20)
    digest = hashlib.sha256(data).hexdigest()
    print(f"moto server on loopback; blob {args.size_mib} MiB, log {args.chunks} chunks of 4 KiB")

    t = time.perf_counter()
    await store.put(pieces(data), digest, len(data))
    ours = time.perf_counter() - t
    t = time.perf_counter()
    await asyncio.to_thread(s3.upload_fileobj, io.BytesIO(data), "bench", "anchor/blob")
    anchor = time.perf_counter() - t
    print(f"blob put     S3BlobStore.put {mib_s(len(data), ours)}   anchor upload_fileobj {mib_s(len(data), anchor)}"
          f"   ratio {anchor / ours:.2f}")

    t = time.perf_counter()
    got = b"".join([c async for c in store.read(digest)])
    ours = time.perf_counter() - t
    assert got == data
    t = time.perf_counter()
    raw = await asyncio.to_thread(lambda: s3.get_object(Bucket="bench", Key="anchor/blob")["Body"].read())
    anchor = time.perf_counter() - t
    assert raw == data
    print(f"blob read    S3BlobStore.read {mib_s(len(data), ours)}  anchor get_object {mib_s(len(data), anchor)}"
          f"   ratio {anchor / ours:.2f}")

    chunk = os.urandom(4096)
    t = time.perf_counter()
    for i in range(args.chunks):
        await store.logs.append("bench-log", i * len(chunk), chunk)
    ours = time.perf_counter() - t

    def bare() -> None:
        for i in range(args.chunks):
            s3.put_object(Bucket="bench", Key=f"anchor/log/{i:020d}", Body=chunk)
    t = time.perf_counter()
    await asyncio.to_thread(bare)
    anchor = time.perf_counter() - t
    print(f"log append   S3LogStore.append {args.chunks / ours:8.0f}/s   anchor put_object {args.chunks / anchor:8.0f}/s"
          f"   ratio {anchor / ours:.2f}")

    total = args.chunks * len(chunk)

    async def read_all(replica: str) -> tuple[float, bytes]:
        reader = (await open_blobs("s3://bench/nodus", spool / replica, endpoint)).logs  # another replica, cold
        t = time.perf_counter()
        size, offset, out = (await reader.state("bench-log")).size, 0, bytearray()
        while offset < size:
            piece = await reader.read("bench-log", offset, min(1 << 20, size - offset))
            offset += len(piece)
            out += piece
        return time.perf_counter() - t, bytes(out)

    running, out = await read_all("r1")
    assert len(out) == total
    await store.logs.append("bench-log", total, b"", eof=True)
    await store.logs.settle()
    finished, again = await read_all("r2")
    assert again == out
    s3.put_object(Bucket="bench", Key="anchor/whole-log", Body=out)
    t = time.perf_counter()
    await asyncio.to_thread(lambda: s3.get_object(Bucket="bench", Key="anchor/whole-log")["Body"].read())
    anchor = time.perf_counter() - t
    print(f"log read running  {args.chunks} chunks {running * 1000:8.1f} ms   anchor one object {anchor * 1000:8.1f} ms"
          f"   ratio {anchor / running:.3f}")
    print(f"log read finished (compacted) {finished * 1000:8.1f} ms   anchor one object {anchor * 1000:8.1f} ms"
          f"   ratio {anchor / finished:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=500)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"size_mib": 9, "chunks": 20})
    os.environ.update(ENV)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(k, None)
    with tempfile.TemporaryDirectory(prefix="nodus-blobs-s3-") as tmp, record.Report("blobs_s3", args):
        with moto(Path(tmp)) as endpoint:
            asyncio.run(run(args, endpoint, Path(tmp) / "spool"))


if __name__ == "__main__":
    main()
