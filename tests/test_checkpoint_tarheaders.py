"""The restore's own tar header parser (checkpoint/tarheaders.py) and its pool of file writers
(checkpoint/writers.py): the parser reads what tarfile and GNU tar write exactly as tarfile does, and
refuses what tarfile let pass; the writers keep tar's order where it matters and never leave a
half-written restore behind."""
from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.checkpoint import CorruptArchive, NoSpace, inspect, restore, restore_file, save_file
from nodus.checkpoint.reader import Decompressed, members

MiB = 1 << 20


def _ours(raw: bytes) -> list[tuple[object, ...]]:
    return [(m.name, m.linkname, m.size, m.mode, m.mtime, m.type, m.issparse())
            for m in members(Decompressed(chunks=iter([memoryview(raw)])))]


def _tarfile(raw: bytes) -> list[tuple[object, ...]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:", encoding="utf-8", errors="surrogateescape") as tar:
        return [(m.name, m.linkname, m.size, m.mode, int(m.mtime), m.type, m.issparse()) for m in tar]


NAMES = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1,
                         max_size=60).filter(lambda s: s not in (".", "..")), min_size=1, max_size=4).map("/".join)
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE,
                         tarfile.CHRTYPE, b"V"])
MEMBERS = st.lists(st.tuples(NAMES, KINDS, st.binary(max_size=1500), NAMES,
                             st.integers(0, 0o7777), st.integers(0, 2 ** 33)), max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members_=MEMBERS, fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]))
def test_headers_read_as_tarfile_reads_them(members_: list[tuple[str, bytes, bytes, str, int, int]], fmt: int) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for name, kind, data, link, mode, mtime in members_:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime = kind, mode, mtime
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                ti.linkname = link
            try:
                if kind in (tarfile.REGTYPE, b"V"):
                    ti.size = len(data)
                    tar.addfile(ti, io.BytesIO(data))
                else:
                    tar.addfile(ti)
            except ValueError:
                return  # a name or number this format cannot hold: tarfile refuses to write it
    raw = buf.getvalue()
    assert _ours(raw) == _tarfile(raw)


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar", "v7"])
def test_gnu_tar_archives_read_as_tarfile_reads_them(tmp_path: Path, fmt: str) -> None:
    tree = tmp_path / "t"
    deep = tree / ("d" * 40) / ("e" * 40) / "f"
    deep.mkdir(parents=True)
    (deep / "plain").write_bytes(os.urandom(3000))
    (tree / "é-ünïcode").write_text("x")
    (tree / "link").symlink_to("d" * 40)
    if fmt in ("gnu", "pax"):  # names and targets past 100 bytes need an extension
        (deep / ("long-" * 30)).write_text("long")
        (tree / "long-link").symlink_to("../" + "t/" + "x" * 120)
        os.link(deep / "plain", tree / "hard")
    raw = subprocess.run(["tar", f"--format={fmt}", "-cf", "-", "-C", str(tmp_path), "t"], check=True,
                         capture_output=True).stdout
    theirs = _tarfile(raw)
    assert _ours(raw) == theirs and len(theirs) >= 6


def _member_bytes(ti: tarfile.TarInfo, data: bytes = b"") -> bytes:
    ti.size = len(data)
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)


def _archive(path: Path, raw: bytes) -> None:
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(raw + bytes(1024)))


def _restore_refused(tmp_path: Path, raw: bytes, match: str) -> None:
    archive = tmp_path / "bad.tar.zst"
    _archive(archive, raw)
    into = tmp_path / "into"
    into.mkdir()
    (into / "sentinel").write_text("untouched")
    with pytest.raises(CorruptArchive, match=match):
        restore(archive, into)
    assert sorted(os.listdir(into)) == ["sentinel"]
    with open(archive, "rb") as f, pytest.raises(CorruptArchive, match=match):
        inspect(f)


def test_a_bad_checksum_after_the_first_member_is_corrupt_not_the_end(tmp_path: Path) -> None:
    """tarfile ended the archive quietly at a damaged header past the first: half a restore looked whole."""
    second = bytearray(_member_bytes(tarfile.TarInfo("b"), b"second"))
    second[0:1] = b"c"  # the name changes, the checksum does not
    _restore_refused(tmp_path, _member_bytes(tarfile.TarInfo("a"), b"first") + bytes(second), "bad checksum")


def test_a_malformed_pax_record_is_corrupt(tmp_path: Path) -> None:
    record = b"99 path=x\n"  # says 99 bytes, holds 10
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    raw = _member_bytes(pax, record) + _member_bytes(tarfile.TarInfo("a"), b"data")
    _restore_refused(tmp_path, raw, "bad pax header")


def test_a_pax_size_that_is_not_a_number_is_corrupt(tmp_path: Path) -> None:
    """tarfile took such a size as 0, and the member's data as the next header."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    raw = _member_bytes(pax, b"13 size=12a4\n") + _member_bytes(tarfile.TarInfo("a"), b"data")
    _restore_refused(tmp_path, raw, "size='12a4' is not a number")


def test_a_stream_that_ends_inside_a_header_is_corrupt(tmp_path: Path) -> None:
    archive = tmp_path / "cut.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(_member_bytes(tarfile.TarInfo("a"), b"x") + bytes(100)))
    with pytest.raises(CorruptArchive, match="ends inside the tar header"):
        restore(archive, tmp_path / "into")
    assert not (tmp_path / "into").exists()


# -- the writers ------------------------------------------------------------------------------------

def _tar_zst(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in entries:
            if data is not None:
                ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(buf.getvalue()))


def _ti(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode, ti.mtime = kind, linkname, 0o640, 1_700_000_000
    return ti


def test_a_large_file_being_written_is_replaced_by_a_later_member_of_its_name(tmp_path: Path) -> None:
    big = os.urandom(9 * MiB + 7)  # written in several tasks, into a file opened by the main thread
    archive = tmp_path / "dup.tar.zst"
    _tar_zst(archive, [(_ti("x"), big), (_ti("x"), b"new"), (_ti("y"), big), (_ti("h", tarfile.LNKTYPE, "y"), None),
                       (_ti("small"), b"s" * 1000), (_ti("small"), big[:5000])])
    restore_file(archive, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "x").read_bytes() == b"new"
    assert (out / "y").read_bytes() == big and os.path.samefile(out / "y", out / "h")
    assert (out / "small").read_bytes() == big[:5000]
    assert {oct(os.stat(out / n).st_mode & 0o777) for n in ("x", "y", "small")} == {"0o640"}
    assert {int(os.stat(out / n).st_mtime) for n in ("x", "y", "small")} == {1_700_000_000}


def test_a_write_that_fails_on_a_writer_thread_leaves_the_target_as_it_was(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    for i in range(40):
        (state / f"f{i:02d}").write_bytes(os.urandom(20_000))
    (state / "big").write_bytes(os.urandom(6 * MiB))
    archive = tmp_path / "c.tar.zst"
    save_file(["state"], archive, root=tmp_path)
    into = tmp_path / "into"
    into.mkdir()
    (into / "sentinel").write_text("untouched")
    real = os.pwritev
    calls = iter(range(1_000_000))

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        if next(calls) == 25:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(NoSpace, match="no space left"):
        restore_file(archive, into)
    assert sorted(os.listdir(into)) == ["sentinel"]
    assert not {t.name for t in threading.enumerate()} - before, "a writer thread outlived the restore"
