"""Tar headers read straight from the decompressed stream: ustar, pax and GNU long names, nothing more.

`tarfile` spent more of a restore's main thread on each header (a TarInfo, thirteen fields decoded,
its bookkeeping) than the kernel needs to create the file; this reads only what a restore uses
(name, link, size, mode, mtime, type) and is stricter where `tarfile` shrugs:
  - a header whose checksum is wrong, or whose number fields are not numbers, is a CorruptArchive
    wherever it is (tarfile ends the archive there quietly after the first member);
  - a pax record that is not `LEN key=value\\n`, or a pax size or mtime that is not a number, is a
    CorruptArchive (tarfile takes 0);
  - the archive ends at the first zero block, or at the end of the stream on a block boundary; a
    stream that ends inside a header, or inside a member's data, is a CorruptArchive.
What the member *is* is judged by restore's rules (`restore._Rules`), not here: devices, fifos,
sparse members (GNU `S`, pax `GNU.sparse.*`) and unknown types are handed on so the rules can refuse
them by name, exactly as before. Names and values decode as UTF-8 with surrogateescape, as before.
"""
from __future__ import annotations

from typing import Iterator, Protocol

from .errors import CorruptArchive

BLOCK = 512
_REGULAR = (b"0", b"\0", b"7", b"S")
"""Types whose data follows the header (tarfile's REGULAR_TYPES)."""
_KNOWN = (b"0", b"\0", b"7", b"S", b"1", b"2", b"3", b"4", b"5", b"6")
_PAX = (b"x", b"X")
_PAX_GLOBAL = b"g"
_LONGNAME, _LONGLINK = b"L", b"K"
MAX_EXTENDED = 8 << 20
"""Largest pax or long-name header read (a path is at most a few KiB; this bounds what a hostile one costs)."""


class Stream(Protocol):
    """What the parser needs of the decompressed stream (reader.Decompressed)."""

    def read(self, n: int = -1) -> bytes: ...

    def tell(self) -> int: ...

    def seek(self, offset: int, whence: int = 0) -> int: ...


class Member:
    """One archive member, with tarfile.TarInfo's names for what a restore reads."""

    __slots__ = ("name", "linkname", "size", "mode", "mtime", "type", "sparse")

    def __init__(self, name: str, linkname: str, size: int, mode: int, mtime: int, type: bytes) -> None:
        self.name = name
        self.linkname = linkname
        self.size = size
        self.mode = mode
        self.mtime = mtime
        self.type = type
        self.sparse = type == b"S"

    def isreg(self) -> bool:
        return self.type in _REGULAR

    def isdir(self) -> bool:
        return self.type == b"5"

    def issym(self) -> bool:
        return self.type == b"2"

    def islnk(self) -> bool:
        return self.type == b"1"

    def ischr(self) -> bool:
        return self.type == b"3"

    def isblk(self) -> bool:
        return self.type == b"4"

    def isfifo(self) -> bool:
        return self.type == b"6"

    def issparse(self) -> bool:
        return self.sparse

    def has_data(self) -> bool:
        """Whether `size` bytes of data (padded to a block) follow the header, as tarfile reads it."""
        return self.type in _REGULAR or self.type not in _KNOWN


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _text(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes, at: int) -> int:
    if field[0] in (0o200, 0o377):  # GNU base-256
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0o377 else n
    end = field.find(b"\0")
    digits = (field if end < 0 else field[:end]).strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise CorruptArchive(f"bad tar header at byte {at}: a number field holds {bytes(digits)!r}") from None


def _checksum_ok(block: bytes) -> bool:
    stored = _number(block[148:156], 0)
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    if stored == unsigned:
        return True
    high = sum(1 for b in block[:148] if b > 127) + sum(1 for b in block[156:] if b > 127)
    return stored == unsigned - 256 * high  # some tars sum signed chars (tarfile accepts both)


