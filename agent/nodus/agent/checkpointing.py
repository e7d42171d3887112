"""Checkpoints of a running attempt, and restores before a replacement starts (ADR 0012).

A snapshot is taken in three steps, so the program is held only for a local copy:

1. **Consistent point.** A program that opted in (`NODUS_CHECKPOINT_SIGNAL=1` in its environment) gets
   the handshake: the agent writes the request file (`$NODUS_CHECKPOINT_REQUEST`, JSON `{"seq": N}`)
   and sends SIGUSR1 to the main command; the program saves what it must, writes the seq to
   `$NODUS_CHECKPOINT_DONE`, and leaves its state paths alone until the request file is gone. A
   program that did not opt in, or does not answer within the handshake timeout, is frozen: the
   attempt's cgroup freezer (v1 `freezer.state`, v2 `cgroup.freeze`), or SIGSTOP of its process
   group where no freezer is available.
2. **Local copy** of the state paths into a staging directory under `run/` (`checkpoint.localcopy`:
   what `cp -a --reflink=auto` makes, on a few threads in-process), then the program is released
   (thawed, request removed). The hold is the pause reported in CheckpointCommit.pause.
3. **Archive and upload** from the copy, with the program running: `checkpoint.archive` writes the
   tar.zst (sha256 while streaming, maxSize enforced), then the blob store takes it by digest.

Restore fetches the archive by digest, and `checkpoint.restore` verifies it before extracting
anything and refuses unsafe members. Saved paths are the contract's (`/nodus/state`); the process
runtime maps `/nodus/<x>` onto the attempt's own directory.

A Job with an S3 Connection (ADR 0014) stores its archives in that bucket instead, through the
library's S3 store (multipart, parallel parts, abort on failure), each attempt under its own prefix
with the library's manifest written last: `upload_s3` and `fetch_s3` below, with the credentials the
assignment brought (never written to disk).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nodus.checkpoint import DEFAULT_LEVEL, AlreadyCommitted, Manifest, archive
from nodus.checkpoint import restore as restore_archive
from nodus.checkpoint.localcopy import copy_tree
from nodus.checkpoint.manifest import manifest_key, seq_of_manifest_key
from nodus.checkpoint.stores import Store
from nodus.handshake import DONE_ENV, LISTENER, REQUEST_ENV

from .cgroups import Cgroup
from .clock import Clock, SystemClock
from .layout import AttemptLayout

HANDSHAKE_TIMEOUT = 30.0
"""How long a program that opted in has to answer before it is frozen instead."""
HF_HANDSHAKE_TIMEOUT = 300.0
"""Integration HFTrainer: the answer comes after the running step ends and Trainer has saved
`checkpoint-N` (nodus.hf.NodusCheckpointCallback), which takes longer than a plain handler. The
program keeps training while the agent waits, so the wait costs it nothing but the save itself."""
CONTRACT_ROOT = "/nodus"


class CheckpointFailed(Exception):
    """A snapshot or a restore could not be done; the message says why."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A checkpoint archived locally, ready to upload."""

    seq: int
    archive: Path
    sha256: str
    size: int
    paths: tuple[str, ...]
    """The saved paths as the Job named them (/nodus/state)."""
    pause: float
    """Seconds the program was held (handshake wait, or frozen) for the local copy."""
    method: str
    """handshake, freeze, sigstop or none."""
    files: int
    unpacked_size: int = 0
    level: int = DEFAULT_LEVEL


def handshake_dir(layout: AttemptLayout) -> Path:
    return layout.run / "checkpoint"


def listening(layout: AttemptLayout) -> bool:
    """Whether a program-side helper that polls the request file announced itself (nodus.hf)."""
    return (handshake_dir(layout) / LISTENER).exists()


def handshake_env(layout: AttemptLayout) -> dict[str, str]:
    d = handshake_dir(layout)
    return {REQUEST_ENV: str(d / "request.json"), DONE_ENV: str(d / "done")}


