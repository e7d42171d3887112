"""Writing a checkpoint archive: the saved paths as one tar stream, cut into independent zstd frames.

The stream goes straight to a sink (a store's upload), never to a local copy first. sha256 and the
size are computed on the compressed bytes as they pass, and `max_size` is enforced there too, so an
over-size save fails while it streams, before its upload can complete.

Member names follow tar: an absolute path loses its leading `/` (`/nodus/state` → `nodus/state`), a
relative one is taken from `root` (tar's `-C`), so a restore into DIR recreates each path under DIR as
`tar -C DIR -x` would. The roots themselves are followed when they are symlinks (the state, not a
link to it, is what is wanted); symlinks below them are stored as symlinks.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import tarfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generator, Iterable, Iterator, Protocol

from .errors import ArchiveTooLarge, CheckpointError, SourceError, UnsafeArchive
from .frames import DEFAULT_LEVEL as DEFAULT_LEVEL  # re-exported: callers name it archive.DEFAULT_LEVEL
from .frames import FRAME, Encoder
from .members import check_symlink

CHUNK = FRAME
"""Read and write granularity: large enough that per-call overhead (and the GIL's hand-offs between
the stages) vanishes next to the copy, even on a loaded machine."""


class Sink(Protocol):
    """Where compressed bytes go (a store's upload); `write` may raise to stop the save."""

    def write(self, data: bytes | memoryview, /) -> object: ...


@dataclass(frozen=True, slots=True)
class Entry:
    """One member to write: where it is on disk, what it is called in the archive, what it is."""

    path: str
    name: str
    st: os.stat_result
    hardlink_to: str = ""
    """For the second and later names of one inode: the member name it was first written under."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a save will write, known before any byte is compressed (the S3 part size depends on it)."""

    entries: tuple[Entry, ...]
    paths: tuple[str, ...]
    """Member names of the saved roots (`nodus/state`), as recorded in the manifest."""
    unpacked_size: int
    """Bytes of regular-file content."""

    @property
    def files(self) -> int:
        """Members that are not directories (regular files, symlinks, hardlinks)."""
        return sum(1 for e in self.entries if not stat.S_ISDIR(e.st.st_mode))

    @property
    def size_hint(self) -> int:
        """An upper bound of the archive's size in practice: content plus tar headers; zstd
        rarely adds more than 0.01 % to incompressible data, far less than the headers budgeted."""
        return self.unpacked_size + 1536 * (len(self.entries) + 2) + (self.unpacked_size >> 10)


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    """What a finished archive is: the manifest copies these."""

    size: int
    sha256: str
    files: int
    unpacked_size: int
    paths: tuple[str, ...]


def member_name(path: str) -> str:
    """tar's name for a path given on the command line: no leading `/`, no leading `../`, normalized."""
    name = posixpath.normpath(path.replace(os.sep, "/")).lstrip("/")
    parts = name.split("/")
    while parts and parts[0] in ("..", "."):
        parts.pop(0)
    return "/".join(parts)


def scan(paths: Iterable[str | os.PathLike[str]], *, root: str | os.PathLike[str] | None = None) -> Plan:
    """Walk the paths (relative ones from `root`, default the working directory) into a Plan.

    Refuses, before anything is written, what a restore would refuse: device files, fifos, symlinks
    whose target leaves the archive. Sockets are skipped, as tar skips them.
    """
    base = os.fspath(root) if root is not None else os.getcwd()
    entries: list[Entry] = []
    names: set[str] = set()
    roots: list[str] = []
    inodes: dict[tuple[int, int], str] = {}
    unpacked = 0

    def add(path: str, name: str, st: os.stat_result) -> bool:
        nonlocal unpacked
        if name in names:
            return False
        mode = st.st_mode
        if stat.S_ISSOCK(mode):
            return False
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise SourceError(f"{path}: device files cannot be checkpointed (a restore refuses them)")
        if stat.S_ISFIFO(mode):
            raise SourceError(f"{path}: fifos cannot be checkpointed (a restore refuses them)")
        link = ""
        if stat.S_ISLNK(mode):
            target = os.readlink(path)
            try:
                check_symlink(name, target)
            except UnsafeArchive as e:
                raise SourceError(f"{path}: {e.reason}; a restore would refuse it "
                                  "(make the link relative and inside the saved paths)") from None
        elif stat.S_ISREG(mode):
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                link = inodes.get(key, "")
                if not link:
                    inodes[key] = name
            if not link:
                unpacked += st.st_size
        names.add(name)
        entries.append(Entry(path, name, st, link))
        return True

    def walk(path: str, name: str) -> None:
        try:
            with os.scandir(path) as it:
                children = sorted(it, key=lambda d: d.name)
        except OSError as e:
            raise SourceError(f"{path}: {e.strerror}") from None
        for child in children:
            child_name = f"{name}/{child.name}" if name else child.name
            try:
                st = child.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # vanished between listing and stat: it is not part of this snapshot
            if add(child.path, child_name, st) and stat.S_ISDIR(st.st_mode):
                walk(child.path, child_name)

    for raw in paths:
        given = os.fspath(raw)
        path = given if os.path.isabs(given) else os.path.join(base, given)
        name = member_name(given)
        try:
            st = os.stat(path)
        except OSError as e:
            raise SourceError(f"{given}: {e.strerror}") from None
        roots.append(name or ".")
        if name:
            added = add(path, name, st)
        else:
            added = True  # `.` or `/`: its contents go straight under the target, like `tar -C DIR .`
        if added and stat.S_ISDIR(st.st_mode):
            walk(path, name)
    return Plan(tuple(entries), tuple(roots), unpacked)


class _Digest:
    """Counts the compressed bytes (stopping the save past max_size at once), hashes them and hands
    them to the sink, on the thread that runs the save: zstd's frames are made on the pool's threads
    meanwhile, so one more thread would only add hand-offs."""

    def __init__(self, sink: Sink, max_size: int | None) -> None:
        self.sink = sink
        self.max_size = max_size
        self.size = 0
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> int:
        n = len(data)
        self.size += n
        if self.max_size is not None and self.size > self.max_size:
            raise ArchiveTooLarge(f"the archive passed maxSize ({self.max_size} bytes) after {self.size} "
                                  "compressed bytes; nothing was committed (raise maxSize or save less)")
        self.sha.update(data)
        self.sink.write(data)
        return n


def _header(e: Entry, owner: tuple[int, int] | None = None) -> bytes:
    st = e.st
    info = tarfile.TarInfo(e.name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = owner if owner is not None else (st.st_uid, st.st_gid)
    info.mtime = int(st.st_mtime)
    if e.hardlink_to:
        info.type, info.linkname = tarfile.LNKTYPE, e.hardlink_to
    elif stat.S_ISREG(st.st_mode):
        info.type, info.size = tarfile.REGTYPE, st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(e.path)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class _Cutter:
    """Fills FRAME-sized buffers with the tar stream: file contents are read straight into them
    (one read per file or per buffer, no copy), headers copied in; zero padding is only skipped,
    the buffers being zeroed when made."""

    def __init__(self) -> None:
        self.buf = bytearray(FRAME)
        self.pos = 0
        self.full: list[bytearray] = []

    def room(self) -> memoryview:
        return memoryview(self.buf)[self.pos:]

    def advance(self, n: int) -> None:
        self.pos += n
        if self.pos == FRAME:
            self.full.append(self.buf)
            self.buf = bytearray(FRAME)
            self.pos = 0

    def put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.room()
            n = min(len(view), len(room))
            room[:n] = view[:n]
            view = view[n:]
            self.advance(n)

    def skip(self, n: int) -> None:
        while n:
            k = min(n, FRAME - self.pos)
            self.advance(k)
            n -= k

    def take(self) -> list[bytearray]:
        full, self.full = self.full, []
        return full


def _read_into(e: Entry, cut: _Cutter) -> Iterator[bytearray]:
    """The file's first st_size bytes and the tar padding (growth is ignored, as tar does; shrinking
    is an error: the archive would be wrong)."""
    remaining = e.st.st_size
    try:
        fd = os.open(e.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise SourceError(f"{e.path}: vanished while being saved") from None
    except OSError as err:
        raise SourceError(f"{e.path}: {err.strerror}") from None
    try:
        while remaining:
            room = cut.room()
            n = os.readv(fd, [room[:min(remaining, len(room))]])
            room.release()
            if not n:
                raise SourceError(f"{e.path}: shrank while being saved ({remaining} bytes missing); "
                                  "pause the writer or checkpoint at a consistent point")
            remaining -= n
            cut.advance(n)
            yield from cut.take()
    finally:
        os.close(fd)
    cut.skip(-e.st.st_size % tarfile.BLOCKSIZE)


def _pieces(plan: Plan, owner: tuple[int, int] | None = None) -> Generator[bytes | bytearray | memoryview, None, None]:
    """The tar stream in FRAME-sized pieces (the last one shorter), each to become one zstd frame."""
    cut = _Cutter()
    for e in plan.entries:
        cut.put(_header(e, owner))
        if stat.S_ISREG(e.st.st_mode) and not e.hardlink_to:
            yield from _read_into(e, cut)
        yield from cut.take()
    cut.skip(2 * tarfile.BLOCKSIZE)  # end of archive: two zero blocks
    yield from cut.take()
    if cut.pos:
        yield memoryview(cut.buf)[:cut.pos]


def write(plan: Plan, sink: Sink, *, level: int = DEFAULT_LEVEL, max_size: int | None = None,
          threads: int = -1, owner: tuple[int, int] | None = None) -> ArchiveInfo:
    """Stream the plan into `sink` as tar.zst. Raises ArchiveTooLarge past max_size, SourceError for
    the paths, and the sink's own errors (the caller aborts the upload). `owner` (uid, gid) replaces
    every member's owner: an archive of the same tree is then the same bytes whoever made it.

    The calling thread reads the tar stream in FRAME-sized pieces and hands each to a pool of
    `threads` workers (default: one per CPU), which encode it as frames of its own (frames.Encoder:
    stored, level 1 or `level`, by samples); it hashes and writes the frames to the sink in order
    while the workers encode the next pieces."""
    if not 1 <= level <= 22:
        raise CheckpointError(f"zstd level {level} is outside 1..22")
    workers = threads if threads > 0 else (os.cpu_count() or 1)
    digest = _Digest(sink, max_size)
    encoder = Encoder(level)
    pieces = _pieces(plan, owner)
    pending: deque[Future[bytes]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="checkpoint-zstd") as pool:
        try:
            for piece in pieces:
                pending.append(pool.submit(encoder.encode, piece))
                if len(pending) > workers:
                    digest.write(pending.popleft().result())
            while pending:
                digest.write(pending.popleft().result())
        finally:
            for f in pending:
                f.cancel()
            pieces.close()
    return ArchiveInfo(digest.size, digest.sha.hexdigest(), plan.files, plan.unpacked_size, plan.paths)
