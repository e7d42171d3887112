"""A file rewritten often, replaced atomically without making a new inode per write (ADR 0112).

`statefile.write_bytes` writes a new temp file and renames it over the target: every write allocates an
inode and frees the one it replaces. On ext4 without a journal (this project's bench VM) the allocator
skips inodes freed in the last ~30 s, reading each one's on-disk record, so under churn an inode costs
~0.3 ms of CPU, and perf put it at 14 % of the agent's samples in a many-index run.

`SwapFile` writes the temp file and exchanges it with the target (renameat2 RENAME_EXCHANGE): the
target's name points at the new content in one step, as a rename does, and the old inode stays as the
next write's temp file, truncated and rewritten then. So a file rewritten all day costs two inodes.

Truncating the temp file is safe only while no name on disk can still point the target at it. A kill -9
never matters (the kernel's view is exact); a host crash does when the exchange that made it the temp
file was not yet on disk. So the temp file is reused only after a durable write (its exchange followed by
the directory's fsync), or always where the owner rebuilds a torn file anyway (`torn_ok`: uids.json).
Otherwise it is removed and made anew, as the old write did. Where the file system cannot exchange, it
falls back to the rename.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
from pathlib import Path
from typing import Any

AT_FDCWD = -100
RENAME_EXCHANGE = 2


@functools.cache
def _renameat2() -> Any:
    """libc's renameat2 (glibc 2.28+), looked up once; None where it is missing."""
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swaps the names `a` and `b` atomically; False where the file system or libc cannot (or `b` is
    missing: then nothing changed). Raises other errors."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def fill(fd: int, data: bytes, durable: bool) -> None:
    """Writes all of `data` to the open file `fd`, fsyncs it when `durable`, and closes it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Makes the names in directory `path` durable (after a rename or an exchange in it)."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class SwapFile:
    """One file replaced atomically on each `write`; its previous inode is kept as the next temp file."""

    def __init__(self, path: Path, mode: int = 0o600, torn_ok: bool = False) -> None:
        self.path = path
        self.mode = mode
        self.torn_ok = torn_ok
        """A host crash may leave the file torn: its reader rebuilds what it held (uids.json)."""
        self.tmp = path.with_name(f".{path.name}.swap")
        self._reusable = False
        """The temp file is no name of the target on disk: it may be truncated in place. Not known at
        first (a previous process's last exchange may not be on disk), so the first write makes it anew."""
        self.inodes = 0
        """Temp files made (not reused) since this began: what the tests count."""

    def write(self, data: bytes, durable: bool = True) -> None:
        if not (self._reusable or self.torn_ok):
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.tmp, flags | os.O_EXCL, self.mode)
            self.inodes += 1
        except FileExistsError:
            fd = os.open(self.tmp, flags, self.mode)
        self._reusable = False
        fill(fd, data, durable)
        if not exchange(self.tmp, self.path):
            os.replace(self.tmp, self.path)
        if durable:
            fsync_dir(self.path.parent)
        self._reusable = durable