def _pax_records(data: bytes, at: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        length = int(data[pos:space]) if space > pos and data[pos:space].isdigit() else 0
        record = data[pos:pos + length]
        eq = record.find(b"=", space - pos)
        if length <= 0 or len(record) != length or not record.endswith(b"\n") or eq < 0:
            if not data[pos:].strip(b"\0"):
                break  # the zero padding after the last record
            raise CorruptArchive(f"bad pax header at byte {at}: record {bytes(data[pos:pos + 40])!r} is not "
                                 "'LENGTH keyword=value'")
        key = record[space - pos + 1:eq].decode("utf-8", "surrogateescape")
        records[key] = record[eq + 1:-1].decode("utf-8", "surrogateescape")
        pos += length
    return records


def _pax_int(records: dict[str, str], key: str, at: int, *, real: bool = False) -> int | None:
    value = records.get(key)
    if value is None:
        return None
    try:
        return int(float(value)) if real else int(value)
    except (ValueError, OverflowError):
        raise CorruptArchive(f"bad pax header at byte {at}: {key}={value!r} is not a number") from None


def members(stream: Stream) -> Iterator[Member]:
    """The members in archive order. The caller reads (or not) up to `size` bytes of each member's
    data before asking for the next; the rest of it and its padding are skipped here."""
    globals_: dict[str, str] = {}
    next_header = 0
    first = True
    while True:
        if stream.seek(next_header) != next_header:
            raise CorruptArchive(f"the archive ends inside a member's data (at byte {stream.tell()} of the tar "
                                 f"stream, {next_header} expected)")
        # Headers that describe the next one (pax, GNU long names), outermost first; the outermost wins.
        overrides: list[tuple[bytes, str | dict[str, str]]] = []
        while True:
            at = stream.tell()
            block = stream.read(BLOCK)
            if not block and not overrides:
                if first:
                    raise CorruptArchive("not a tar stream: empty file")
                return  # ended on a block boundary without the end-of-archive blocks: tar reads it so too
            if len(block) != BLOCK:
                raise CorruptArchive(f"the archive ends inside the tar header at byte {at}")
            if block.count(0) == BLOCK:
                if overrides:
                    raise CorruptArchive(f"bad tar header at byte {at}: the archive ends after an extended header")
                return
            if not _checksum_ok(block):
                raise CorruptArchive(("not a tar stream" if first else f"bad tar header at byte {at}") + ": bad checksum")
            first = False
            kind = block[156:157]
            size = _number(block[124:136], at)
            if size < 0:
                raise CorruptArchive(f"bad tar header at byte {at}: negative size {size}")
            if not (kind in _PAX or kind == _PAX_GLOBAL or kind in (_LONGNAME, _LONGLINK)):
                break
            if size > MAX_EXTENDED:
                raise CorruptArchive(f"bad tar header at byte {at}: an extended header of {size} bytes "
                                     f"(more than {MAX_EXTENDED})")
            data = stream.read(_padded(size))
            if len(data) < size:
                raise CorruptArchive(f"the archive ends inside the extended header at byte {at}")
            data = data[:size]
            if kind == _PAX_GLOBAL:
                globals_.update(_pax_records(data, at))
            elif kind in _PAX:
                overrides.append((kind, _pax_records(data, at)))
            else:
                overrides.append((kind, _text(data)))
        member = _member(block, kind, size, at)
        _apply_pax(member, globals_, at)
        for over_kind, value in reversed(overrides):  # the innermost first, so the outermost wins
            if isinstance(value, dict):
                _apply_pax(member, value, at)
            elif over_kind == _LONGNAME:
                member.name = value
            else:
                member.linkname = value
        if member.isdir():
            member.name = member.name.rstrip("/")
        next_header = stream.tell() + (_padded(member.size) if member.has_data() else 0)
        yield member


def _member(block: bytes, kind: bytes, size: int, at: int) -> Member:
    name = _text(block[0:100])
    prefix = _text(block[345:500]) if kind not in (b"S", _LONGNAME, _LONGLINK) else ""
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"  # old tars: a directory is a plain file whose name ends in /
    if kind == b"5":
        name = name.rstrip("/")
    if prefix:
        name = prefix + "/" + name
    return Member(name, _text(block[157:257]), size, _number(block[100:108], at), _number(block[136:148], at), kind)


def _apply_pax(member: Member, pax: dict[str, str], at: int) -> None:
    if not pax:
        return
    if any(key.startswith("GNU.sparse.") for key in pax):
        member.sparse = True
    if "path" in pax:
        member.name = pax["path"].rstrip("/")
    if "linkpath" in pax:
        member.linkname = pax["linkpath"]
    size = _pax_int(pax, "size", at)
    if size is not None:
        if size < 0:
            raise CorruptArchive(f"bad pax header at byte {at}: negative size {size}")
        member.size = size
    mtime = _pax_int(pax, "mtime", at, real=True)
    if mtime is not None:
        member.mtime = mtime
