"""Restoring an archive into a directory, and checking one without extracting it.

The order is what makes a restore safe:

1. the archive's size is checked against maxSize and against what the manifest committed, before
   any byte is read;
2. members are extracted into a staging directory inside the target, each one checked first
   (no absolute path, no `..`, no link that leaves the target, no device or fifo, nothing written
   through a symlink, the unpacked total within bounds), while the archive's sha256 is computed on
   a thread of its own over the same mapped bytes (one pass, not two: ADR 0053); a refusal or a
   digest other than the committed one removes the staging directory, so the target is left as
   it was;
3. only then, the digest matching, is the staging tree moved into the target, entry by entry
   (renames on one filesystem), replacing what the archive replaces, as `tar -C DIR -x` would.

Modes keep their permission bits (setuid, setgid and sticky are dropped); mtimes are restored to the
second; ownership is not restored (the restoring process owns what it writes).
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat

from .errors import ArchiveTooLarge, CheckpointError, CorruptArchive, DigestMismatch, NoSpace, UnsafeArchive
from .mapped import MappedArchive
from .members import check_hardlink, check_symlink, normalize_name, under_symlink

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing before the digest has started (ADR 0104)
if TYPE_CHECKING:  # imported where used: zstd, the tar reader and the lanes load after the digest has started
    from typing import BinaryIO

    from .reader import Decompressed
    from .tarheaders import Member
    from .writers import Writers

STAGING_PREFIX = ".nodus-restore-"
WRITERS = 4
"""Lanes (threads) that create and write the restored files (writers.py): a directory's small files on one
lane, each large file on the next lane in turn, side by side while the main thread parses (ADR 0063, 0081)."""
LARGE = 4 << 20
"""Files above this are written in tasks of this size; smaller ones are one task each (frames.FRAME: a
task is about one decoded frame)."""
CHUNK = 4 << 20
"""reader.CHUNK: reads of the compressed stream when it is not mapped."""


class Summary:
    """What an archive holds, as found by reading it through. (A plain class: the restore path does
    not import dataclasses, ADR 0081.)"""

    __slots__ = ("size", "sha256", "files", "dirs", "unpacked_size")

    def __init__(self, size: int = 0, sha256: str = "", files: int = 0, dirs: int = 0, unpacked_size: int = 0) -> None:
        self.size = size
        """Compressed bytes."""
        self.sha256 = sha256
        self.files = files
        """Members that are not directories."""
        self.dirs = dirs
        self.unpacked_size = unpacked_size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Summary):
            return NotImplemented
        return (self.size, self.sha256, self.files, self.dirs, self.unpacked_size) == \
            (other.size, other.sha256, other.files, other.dirs, other.unpacked_size)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        return (f"Summary(size={self.size}, sha256={self.sha256!r}, files={self.files}, dirs={self.dirs}, "
                f"unpacked_size={self.unpacked_size})")


def verify_digest(path: str | os.PathLike[str], *, sha256: str | None, size: int | None = None,
                  max_size: int | None = None) -> str:
    """First pass: refuse an oversize archive, then compare size and sha256 with the committed ones.
    Returns the computed sha256."""
    actual = os.stat(path).st_size
    if max_size is not None and actual > max_size:
        raise ArchiveTooLarge(f"{os.fspath(path)} is {actual} bytes, larger than maxSize ({max_size} bytes); "
                              "nothing was extracted")
    if size is not None and actual != size:
        raise DigestMismatch(f"{os.fspath(path)} is {actual} bytes but its manifest committed {size}; "
                             "nothing was extracted")
    h = hashlib.sha256()
    if actual:
        with open(path, "rb", buffering=0) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)  # hashed in place: no copy out of the page cache
            try:
                for start in range(0, actual, 16 * CHUNK):
                    h.update(view[start:start + 16 * CHUNK])
            finally:
                view.release()
    digest = h.hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise DigestMismatch(f"{os.fspath(path)} has sha256 {digest} but its manifest committed {sha256}; "
                             "nothing was extracted")
    return digest


class _Rules:
    """Checks each member in order, remembering what earlier members made (symlinks, files)."""

    def __init__(self, max_unpacked: int | None) -> None:
        self.max_unpacked = max_unpacked
        self.unpacked = 0
        self.symlinks: set[str] = set()
        self.regular: set[str] = set()

    def check(self, m: Member) -> str:
        name = normalize_name(m.name)
        through = under_symlink(name, self.symlinks)
        if through is not None:
            raise UnsafeArchive(m.name, f"its parent {through} is a symlink (writing through links is refused)")
        if m.ischr() or m.isblk():
            raise UnsafeArchive(m.name, "device file")
        if m.isfifo():
            raise UnsafeArchive(m.name, "fifo")
        if m.issparse():
            raise UnsafeArchive(m.name, "sparse members are not supported")
        if not name and not m.isdir():
            raise UnsafeArchive(m.name, "would replace the target directory itself")
        if m.issym():
            check_symlink(name, m.linkname)
        elif m.islnk():
            source = check_hardlink(name, m.linkname)
            if source not in self.regular:
                raise UnsafeArchive(m.name, f"hardlink to {m.linkname}, which is not a file earlier in the archive")
        elif not (m.isreg() or m.isdir()):
            raise UnsafeArchive(m.name, f"unsupported member type {m.type!r}")
        if m.isreg():
            self.unpacked += m.size
            if self.max_unpacked is not None and self.unpacked > self.max_unpacked:
                raise ArchiveTooLarge(f"the archive unpacks to more than {self.max_unpacked} bytes "
                                      f"(refused at member {m.name!r}); nothing was extracted")
        self.symlinks.discard(name)
        self.regular.discard(name)
        if m.issym():
            self.symlinks.add(name)
        elif m.isreg():
            self.regular.add(name)
        return name


def inspect(source: BinaryIO, *, sha256: str | None = None, max_size: int | None = None,
            max_unpacked: int | None = None) -> Summary:
    """Read an archive through without extracting: every member checked, zstd's checksum and the
    sha256 compared. What `nodus checkpoint verify` does."""
    from .reader import Decompressed, HashingReader, members

    raw = HashingReader(source, max_size)
    stream = Decompressed(raw)
    rules = _Rules(max_unpacked)
    out = Summary()
    try:
        for m in members(stream):
            name = rules.check(m)
            _count(out, m, name)
            if m.isreg():
                stream.seek(stream.tell() + m.size)
        stream.drain()
    except (CorruptArchive, UnsafeArchive) as e:
        stream.close()
        if sha256 is not None:  # a damaged or foreign archive: say first that it is not the committed one
            while raw.read(CHUNK):
                pass
            if raw.sha.hexdigest() != sha256.lower():
                raise DigestMismatch(f"the archive has sha256 {raw.sha.hexdigest()} but its manifest committed "
                                     f"{sha256} ({e})") from e
        raise
    finally:
        stream.close()
    while raw.read(CHUNK):
        pass  # bytes after the frame still belong to the digest
    out.size, out.sha256 = raw.size, raw.sha.hexdigest()
    if sha256 is not None and out.sha256 != sha256.lower():
        raise DigestMismatch(f"the archive has sha256 {out.sha256} but its manifest committed {sha256}")
    return out


def _count(out: Summary, m: Member, name: str) -> None:
    if m.isdir():
        out.dirs += 1 if name else 0
    else:
        out.files += 1
    if m.isreg():
        out.unpacked_size += m.size


def _check_size(path: str | os.PathLike[str], size: int | None, max_size: int | None,
                actual: int | None = None) -> int:
    """Refusals that need no byte of the archive: larger than max_size, not the committed size. `actual`
    is the size of what is mapped, when it is; else the file's."""
    if actual is None:
        actual = os.stat(path).st_size
    if max_size is not None and actual > max_size:
        raise ArchiveTooLarge(f"{os.fspath(path)} is {actual} bytes, larger than maxSize ({max_size} bytes); "
                              "nothing was extracted")
    if size is not None and actual != size:
        raise DigestMismatch(f"{os.fspath(path)} is {actual} bytes but its manifest committed {size}; "
                             "nothing was extracted")
    return actual


