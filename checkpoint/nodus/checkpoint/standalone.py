"""A checkpoint as one file (`nodus checkpoint save … --out FILE`), with its manifest beside it.

FILE is written to a temp name in its directory, fsynced and renamed; then `FILE.manifest.json`
(the same manifest a store commits) is written the same way, last. `verify` and `restore` compare
against that sidecar when it is there; without it they can check structure and zstd's checksum only.
"""
from __future__ import annotations

import errno
import os
from typing import Callable, Iterable

from .errors import CheckpointError, DigestMismatch, NoSpace, SourceError
from .filesink import FileSink
from .frames import DEFAULT_LEVEL
from .manifest import Clock, Manifest, utcnow
from .mapped import MappedArchive
from .restore import Summary, inspect, restore

SIDECAR = ".manifest.json"


def sidecar_path(path: str | os.PathLike[str]) -> str:
    return os.fspath(path) + SIDECAR


def read_sidecar(path: str | os.PathLike[str]) -> Manifest | None:
    try:
        with open(sidecar_path(path), "rb") as f:
            return Manifest.from_json(f.read())
    except FileNotFoundError:
        return None


def _atomic_write(path: str, fill: Callable[[FileSink], object]) -> None:
    tmp = os.path.join(os.path.dirname(path) or ".", f".tmp-{os.urandom(6).hex()}-{os.path.basename(path)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            fill(FileSink(fd))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            if e.errno == errno.ENOSPC:
                raise NoSpace(f"no space left on device while writing {path}; nothing was written") from None
            raise CheckpointError(f"writing {path}: {e.strerror or e}") from None
        raise


def save_file(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str], *, seq: int = 0,
              root: str | os.PathLike[str] | None = None, level: int = DEFAULT_LEVEL,
              max_size: int | None = None, attempt: str = "", epoch: int = 0, format: str = "Snapshot",
              labels: dict[str, str] | None = None, clock: Clock = utcnow) -> Manifest:
    """Snapshot `paths` into the file `out` and commit its sidecar manifest."""
    from . import archive  # here: a restore does not pay for importing the save path

    path = os.path.abspath(os.fspath(out))
    plan = archive.scan(paths, root=root)
    if os.path.isdir(path):
        raise SourceError(f"{path} is a directory; give a file name (or use the directory as a store)")
    infos: list[archive.ArchiveInfo] = []
    _atomic_write(path, lambda sink: infos.append(archive.write(plan, sink, level=level, max_size=max_size)))
    info = infos[0]
    manifest = Manifest(seq=seq, time=clock(), archive=os.path.basename(path), size=info.size, sha256=info.sha256,
                        paths=info.paths, files=info.files, unpacked_size=info.unpacked_size, level=level,
                        format=format, attempt=attempt, epoch=epoch, labels=dict(labels or {}))
    data = manifest.to_json()
    _atomic_write(sidecar_path(path), lambda sink: sink.write(data))
    return manifest


def verify_file(path: str | os.PathLike[str], *, sha256: str | None = None,
                max_unpacked: int | None = None) -> tuple[Manifest | None, Summary]:
    """Read FILE through; compare with `sha256`, else with its sidecar manifest when there is one."""
    manifest = read_sidecar(path)
    expected = sha256 or (manifest.sha256 if manifest else None)
    with open(path, "rb") as f:
        summary = inspect(f, sha256=expected, max_unpacked=max_unpacked)
    if manifest is not None and sha256 is None and summary.size != manifest.size:
        raise DigestMismatch(f"{os.fspath(path)} is {summary.size} bytes but its manifest committed {manifest.size}")
    return manifest, summary


def restore_file(path: str | os.PathLike[str], into: str | os.PathLike[str], *, sha256: str | None = None,
                 max_size: int | None = None, max_unpacked: int | None = None,
                 archive: MappedArchive | None = None) -> tuple[Manifest | None, Summary]:
    """Restore FILE under `into`; its digest is checked first against `sha256` or the sidecar. `archive`:
    FILE already opened and being hashed (restore's `archive`, ADR 0104), owned and closed from here."""
    try:
        manifest = read_sidecar(path)
    except BaseException:
        if archive is not None:
            archive.close()
        raise
    expected = sha256 or (manifest.sha256 if manifest else None)
    size = manifest.size if manifest is not None and sha256 is None else None
    return manifest, restore(path, into, sha256=expected, size=size, max_size=max_size, max_unpacked=max_unpacked,
                             archive=archive)
