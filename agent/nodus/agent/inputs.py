"""Materializing an attempt's inputs, volumes and code before anything of it runs.

Every input lands at $NODUS_INPUTS_DIR/<name>, read-only: a file as it came, an archive (volume
revision, a Job's directory output) unpacked into a directory. Sources: `https://` (sha256 checked
at end of stream when the input names one), `s3://bucket/key` (a bucket input, streamed with the keys
of its Connection that the Location carries, sha256 checked at end of stream when named),
`blob://sha256/<hex>` (BlobService.Get, always checked against the digest the URI names) and
`file://` (a path on this host, for development). A digest that does not match, a missing object or
refused keys fail the attempt with InputFailed, naming the input and the cause.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from nodus.v1 import agent_pb2

from .archive import CHUNK, unpack
from .blobs import BlobClient, DigestMismatch, blob_digest
from .layout import AttemptLayout
from .reasons import Reason


class InputError(Exception):
    """An input could not be materialized; the attempt fails with `reason`."""

    def __init__(self, message: str, reason: str = Reason.INPUT_FAILED) -> None:
        super().__init__(message)
        self.reason = reason


def _safe(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InputError(f"input name {name!r} is not a plain name")
    return name


def redact(uri: str) -> str:
    """A URI fit for a status message: no credentials, no query (pre-signed URLs carry tokens there)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _download_https(url: str, dest: Path, ca_file: str | None, timeout: float) -> tuple[str, int]:
    import requests

    digest = hashlib.sha256()
    size = 0
    with requests.Session() as s:
        s.trust_env = False
        verify: Any = ca_file or True
        with s.get(url, stream=True, timeout=timeout, verify=verify) as r:
            r.raise_for_status()
            with open(dest, "wb") as f:
                for chunk in r.iter_content(CHUNK):
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
    return digest.hexdigest(), size


S3_REFUSED = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                        "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "403"})
"""S3 error codes that say the Connection's keys (or their rights) were refused."""
S3_MISSING = frozenset({"NoSuchKey", "NoSuchBucket", "404"})


def _download_s3(uri: str, credentials: dict[str, str], dest: Path) -> tuple[str, int]:
    """Streams s3://bucket/key into `dest` with a Connection's fields (accessKeyId, secretAccessKey,
    sessionToken, endpoint, region: the checkpoint store's names), hashing as it goes."""
    from nodus.checkpoint.stores import parse_s3_url
    from nodus.checkpoint.stores.s3 import S3Store  # boto3 is imported only for S3

    bucket, key = parse_s3_url(uri)
    if not key:
        raise ValueError(f"{uri} names no object (use s3://BUCKET/KEY)")
    client = S3Store.at(f"s3://{bucket}", credentials).client
    digest = hashlib.sha256()
    size = 0
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(CHUNK):
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
    finally:
        body.close()
    return digest.hexdigest(), size


def _describe_s3(e: Exception, uri: str, credentials: dict[str, str]) -> str:
    """Why reading `uri` failed, in the customer's words; never a credential."""
    error = (getattr(e, "response", None) or {}).get("Error") or {}
    code = str(error.get("Code") or "")
    detail = str(error.get("Message") or e)
    if code in S3_MISSING:
        what = "the bucket does not exist" if code == "NoSuchBucket" else "the object does not exist"
        text = f"{uri}: {what} ({code})"
    elif code in S3_REFUSED:
        text = f"the keys of its Connection were refused reading {uri} ({code}: {detail})"
    else:
        text = f"reading {uri} failed: {code or type(e).__name__}: {detail}"
    for value in credentials.values():
        if len(value) >= 8:
            text = text.replace(value, "***")
    return text[:400]