def restore(path: str | os.PathLike[str], into: str | os.PathLike[str], *, sha256: str | None = None,
            size: int | None = None, max_size: int | None = None, max_unpacked: int | None = None,
            archive: MappedArchive | None = None) -> Summary:
    """Extract `path` under `into` (created if needed), its sha256 (when given) checked in the same pass.

    The archive is read once: mapped, hashed on one thread while its frames are decoded on others
    and its members written into a staging directory inside the target. Only once the digest
    matches does anything move from staging into the target; a mismatch, or any refusal, removes
    the staging directory and leaves the target as it was.

    `archive`, when given, is `path` already opened and being hashed (`nodus checkpoint restore`
    starts that before its imports, ADR 0104); the restore owns it from here and closes it."""
    try:
        if archive is None:
            _check_size(path, size, max_size)  # before any byte is read
            try:
                archive = MappedArchive(path)
            except OSError as e:
                raise _os_error(e, os.fspath(into)) from None
        actual = _check_size(path, size, max_size, archive.size)  # what is mapped is what counts
        target = os.fspath(into)
        created = not os.path.lexists(target)
        try:
            os.makedirs(target, exist_ok=True)
            staging = _staging_dir(target)
        except OSError as e:
            raise _os_error(e, target) from None
    except BaseException:
        if archive is not None:
            archive.close()
        raise
    done = False
    try:
        with archive:
            try:
                out, dirs = _extract(archive.view, staging, max_unpacked)
            except (CorruptArchive, UnsafeArchive, ArchiveTooLarge) as e:
                _compare(path, sha256, archive.digest(), e)  # a damaged or foreign archive: say that first
                raise
            digest = archive.digest()
            _compare(path, sha256, digest, None)
        out.size, out.sha256 = actual, digest
        _merge_all(staging, target)
        for name, mode, mtime in sorted(dirs, key=lambda d: d[0].count("/"), reverse=True):
            dest = os.path.join(target, name)
            if os.path.isdir(dest) and not os.path.islink(dest):
                os.chmod(dest, mode)
                os.utime(dest, (mtime, mtime))
        done = True
        return out
    except OSError as e:
        raise _os_error(e, target) from None
    finally:
        _remove_staging(staging)
        if created and not done:
            try:
                os.rmdir(target)  # a refused restore leaves no trace, not even the directory it made
            except OSError:
                pass


