"""A store in an S3 bucket under a prefix: boto3, multipart uploads with parallel parts.

The archive streams into a multipart upload under `<prefix>/<seq:010d>-<id>.tar.zst`; the key is
fixed when the upload begins, before the digest exists, so its tag is a unique upload id rather than
the sha256 (renaming an S3 object is a full copy). Parts upload on a thread pool while the next part
fills; any failure aborts the multipart upload, so no parts are left billed. The manifest is one PUT
(atomic in S3) with `If-None-Match: *`, after CompleteMultipartUpload: that PUT is the commit.

Part size: S3 allows 10,000 parts of at least 5 MiB. The size is not known while streaming, so the
first part size is max(8 MiB, hint / 10,000) from the caller's hint (the unpacked size of the paths,
which a compressed archive does not exceed in practice), rounded up to a MiB; and it doubles every
1,000 parts, so even a hint far too small cannot run out of parts (8 MiB parts reach ~8 TiB).
At most `max_workers` parts are in flight, which bounds memory at (max_workers + 1) parts.
"""
from __future__ import annotations

import os
import secrets
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any, BinaryIO

from ..errors import AlreadyCommitted, NotFound, StoreError
from ..manifest import archive_key, manifest_key, seq_of_manifest_key
from .base import Clock, Store, Upload, utcnow

MiB = 1 << 20
MIN_PART = 8 * MiB
MAX_PARTS = 10_000
DOUBLE_EVERY = 1_000