def _copy_file(src: Path, dest: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        while chunk := fi.read(CHUNK):
            fo.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _describe(e: Exception, uri: str) -> str:
    response = getattr(e, "response", None)
    if response is not None and getattr(response, "status_code", None):
        return f"HTTP {response.status_code}"
    text = str(e).replace(uri, redact(uri))
    return f"{type(e).__name__}: {text}"[:300]


def make_read_only(path: Path) -> None:
    """Drops every write bit under `path` (root ignores them, every other user does not)."""
    paths = [path] if not path.is_dir() else [path, *path.rglob("*")]
    for p in reversed(paths):
        try:
            mode = p.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            p.chmod(stat.S_IMODE(mode) & ~0o222)
        except OSError:
            pass


class Materializer:
    def __init__(self, blobs: BlobClient | None, ca_file: str | None = None, timeout: float = 60.0) -> None:
        self.blobs = blobs
        self.ca_file = ca_file
        self.timeout = timeout

    async def fetch(self, attempt_id: str, what: str, location: agent_pb2.Location, expected: str, tmp: Path) -> Path:
        """Fetches one location of `attempt_id`'s Assignment into a temp file under `tmp` and checks its digest."""
        return (await self.fetch_verified(attempt_id, what, location, expected, tmp))[0]

    async def fetch_verified(self, attempt_id: str, what: str, location: agent_pb2.Location, expected: str,
                             tmp: Path) -> tuple[Path, str]:
        """`fetch`, with the sha256 of what arrived (hex), computed at the end of the stream. A blob:// location
        is read for `attempt_id` (the coordinator serves a node only its attempts' blobs)."""
        uri = location.uri.strip()
        dest = tmp / f"fetch-{os.urandom(6).hex()}"
        expected = expected.strip().lower()
        if uri.startswith("https://"):
            try:
                got, _ = await asyncio.to_thread(_download_https, uri, dest, self.ca_file, self.timeout)
            except Exception as e:  # noqa: BLE001 - any transport failure is an input failure
                raise InputError(f"{what}: download from {redact(uri)} failed: {_describe(e, uri)}") from e
        elif uri.startswith("s3://"):
            credentials = dict(location.credentials)
            try:
                got, _ = await asyncio.to_thread(_download_s3, uri, credentials, dest)
            except Exception as e:  # noqa: BLE001 - a missing object, refused keys, an unreachable endpoint
                dest.unlink(missing_ok=True)
                raise InputError(f"{what}: {_describe_s3(e, uri, credentials)}") from e
        elif uri.startswith("http://"):
            raise InputError(f"{what}: {redact(uri)} is not https:// (only HTTPS downloads are allowed)")
        elif (named := blob_digest(uri)) is not None:
            if self.blobs is None:
                raise InputError(f"{what}: no blob store to read {uri} from")
            try:
                got, _ = await self.blobs.get(attempt_id, named, dest)
            except DigestMismatch as e:
                raise InputError(f"{what}: sha256 mismatch: expected {e.expected}, got {e.got}") from e
            except Exception as e:  # noqa: BLE001
                raise InputError(f"{what}: reading {uri} from the blob store failed: {e}") from e
        elif uri.startswith("file://"):
            src = Path(uri[len("file://"):])
            try:
                got, _ = await asyncio.to_thread(_copy_file, src, dest)
            except OSError as e:
                raise InputError(f"{what}: {src}: {e.strerror or e}") from e
        else:
            scheme = uri.split(":", 1)[0] if ":" in uri else uri
            raise InputError(f"{what}: unsupported location {scheme!r} (https, s3, blob and file are supported)")
        if expected and got != expected:
            dest.unlink(missing_ok=True)
            raise InputError(f"{what}: sha256 mismatch: expected {expected}, got {got}")
        return dest, got

    async def place(self, fetched: Path, dest: Path, archive: bool, what: str) -> None:
        if dest.is_dir() and not dest.is_symlink():
            await asyncio.to_thread(_remove_tree, dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if archive:
            try:
                await asyncio.to_thread(unpack, fetched, dest)
            except Exception as e:  # noqa: BLE001 - a corrupt or hostile archive
                raise InputError(f"{what}: unpacking failed: {e}") from e
            finally:
                fetched.unlink(missing_ok=True)
        else:
            os.replace(fetched, dest)
        await asyncio.to_thread(make_read_only, dest)

    async def materialize(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> dict[str, str]:
        """Inputs, then volumes, then code; raises InputError on the first failure. Returns the sha256 of
        each input by name, as it arrived (the Job's status.inputs records them)."""
        digests: dict[str, str] = {}
        for inp in a.inputs:
            name = _safe(inp.name)
            what = f"input {name}"
            fetched, digests[inp.name] = await self.fetch_verified(a.attempt_id, what, inp.source, inp.sha256, layout.tmp)
            await self.place(fetched, layout.inputs / name, inp.archive, what)
        for vol in a.volumes:
            if not vol.source.uri:
                continue
            name = _safe(vol.volume)
            what = f"volume {name}"
            fetched = await self.fetch(a.attempt_id, what, vol.source, "", layout.tmp)
            dest = layout.volumes / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            await self.place(fetched, dest, True, what)
            if not vol.read_only:
                await asyncio.to_thread(_writable, dest)
        if a.HasField("source") and a.source.WhichOneof("source") == "blob":
            blob = a.source.blob
            fetched = await self.fetch(a.attempt_id, "source", blob.location, blob.sha256, layout.tmp)
            target = layout.translate(a.source.path) if a.source.path else working_dir(a, layout)
            try:
                await asyncio.to_thread(unpack, fetched, target)
            except Exception as e:  # noqa: BLE001
                raise InputError(f"source: unpacking failed: {e}") from e
            finally:
                fetched.unlink(missing_ok=True)
        elif a.HasField("source") and a.source.WhichOneof("source") == "git":
            await self._git(a, layout)
        return digests

    async def _git(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> None:
        git = a.source.git
        target = layout.translate(a.source.path) if a.source.path else working_dir(a, layout)
        target.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
        creds = dict(git.repo.credentials)
        if creds.get("username") or creds.get("password"):  # a private repository: basic auth, never in argv or URL
            basic = base64.b64encode(f"{creds.get('username', '')}:{creds.get('password', '')}".encode()).decode()
            env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}"})
        steps = [("init", ["git", "init", "-q", str(target)]),
                 ("fetch", ["git", "-C", str(target), "fetch", "-q", "--depth", "1", git.repo.uri, git.commit]),
                 ("checkout", ["git", "-C", str(target), "checkout", "-q", "FETCH_HEAD"])]
        for step, argv in steps:
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                            stderr=asyncio.subprocess.PIPE, env=env)
            except OSError as e:
                raise InputError(f"source: git is not available on this node: {e.strerror or e}") from e
            _, err = await proc.communicate()
            if proc.returncode != 0:
                last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
                last = re.sub(r"://[^/@\s]+@", "://", last)  # never echo credentials from the URL
                raise InputError(f"source: git {step} failed: {last}")


def _remove_tree(path: Path) -> None:
    _writable(path)
    shutil.rmtree(path)


def _writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        try:
            if not p.is_symlink():
                p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)
        except OSError:
            pass


def working_dir(a: agent_pb2.Assignment, layout: AttemptLayout) -> Path:
    return layout.translate(a.working_dir) if a.working_dir else layout.root