def _staging_dir(target: str) -> str:
    """A new directory of our own inside target (tempfile.mkdtemp's way, without importing tempfile)."""
    while True:
        staging = os.path.join(target, STAGING_PREFIX + os.urandom(6).hex())
        try:
            os.mkdir(staging, 0o700)
            return staging
        except FileExistsError:
            continue


def _remove_staging(staging: str) -> None:
    try:
        os.rmdir(staging)  # after a restore it is empty: everything moved into the target
    except FileNotFoundError:
        pass
    except OSError:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)


def _compare(path: str | os.PathLike[str], sha256: str | None, digest: str, cause: Exception | None) -> None:
    if sha256 is not None and digest != sha256.lower():
        raise DigestMismatch(f"{os.fspath(path)} has sha256 {digest} but its manifest committed {sha256}; "
                             "nothing was extracted") from cause


def _os_error(e: OSError, target: str) -> CheckpointError:
    if e.errno == errno.ENOSPC:
        return NoSpace(f"no space left on device while restoring into {target}; the target was not changed "
                       "by this restore except for entries already moved into place")
    return CheckpointError(f"restore into {target} failed: {e}")


def _rmtree(path: str) -> None:
    import shutil  # here, not at the top: a restore that replaces no directory never needs it

    shutil.rmtree(path)


