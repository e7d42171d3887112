"""A local copy of a file or a directory tree, as `cp -a --reflink=auto SRC DST` makes it, in-process.

The agent holds a program (frozen, or at a handshake) only for this copy, so it is the pause the
program sees: the tree is walked first, then regular files are copied on a few threads, largest
first, with `copy_file_range` (no bytes through Python, the GIL released, and shared extents on
filesystems with reflinks). It keeps what a checkpoint archive records: mode bits, owner (where
allowed), atime and mtime in ns, symlinks as symlinks, hard links within the tree as hard links, and
holes of sparse files. Sockets are skipped and device files and fifos refused, as `archive.scan` does.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SourceError

CHUNK = 1 << 30
"""Bytes asked of one copy_file_range/sendfile call; the kernel copies in its own steps below it."""
BUFFER = 1 << 20
"""Read/write step of the last fallback."""
UNSUPPORTED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM})
"""Errors by which copy_file_range or sendfile say they cannot copy between these two files."""


def default_threads() -> int:
    """A few copies in flight keep the disk (or the page cache) busy while one thread waits on it."""
    return max(2, min(8, (os.cpu_count() or 1) * 2))


@dataclass(frozen=True, slots=True)
class CopyStats:
    files: int
    """Regular files copied (hard links to an earlier one not counted)."""
    bytes: int
    """Their sizes, as walked (holes included)."""
    seconds: float


@dataclass(slots=True)
class _File:
    st: os.stat_result
    names: list[tuple[str, str]]
    """(source, destination) of every name of this inode in the tree; the first that still exists is
    copied, the others become hard links to its copy."""


@dataclass(slots=True)
class _Plan:
    merge: bool
    """The destination existed: replace what is in the way, as `cp -a SRC/. DST` does."""
    dirs: list[tuple[str, os.stat_result]] = field(default_factory=list)
    """Destination directories, parents before children."""
    files: list[_File] = field(default_factory=list)
    symlinks: list[tuple[str, str, os.stat_result]] = field(default_factory=list)
    """(destination, target, stat of the source link)."""


def copy_tree(src: Path | str, dst: Path | str, *, threads: int | None = None) -> CopyStats:
    """Copies `src` (a file or a directory; a symlink is followed at the root only) to `dst`.

    `dst`'s parent must exist. An existing directory `dst` receives the contents of a directory `src`
    (merged, existing files replaced), and an existing file `dst` is replaced by a file `src`. A file
    removed from the tree between the walk and its copy is left out. Raises SourceError for a fifo or
    device file (before anything is written), and OSError naming the path for any other failure.
    `threads`: files copied at once (default_threads() when None).
    """
    started = time.monotonic()
    plan = _walk(os.path.realpath(src), os.fspath(dst))
    for d, _ in plan.dirs:
        try:
            os.mkdir(d, 0o700)  # writable until its own metadata is set, after its contents
        except FileExistsError:
            if not (plan.merge and os.path.isdir(d) and not os.path.islink(d)):
                raise
    copied = _copy_files(plan, threads or default_threads())
    for d, target, st in plan.symlinks:
        if plan.merge:
            _unlink_existing(d)
        os.symlink(target, d)
        _chown(d, st, follow=False)
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    for d, st in reversed(plan.dirs):  # children first: setting their times touches no parent
        mode = stat.S_IMODE(st.st_mode)
        if not _chown(d, st):
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
        os.chmod(d, mode)
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    return CopyStats(len(copied), sum(f.st.st_size for f in copied), time.monotonic() - started)


def _walk(src: str, dst: str) -> _Plan:
    st = os.stat(src)
    plan = _Plan(merge=os.path.lexists(dst))
    inodes: dict[tuple[int, int], _File] = {}

    def add(s: str, d: str, st: os.stat_result) -> None:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            try:
                with os.scandir(s) as it:
                    children = list(it)
            except FileNotFoundError:
                return  # vanished after it was listed: not part of this snapshot
            plan.dirs.append((d, st))
            for child in children:
                try:
                    child_st = child.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                add(child.path, os.path.join(d, child.name), child_st)
        elif stat.S_ISREG(mode):
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in inodes:
                    inodes[key].names.append((s, d))
                    return
                inodes[key] = f = _File(st, [(s, d)])
            else:
                f = _File(st, [(s, d)])
            plan.files.append(f)
        elif stat.S_ISLNK(mode):
            try:
                plan.symlinks.append((d, os.readlink(s), st))
            except FileNotFoundError:
                pass
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise SourceError(f"{s}: device files cannot be checkpointed (a restore refuses them)")
        elif stat.S_ISFIFO(mode):
            raise SourceError(f"{s}: fifos cannot be checkpointed (a restore refuses them)")
        # sockets are skipped, as tar skips them

    if stat.S_ISDIR(st.st_mode):
        add(src, dst, st)
    elif stat.S_ISREG(st.st_mode):
        plan.files.append(_File(st, [(src, dst)]))  # the root is copied whole, whatever its link count
    else:
        add(src, dst, st)
    return plan


def _copy_files(plan: _Plan, threads: int) -> list[_File]:
    """Copies the plan's files, largest first, on `threads` threads; returns those copied."""
    todo = deque(sorted(plan.files, key=lambda f: f.st.st_size, reverse=True))
    copied: list[_File] = []
    failed = threading.Event()

    def work() -> None:
        while not failed.is_set():
            try:
                f = todo.popleft()
            except IndexError:
                return
            try:
                if _copy_inode(f, plan.merge):
                    copied.append(f)
            except BaseException:
                failed.set()
                raise

    n = max(1, min(threads, len(todo)))
    if n == 1:
        work()
        return copied
    with ThreadPoolExecutor(n, thread_name_prefix="localcopy") as pool:
        for future in [pool.submit(work) for _ in range(n)]:
            future.result()
    return copied


