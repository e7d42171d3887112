"""A store in a local directory (the agent's default; also `--out DIR`).

Layout: `<seq:010d>-<sha256[:12]>.tar.zst` and `<seq:010d>.manifest.json`, with `.tmp-*` files for
what is being written. The archive is written to a temp file, fsynced, renamed to its final name; the
manifest is written to a temp file, fsynced, and linked to its name (link(2) fails if the name exists,
so two savers of one seq cannot both commit); then the directory is fsynced.
"""
from __future__ import annotations

import errno
import os
import secrets
from datetime import datetime
from typing import BinaryIO

from ..errors import AlreadyCommitted, NoSpace, NotFound, StoreError
from ..filesink import FileSink
from ..manifest import archive_key, manifest_key, seq_of_manifest_key
from .base import Clock, Store, Upload, utcnow

TMP_PREFIX = ".tmp-"


def _os_error(e: OSError, what: str) -> Exception:
    if e.errno == errno.ENOSPC:
        return NoSpace(f"no space left on device while {what}; nothing was committed and earlier "
                       "checkpoints are intact")
    return StoreError(f"{what}: {e.strerror or e}")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _LocalUpload(Upload):
    def __init__(self, store: "LocalStore", seq: int) -> None:
        self.store = store
        self.seq = seq
        self.tmp = os.path.join(store.root, f"{TMP_PREFIX}{seq:010d}-{secrets.token_hex(6)}.tar.zst")
        try:
            self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _os_error(e, f"creating {self.tmp}") from None
        self.sink: FileSink | None = FileSink(self.fd)

    def write(self, data: bytes | memoryview, /) -> int:
        assert self.sink is not None
        try:
            return self.sink.write(data)
        except OSError as e:
            raise _os_error(e, f"writing checkpoint {self.seq} to {self.store.root}") from None

    def commit(self, sha256: str) -> str:
        assert self.fd is not None
        key = archive_key(self.seq, sha256[:12])
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.rename(self.tmp, os.path.join(self.store.root, key))
            _fsync_dir(self.store.root)
        except OSError as e:
            raise _os_error(e, f"committing the archive of checkpoint {self.seq} in {self.store.root}") from None
        return key

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike[str], *, clock: Clock = utcnow) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.url = self.root
        self.clock = clock

    def _ensure(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise _os_error(e, f"creating the store {self.root}") from None

    def begin_upload(self, seq: int, size_hint: int) -> Upload:
        self._ensure()
        return _LocalUpload(self, seq)

    def commit_manifest(self, seq: int, data: bytes) -> None:
        self._ensure()
        final = os.path.join(self.root, manifest_key(seq))
        tmp = os.path.join(self.root, f"{TMP_PREFIX}{seq:010d}-{secrets.token_hex(6)}.manifest.json")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise AlreadyCommitted(f"checkpoint {seq} is already committed in {self.root}") from None
            _fsync_dir(self.root)
        except OSError as e:
            raise _os_error(e, f"committing the manifest of checkpoint {seq} in {self.root}") from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.root)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise _os_error(e, f"listing {self.root}") from None

    def manifest_seqs(self) -> list[int]:
        return sorted(s for s in map(seq_of_manifest_key, self._names()) if s is not None)

    def read_manifest(self, seq: int) -> bytes:
        try:
            with open(os.path.join(self.root, manifest_key(seq)), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFound(f"checkpoint {seq} is not committed in {self.root}") from None
        except OSError as e:
            raise _os_error(e, f"reading checkpoint {seq} in {self.root}") from None

    def local_path(self, key: str) -> str | None:
        return os.path.join(self.root, key)

    def open_archive(self, key: str) -> BinaryIO:
        try:
            return open(os.path.join(self.root, key), "rb")
        except FileNotFoundError:
            raise NotFound(f"archive {key} is missing from {self.root}") from None

    def delete_key(self, key: str) -> None:
        try:
            os.unlink(os.path.join(self.root, key))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise _os_error(e, f"deleting {key} from {self.root}") from None

    def stale_keys(self, before: datetime) -> list[str]:
        names = self._names()
        referenced = self.referenced_archives()
        cutoff = before.timestamp()
        stale = []
        for name in names:
            leftover = name.startswith(TMP_PREFIX) or (name.endswith(".tar.zst") and name not in referenced)
            if not leftover:
                continue
            try:
                if os.lstat(os.path.join(self.root, name)).st_mtime < cutoff:
                    stale.append(name)
            except FileNotFoundError:
                continue
        return sorted(stale)