def _remove(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        _rmtree(path)
    else:
        os.unlink(path)


def _extract(buf: memoryview, staging: str, max_unpacked: int | None) -> tuple[Summary, list[tuple[str, int, int]]]:
    from .reader import Decompressed, members
    from .writers import Writers

    stream = Decompressed.of_buffer(buf)
    writers = Writers(WRITERS)
    rules = _Rules(max_unpacked)
    out = Summary()
    dirs: list[tuple[str, int, int]] = []
    made_dirs: set[str] = {""}  # what exists in staging, which only this loop writes: no stat per member
    made_other: set[str] = set()
    try:
        for m in members(stream):
            name = rules.check(m)
            _count(out, m, name)
            if not name:
                continue  # `./` itself: the target's own mode is left alone
            dest = os.path.join(staging, name)
            parent = name.rpartition("/")[0]
            if parent not in made_dirs:
                if parent in made_other:
                    writers.drain()  # the file being replaced by a directory is written first
                    _remove(os.path.join(staging, parent))
                    made_other.discard(parent)
                os.makedirs(os.path.join(staging, parent), exist_ok=True)  # not in the archive: umask's mode, as tar
                while parent and parent not in made_dirs:
                    made_dirs.add(parent)
                    parent = parent.rpartition("/")[0]
            mode = stat.S_IMODE(m.mode) & 0o777
            mtime = int(m.mtime)
            if m.isdir():
                if name in made_other:
                    writers.drain()
                    _remove(dest)
                    made_other.discard(name)
                if name not in made_dirs:
                    os.mkdir(dest, 0o700)
                    made_dirs.add(name)
                dirs.append((name, mode, mtime))
                continue
            if name in made_dirs or name in made_other:  # a later member of the same name wins, as in tar
                writers.drain()
                _remove(dest)
                made_dirs.discard(name)
                made_dirs.difference_update({d for d in made_dirs if d.startswith(name + "/")})
            made_other.add(name)
            if m.issym():
                os.symlink(m.linkname, dest)
                os.utime(dest, (mtime, mtime), follow_symlinks=False)
            elif m.islnk():
                writers.drain()  # the file linked to is complete
                os.link(os.path.join(staging, normalize_name(m.linkname)), dest, follow_symlinks=False)
            else:
                _write_file(stream, writers, dest, m.size, mode, mtime, m.name)
        stream.drain()
        writers.drain()
    finally:
        writers.close()
        stream.close()
    return out, dirs


def _write_file(stream: Decompressed, writers: Writers, dest: str, size: int, mode: int, mtime: int,
                member: str) -> None:
    """Hand the member's bytes (views of the decoded stream) to the writers: whole when small, in
    LARGE-sized tasks when large."""
    if size <= LARGE:
        writers.small(dest, _take(stream, size, size, member), size, mode, mtime)
        return
    writers.open_large(dest, mode, mtime)
    offset = 0
    while offset < size:
        n = min(size - offset, LARGE)
        writers.piece(_take(stream, n, size - offset, member), offset, n)
        offset += n
    writers.end_large()


def _take(stream: Decompressed, n: int, missing: int, member: str) -> list[memoryview]:
    """The next n bytes of the stream as views; `missing` is what the member still lacks, for the error."""
    pieces = []
    while n:
        piece = stream.view(n)
        if not piece:
            raise CorruptArchive(f"the archive ends inside {member!r} ({missing} bytes missing)")
        pieces.append(piece)
        n -= len(piece)
        missing -= len(piece)
    return pieces


def _merge_all(staging: str, target: str) -> None:
    with os.scandir(staging) as it:
        names = [e.name for e in it]
    for name in names:
        _merge(os.path.join(staging, name), os.path.join(target, name))


def _merge(src: str, dst: str) -> None:
    """Move src to dst. Directories merge; anything else replaces. Never follows a symlink at dst."""
    try:
        dst_st = os.lstat(dst)
    except FileNotFoundError:
        os.rename(src, dst)
        return
    src_is_dir = stat.S_ISDIR(os.lstat(src).st_mode)
    if src_is_dir and stat.S_ISDIR(dst_st.st_mode):
        with os.scandir(src) as it:
            names = [e.name for e in it]
        for name in names:
            _merge(os.path.join(src, name), os.path.join(dst, name))
        return
    if stat.S_ISDIR(dst_st.st_mode):
        _rmtree(dst)
    elif src_is_dir:
        os.unlink(dst)
    os.rename(src, dst)  # replaces a file or symlink at dst atomically