def physical(layout: AttemptLayout, path: str) -> Path:
    """Where a contract path lives for the process runtime: /nodus/state → <attempt>/state."""
    norm = os.path.normpath(path)
    if norm == CONTRACT_ROOT:
        return layout.root
    if norm.startswith(CONTRACT_ROOT + "/"):
        return layout.root / norm[len(CONTRACT_ROOT) + 1:]
    return Path(norm)


POLL = 0.01
"""Seconds between two looks at the handshake's done file."""


class Hold:
    """Holds the program at a consistent point for the local copy; `release` lets it go.

    Its waits (the handshake's deadline, the freezer's) read the agent's `clock` and pause with
    `sleep`, so a test moves both by hand instead of waiting out a 30 s deadline."""

    def __init__(self, layout: AttemptLayout, seq: int, *, opted_in: bool, main_pid: int | None,
                 cgroup: Cgroup | None, handshake_timeout: float = HANDSHAKE_TIMEOUT, send_signal: bool = True,
                 clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.layout, self.seq, self.opted_in, self.main_pid, self.cgroup = layout, seq, opted_in, main_pid, cgroup
        self.handshake_timeout = handshake_timeout
        self.send_signal = send_signal
        """Send SIGUSR1 with the request; False for a program that only polls the request file (LISTENER)."""
        self.clock: Clock = clock or SystemClock()
        self.sleep = sleep
        self.method = "none"
        self.started = 0.0

    def acquire(self) -> None:
        self.started = self.clock.monotonic()
        if self.opted_in and self.main_pid and self._handshake():
            self.method = "handshake"
            return
        if self.cgroup is not None and self.cgroup.usable and self.cgroup.freeze(True):
            self.method = "freeze"
            self._wait_frozen()
            return
        if self.main_pid and _killpg(self.main_pid, signal.SIGSTOP):
            self.method = "sigstop"

    def release(self) -> float:
        if self.method == "freeze":
            assert self.cgroup is not None
            self.cgroup.freeze(False)
        elif self.method == "sigstop" and self.main_pid:
            _killpg(self.main_pid, signal.SIGCONT)
        env = handshake_env(self.layout)
        for key in (REQUEST_ENV, DONE_ENV):
            Path(env[key]).unlink(missing_ok=True)
        return self.clock.monotonic() - self.started

    def _handshake(self) -> bool:
        env = handshake_env(self.layout)
        request, done = Path(env[REQUEST_ENV]), Path(env[DONE_ENV])
        request.parent.mkdir(parents=True, exist_ok=True)
        done.unlink(missing_ok=True)
        tmp = request.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": self.seq}))
        os.chmod(tmp, 0o644)
        os.replace(tmp, request)
        if self.send_signal:
            try:
                os.kill(self.main_pid or 0, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                return False
        deadline = self.clock.monotonic() + self.handshake_timeout
        while self.clock.monotonic() < deadline:
            try:
                if done.read_text().strip() in (str(self.seq), ""):
                    return True
            except FileNotFoundError:
                pass
            self.sleep(POLL)
        request.unlink(missing_ok=True)  # no answer: it falls back to the freeze
        return False

    def _wait_frozen(self, timeout: float = 5.0) -> None:
        """Freezing is asynchronous on both cgroup versions: v2 says so in cgroup.events ("frozen 1"),
        v1 reads FREEZING in freezer.state until every task has stopped (a write of FROZEN again
        retries, as the kernel's freezer documentation says). A hold that never completes is thawed and
        the checkpoint fails: copying a program that still runs could archive a torn state."""
        assert self.cgroup is not None
        deadline = self.clock.monotonic() + timeout
        while True:
            if self._frozen():
                return
            if self.clock.monotonic() >= deadline:
                self.cgroup.freeze(False)
                self.method = "none"
                raise CheckpointFailed(f"the attempt's cgroup did not freeze within {timeout:g} s "
                                       "(a task that cannot be stopped, such as one in uninterruptible I/O)")
            self.sleep(0.002)

    def _frozen(self) -> bool:
        assert self.cgroup is not None
        paths = self.cgroup.paths
        try:
            if "unified" in paths:
                return "frozen 1" in (paths["unified"] / "cgroup.events").read_text()
            state = (paths["freezer"] / "freezer.state").read_text().strip()
            if state == "FREEZING":
                (paths["freezer"] / "freezer.state").write_text("FROZEN")
            return state == "FROZEN"
        except (OSError, KeyError):
            return True  # the cgroup went away with its tasks: nothing is left running to hold


def _killpg(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)  # the main command leads its own process group (start_new_session)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _copy(src: Path, dst: Path) -> None:
    """Copies a state path to `dst` in the staging directory (merged into `dst` where an earlier path
    made it); the program is held meanwhile, so this is the pause."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_tree(src, dst)


class _FileSink:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes | memoryview, /) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        return len(data)


def copy_held(layout: AttemptLayout, paths: list[str], staging: Path, hold: Hold) -> tuple[list[str], float]:
    """Steps 1 and 2: hold the program, copy the paths into `staging`, release it. Returns the archive
    member names and the pause (seconds held). Raises CheckpointFailed for a missing path."""
    names: list[str] = []
    hold.acquire()
    try:
        for p in paths:
            name = archive.member_name(p)
            src = physical(layout, p)
            if not src.exists():
                raise CheckpointFailed(f"checkpoint path {p} does not exist")
            _copy(src, staging / name)
            names.append(name)
    finally:
        pause = hold.release()  # before compression and upload: the program never waits for those
    return names, pause


def take(layout: AttemptLayout, seq: int, paths: list[str], *, opted_in: bool, main_pid: int | None,
         cgroup: Cgroup | None, max_size: int | None = None, level: int = archive.DEFAULT_LEVEL,
         handshake_timeout: float = HANDSHAKE_TIMEOUT, send_signal: bool = True,
         clock: Clock | None = None) -> Snapshot:
    """Hold, copy, release, archive. Blocking (run it on a thread). Raises CheckpointFailed.
    `clock` is the agent's (the hold's deadlines and its pause read it)."""
    paths = list(paths) or [CONTRACT_ROOT + "/state"]
    staging = layout.run / f"checkpoint-{seq}.d"
    out = layout.run / f"checkpoint-{seq}.tar.zst"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    hold = Hold(layout, seq, opted_in=opted_in, main_pid=main_pid, cgroup=cgroup, handshake_timeout=handshake_timeout,
                send_signal=send_signal, clock=clock)
    try:
        names, pause = copy_held(layout, paths, staging, hold)
        plan = archive.scan(names, root=staging)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            info = archive.write(plan, _FileSink(fd), level=level, max_size=max_size)
        finally:
            os.close(fd)
    except CheckpointFailed:
        out.unlink(missing_ok=True)
        raise
    except Exception as e:  # noqa: BLE001 - every library failure is a failed checkpoint with a reason
        out.unlink(missing_ok=True)
        raise CheckpointFailed(f"{type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Snapshot(seq, out, info.sha256, info.size, tuple(paths), pause, hold.method, info.files,
                    info.unpacked_size, level)


def restore(layout: AttemptLayout, archive_path: Path, sha256: str, size: int | None = None,
            max_size: int | None = None, chown: Callable[[Path], Any] | None = None) -> None:
    """Restores a checkpoint into the attempt's paths; the digest is checked before anything is written."""
    staging = layout.run / "restore.d"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        restore_archive(archive_path, staging, sha256=sha256 or None, size=size or None, max_size=max_size)
        tops = sorted(staging.iterdir())
        for top in tops:
            if top.name != CONTRACT_ROOT.strip("/"):
                # The process runtime shares the host: a checkpoint never writes outside the attempt.
                raise CheckpointFailed(f"checkpoint member {top.name}/ is outside {CONTRACT_ROOT}; the process "
                                       f"runtime restores only {CONTRACT_ROOT} paths")
        restored: list[Path] = []
        for top in tops:
            for child in sorted(top.iterdir()):
                restored.append(physical(layout, f"{CONTRACT_ROOT}/{child.name}"))
                _merge(child, restored[-1])
    except CheckpointFailed:
        raise
    except Exception as e:  # noqa: BLE001 - DigestMismatch, UnsafeArchive, CorruptArchive, NoSpace …
        raise CheckpointFailed(f"{type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if chown is not None:  # every restored path, not only state/ (paths may name /nodus/outputs/…)
        for path in restored:
            chown(path)
            for root, dirs, files in os.walk(path):
                for n in [*dirs, *files]:
                    chown(Path(root) / n)


def _merge(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        dst.mkdir(parents=True, exist_ok=True)
        for child in src.iterdir():
            _merge(child, dst / child.name)
        return
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)


# -- S3 (a Job's S3 Connection) ----------------------------------------------------------------------

S3_URI = "s3://"


def s3_store(uri: str, credentials: dict[str, str]) -> Store:
    """The library's S3 store at `uri` with the Location's credentials (the coordinator's names:
    accessKeyId, secretAccessKey, sessionToken, endpoint, region)."""
    from nodus.checkpoint.stores.s3 import S3Store  # boto3 is imported only for S3

    return S3Store.at(uri, credentials)


def upload_s3(store: Store, snap: Snapshot, *, attempt: str, epoch: int, format: str) -> tuple[str, Manifest]:
    """Uploads a local snapshot as checkpoint `snap.seq` of `store` and commits its manifest (last, only
    if that seq has none). Returns the manifest's URI and the manifest. Blocking; raises CheckpointFailed.

    The same attempt asked again for a seq it already committed (its commit was lost with a stream)
    gets the committed one back: a seq is never overwritten."""
    try:
        upload = store.begin_upload(snap.seq, snap.size)
        try:
            with open(snap.archive, "rb") as f:
                while chunk := f.read(archive.CHUNK):
                    upload.write(chunk)
            key = upload.commit(snap.sha256)
        except BaseException:
            upload.abort()
            raise
        manifest = Manifest(seq=snap.seq, time=store.clock(), archive=key, size=snap.size, sha256=snap.sha256,
                            paths=tuple(archive.member_name(p) for p in snap.paths), files=snap.files,
                            unpacked_size=snap.unpacked_size, level=snap.level, format=format, attempt=attempt,
                            epoch=epoch)
        try:
            store.commit_manifest(snap.seq, manifest.to_json())
        except AlreadyCommitted:
            manifest = store.get(snap.seq)
            if manifest.archive != key:  # ours is not the committed one (the same bytes may share a key)
                store.delete_key(key)
            if manifest.attempt != attempt:
                raise CheckpointFailed(f"checkpoint {snap.seq} in {store.url} was committed by attempt "
                                       f"{manifest.attempt}, not {attempt}") from None
        except BaseException:
            store.delete_key(key)
            raise
    except CheckpointFailed:
        raise
    except Exception as e:  # noqa: BLE001 - StoreError, botocore errors: a failed checkpoint with a reason
        raise CheckpointFailed(f"{type(e).__name__}: {e}") from None
    return f"{store.url}/{manifest_key(snap.seq)}", manifest


def fetch_s3(manifest_uri: str, credentials: dict[str, str], sha256: str, dest: Path) -> Manifest:
    """Downloads the archive an s3:// manifest names (parallel ranged GETs) to `dest`, after checking that
    the manifest commits the digest the coordinator recorded. `restore` then verifies the bytes."""
    prefix_uri, _, name = manifest_uri.rpartition("/")
    seq = seq_of_manifest_key(name)
    if not prefix_uri.startswith(S3_URI) or seq is None:
        raise CheckpointFailed(f"{manifest_uri} is not a checkpoint manifest (s3://BUCKET/PREFIX/SEQ.manifest.json)")
    try:
        store = s3_store(prefix_uri, credentials)
        manifest = store.get(seq)
        if manifest.sha256.lower() != sha256.lower():
            raise CheckpointFailed(f"the manifest {manifest_uri} commits sha256 {manifest.sha256}, not the "
                                   f"recorded {sha256}; nothing was extracted")
        store.fetch(manifest.archive, str(dest))
    except CheckpointFailed:
        raise
    except Exception as e:  # noqa: BLE001 - NotFound, StoreError, botocore errors
        raise CheckpointFailed(f"{type(e).__name__}: {e}") from None
    return manifest