def _copy_inode(f: _File, merge: bool) -> bool:
    """Copies the first name of `f` that still exists and hard-links the later ones to the copy."""
    for i, (s, d) in enumerate(f.names):
        try:
            sfd = os.open(s, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if merge:
                _unlink_existing(d)
            dfd = os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _copy_data(sfd, dfd, f.st)
                mode = stat.S_IMODE(f.st.st_mode)
                if not _chown(dfd, f.st):
                    mode &= ~(stat.S_ISUID | stat.S_ISGID)
                os.fchmod(dfd, mode)
                os.utime(dfd, ns=(f.st.st_atime_ns, f.st.st_mtime_ns))
            finally:
                os.close(dfd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, s, None, d) from None
        finally:
            os.close(sfd)
        for _, later in f.names[i + 1:]:
            if merge:
                _unlink_existing(later)
            os.link(d, later)
        return True
    return False


def _copy_data(sfd: int, dfd: int, st: os.stat_result) -> None:
    """Copies the data segments only where the file has holes (a sparse file stays sparse), else the
    whole file; then sets the size, which also recreates a trailing hole."""
    if st.st_blocks * 512 < st.st_size:
        try:
            end = os.lseek(sfd, 0, os.SEEK_END)
            off = os.lseek(sfd, 0, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data at all: one hole
                os.ftruncate(dfd, st.st_size)
                return
            if e.errno != errno.EINVAL:  # EINVAL: no SEEK_DATA here, copy it whole
                raise
        else:
            while off < end:
                hole = os.lseek(sfd, off, os.SEEK_HOLE)
                _copy_span(sfd, dfd, off, hole)
                try:
                    off = os.lseek(sfd, hole, os.SEEK_DATA)
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    break
            os.ftruncate(dfd, end)
            return
    _copy_span(sfd, dfd, 0, None)


def _copy_span(sfd: int, dfd: int, off: int, end: int | None) -> None:
    """Copies bytes [off, end) (to EOF where end is None) at the same offsets: copy_file_range, else
    sendfile, else read and write, each taking over where the previous one stopped."""
    method = 0
    while end is None or off < end:
        count = CHUNK if end is None else min(CHUNK, end - off)
        try:
            if method == 0:
                n = os.copy_file_range(sfd, dfd, count, off, off)
            elif method == 1:
                os.lseek(dfd, off, os.SEEK_SET)
                n = os.sendfile(dfd, sfd, off, count)
            else:
                data = os.pread(sfd, min(count, BUFFER), off)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.pwrite(dfd, view, off + n - len(view)):]
        except OSError as e:
            if method < 2 and e.errno in UNSUPPORTED:
                method += 1
                continue
            raise
        if n == 0:
            return  # the file is shorter than walked: copy what there is
        off += n


def _chown(path: str | int, st: os.stat_result, *, follow: bool = True) -> bool:
    """Gives the copy the source's owner; False where that is not allowed (not root), as cp -a
    tolerates it."""
    try:
        if isinstance(path, int):
            os.fchown(path, st.st_uid, st.st_gid)
        else:
            os.chown(path, st.st_uid, st.st_gid, follow_symlinks=follow)
    except PermissionError:
        return False
    return True


def _unlink_existing(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