def part_size_for(size_hint: int) -> int:
    """max(8 MiB, hint / 10,000), rounded up to a whole MiB."""
    per_part = -(-max(size_hint, 0) // MAX_PARTS)
    return max(MIN_PART, -(-per_part // MiB) * MiB)


REFUSED = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "NoSuchBucket", "InvalidBucketName", "AccountProblem", "ExpiredToken", "InvalidToken"})
"""S3 error codes that the same request meets again unchanged: the keys, their rights or the bucket
are wrong, not the moment."""


def _error(e: BaseException, what: str) -> StoreError:
    detail = getattr(e, "response", {}).get("Error", {}) if hasattr(e, "response") else {}
    code = detail.get("Code") or type(e).__name__
    error = StoreError(f"{what}: {code}: {detail.get('Message') or e}")
    if code in REFUSED:
        error.retryable = False
    return error


def _code(e: BaseException) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", "")) if hasattr(e, "response") else ""


class _S3Upload(Upload):
    def __init__(self, store: "S3Store", seq: int, part_size: int) -> None:
        self.store = store
        self.seq = seq
        self.key = archive_key(seq, secrets.token_hex(6))
        self.full_key = store._key(self.key)
        self.part_size = part_size
        self.buf = bytearray()
        self.upload_id: str | None = None
        self.parts: dict[int, str] = {}
        self.next_part = 1
        self.pool: ThreadPoolExecutor | None = None
        self.inflight: set[Future[None]] = set()
        self.lock = threading.Lock()

    def _current_part_size(self) -> int:
        return self.part_size << ((self.next_part - 1) // DOUBLE_EVERY)

    def write(self, data: bytes | memoryview, /) -> int:
        self.buf += data
        while len(self.buf) >= self._current_part_size():
            size = self._current_part_size()
            body = bytes(self.buf[:size])
            del self.buf[:size]
            self._submit(body)
        return len(data)

    def _submit(self, body: bytes) -> None:
        if self.next_part > MAX_PARTS:
            raise StoreError(f"checkpoint {self.seq} needs more than {MAX_PARTS} parts")
        if self.upload_id is None:
            try:
                r = self.store.client.create_multipart_upload(Bucket=self.store.bucket, Key=self.full_key)
            except Exception as e:
                raise _error(e, f"starting the upload of s3://{self.store.bucket}/{self.full_key}") from None
            self.upload_id = r["UploadId"]
            self.pool = ThreadPoolExecutor(self.store.max_workers, thread_name_prefix="checkpoint-s3")
        self._reap(block=len(self.inflight) >= self.store.max_workers)
        number = self.next_part
        self.next_part += 1
        assert self.pool is not None
        self.inflight.add(self.pool.submit(self._put_part, number, body))

    def _put_part(self, number: int, body: bytes) -> None:
        r = self.store.client.upload_part(Bucket=self.store.bucket, Key=self.full_key, UploadId=self.upload_id,
                                          PartNumber=number, Body=body)
        with self.lock:
            self.parts[number] = r["ETag"]

    def _reap(self, block: bool) -> None:
        """Collect finished parts (waiting for one when `block`); the first failure stops the save."""
        if not self.inflight:
            return
        done, _ = wait(self.inflight, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for f in done:
            self.inflight.discard(f)
            e = f.exception()
            if e is not None:
                raise _error(e, f"uploading a part of s3://{self.store.bucket}/{self.full_key}") from None

    def commit(self, sha256: str) -> str:
        client, bucket = self.store.client, self.store.bucket
        if self.upload_id is None:
            try:
                client.put_object(Bucket=bucket, Key=self.full_key, Body=bytes(self.buf))
            except Exception as e:
                raise _error(e, f"uploading s3://{bucket}/{self.full_key}") from None
            return self.key
        if self.buf:
            self._submit(bytes(self.buf))
            self.buf.clear()
        while self.inflight:
            self._reap(block=True)
        parts = [{"PartNumber": n, "ETag": self.parts[n]} for n in sorted(self.parts)]
        try:
            client.complete_multipart_upload(Bucket=bucket, Key=self.full_key, UploadId=self.upload_id,
                                             MultipartUpload={"Parts": parts})
        except Exception as e:
            raise _error(e, f"completing the upload of s3://{bucket}/{self.full_key}") from None
        self._close_pool()
        self.upload_id = None
        return self.key

    def _close_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.inflight.clear()

    def abort(self) -> None:
        self._close_pool()  # no part may land after the abort
        if self.upload_id is not None:
            try:
                self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.full_key,
                                                         UploadId=self.upload_id)
            except Exception as e:
                if _code(e) not in ("NoSuchUpload", "404"):
                    raise _error(e, f"aborting the upload of s3://{self.store.bucket}/{self.full_key}") from None
            self.upload_id = None
        self.buf.clear()


class S3Store(Store):
    """Checkpoints under s3://bucket/prefix. Credentials and region come from the usual AWS variables
    unless given (`credentials`: access_key_id, secret_access_key, optional session_token; `region`);
    the endpoint from `endpoint_url`, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (read by boto3)."""

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str | None = None,
                 part_size: int | None = None, max_workers: int = 8, clock: Clock = utcnow,
                 region: str | None = None, credentials: dict[str, str] | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.part_size = part_size
        """Fixed part size (tests force small parts with it); None chooses from the size hint."""
        self.max_workers = max_workers
        self.clock = clock
        if client is None:
            import boto3
            from botocore.config import Config

            region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            keys = {}
            if credentials:
                # Given keys replace the environment's and the config files' (boto3's first source).
                keys = {"aws_access_key_id": credentials.get("access_key_id"),
                        "aws_secret_access_key": credentials.get("secret_access_key"),
                        "aws_session_token": credentials.get("session_token") or None}
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, **keys,
                config=Config(max_pool_connections=max_workers + 4, retries={"mode": "standard"}))
        self.client = client

    @classmethod
    def at(cls, uri: str, fields: dict[str, str]) -> "S3Store":
        """The store at `uri` (s3://bucket/prefix) with a Connection's fields, by their API names:
        accessKeyId, secretAccessKey, sessionToken, endpoint, region (absent: boto3's own sources)."""
        from . import parse_s3_url

        bucket, prefix = parse_s3_url(uri)
        keys = {"access_key_id": fields.get("accessKeyId", ""), "secret_access_key": fields.get("secretAccessKey", ""),
                "session_token": fields.get("sessionToken", "")}
        return cls(bucket, prefix, endpoint_url=fields.get("endpoint") or None, region=fields.get("region") or None,
                   credentials=keys if keys["access_key_id"] else None)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _name(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    def begin_upload(self, seq: int, size_hint: int) -> Upload:
        return _S3Upload(self, seq, self.part_size or part_size_for(size_hint))

    def commit_manifest(self, seq: int, data: bytes) -> None:
        key = self._key(manifest_key(seq))
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*",
                                   ContentType="application/json")
        except Exception as e:
            if _code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise AlreadyCommitted(f"checkpoint {seq} is already committed in {self.url}") from None
            raise _error(e, f"committing the manifest of checkpoint {seq} to {self.url}") from None

    def _paginate(self, operation: str, field: str, what: str) -> list[dict[str, Any]]:
        """Every item of a paginated listing under the prefix."""
        out: list[dict[str, Any]] = []
        try:
            pages = self.client.get_paginator(operation).paginate(
                Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "")
            for page in pages:
                out.extend(page.get(field, []))
        except Exception as e:
            raise _error(e, f"listing {what}") from None
        return out

    def _list(self) -> list[dict[str, Any]]:
        return self._paginate("list_objects_v2", "Contents", self.url)

    def manifest_seqs(self) -> list[int]:
        seqs = (seq_of_manifest_key(o["Key"]) for o in self._list() if "/" not in self._name(o["Key"]))
        return sorted(s for s in seqs if s is not None)

    def read_manifest(self, seq: int) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(manifest_key(seq)))["Body"].read())
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"checkpoint {seq} is not committed in {self.url}") from None
            raise _error(e, f"reading checkpoint {seq} from {self.url}") from None

    def open_archive(self, key: str) -> BinaryIO:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]  # type: ignore[no-any-return]
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"archive {key} is missing from {self.url}") from None
            raise _error(e, f"reading {key} from {self.url}") from None

    def fetch(self, key: str, dest: str) -> None:
        """Parallel ranged GETs straight into the local file."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(max_concurrency=self.max_workers, multipart_chunksize=MIN_PART,
                                multipart_threshold=MIN_PART)
        try:
            self.client.download_file(self.bucket, self._key(key), dest, Config=config)
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"archive {key} is missing from {self.url}") from None
            raise _error(e, f"downloading {key} from {self.url}") from None

    def delete_key(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as e:
            if _code(e) not in ("NoSuchKey", "404"):
                raise _error(e, f"deleting {key} from {self.url}") from None

    def stale_keys(self, before: datetime) -> list[str]:
        objects = self._list()
        referenced = self.referenced_archives()
        stale = []
        for o in objects:
            name = self._name(o["Key"])
            if "/" in name or not name.endswith(".tar.zst") or name in referenced:
                continue
            if o["LastModified"] < before:
                stale.append(name)
        return sorted(stale)

    def incomplete_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads begun under the prefix and neither completed nor aborted."""
        return self._paginate("list_multipart_uploads", "Uploads", f"the uploads in {self.url}")

    def abort_stale_uploads(self, before: datetime) -> int:
        n = 0
        for u in self.incomplete_uploads():
            if u["Initiated"] < before:
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"])
                    n += 1
                except Exception as e:
                    if _code(e) != "NoSuchUpload":
                        raise _error(e, f"aborting a stale upload in {self.url}") from None
        return n
