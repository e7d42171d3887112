"""Every archive shape a restore refuses, crafted by hand with tarfile + zstandard; the digest checked
before anything is extracted; maxSize refused with a clear reason and nothing committed.

Each refusal must leave the target exactly as it was (a sentinel file, nothing else), and `verify`
must refuse the same archive without extracting it.
"""
from __future__ import annotations

import hashlib
import importlib
import io
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from nodus.checkpoint import (ArchiveTooLarge, CorruptArchive, DigestMismatch, LocalStore, UnsafeArchive, inspect,
                              restore, restore_file, save_file)

restore_module = importlib.import_module("nodus.checkpoint.restore")  # the package's `restore` is the function


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size, ti.linkname, ti.mode, ti.mtime = kind, size, linkname, mode, 1_700_000_000
    return ti


def craft(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> str:
    """Write members as a tar.zst exactly as given (no sanitizing); returns the archive's sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    blob = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(buf.getvalue())
    path.write_bytes(blob)
    return hashlib.sha256(blob).hexdigest()


def _sentinel(into: Path) -> dict[str, bytes]:
    into.mkdir(parents=True, exist_ok=True)
    (into / "sentinel").write_bytes(b"untouched")
    return _contents(into)


def _contents(into: Path) -> dict[str, bytes]:
    return {str(p.relative_to(into)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(into.rglob("*"))}


GOOD = (_info("ok/file"), b"fine")

SHAPES: dict[str, tuple[list[tuple[tarfile.TarInfo, bytes | None]], str]] = {
    "absolute path": ([GOOD, (_info("/tmp/nodus-evil"), b"x")], "absolute path"),
    "dotdot": ([GOOD, (_info("ok/../../evil"), b"x")], "'..'"),
    "dotdot first": ([(_info("../evil"), b"x")], "'..'"),
    "symlink absolute": ([GOOD, (_info("ok/l", tarfile.SYMTYPE, linkname="/etc/passwd"), None)], "absolute path"),
    "symlink escaping": ([GOOD, (_info("ok/l", tarfile.SYMTYPE, linkname="../../outside"), None)], "leaves the target"),
    "write through symlink": ([(_info("d", tarfile.DIRTYPE), None), (_info("l", tarfile.SYMTYPE, linkname="d"), None),
                               (_info("l/x"), b"x")], "is a symlink"),
    "hardlink escaping": ([GOOD, (_info("ok/h", tarfile.LNKTYPE, linkname="../../etc/passwd"), None)],
                          "leaves the target"),
    "hardlink absolute": ([GOOD, (_info("ok/h", tarfile.LNKTYPE, linkname="/etc/passwd"), None)], "absolute path"),
    "hardlink to nothing": ([GOOD, (_info("ok/h", tarfile.LNKTYPE, linkname="ok/missing"), None)],
                            "not a file earlier in the archive"),
    "char device": ([GOOD, (_info("ok/null", tarfile.CHRTYPE), None)], "device file"),
    "block device": ([GOOD, (_info("ok/sda", tarfile.BLKTYPE), None)], "device file"),
    "fifo": ([GOOD, (_info("ok/pipe", tarfile.FIFOTYPE), None)], "fifo"),
    "replace the target": ([(_info(".", tarfile.SYMTYPE, linkname="d"), None)], "target directory itself"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_refused_shape_leaves_the_target_untouched(tmp_path: Path, shape: str) -> None:
    members, reason = SHAPES[shape]
    archive = tmp_path / "evil.tar.zst"
    digest = craft(archive, members)
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(UnsafeArchive, match=reason) as e:
        restore(archive, into, sha256=digest)
    assert e.value.reason and e.value.member
    assert _contents(into) == before
    assert not os.path.lexists("/tmp/nodus-evil") and not (tmp_path / "outside").exists()
    with open(archive, "rb") as f, pytest.raises(UnsafeArchive, match=reason):
        inspect(f)


def test_gnu_longname_members_are_checked_too(tmp_path: Path) -> None:
    archive = tmp_path / "long.tar.zst"
    digest = craft(archive, [(_info("a/" * 80 + "../../../../" * 30 + "evil"), b"x")], fmt=tarfile.GNU_FORMAT)
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(UnsafeArchive, match="'..'"):
        restore(archive, into, sha256=digest)
    assert _contents(into) == before


def test_oversize_archive_is_refused_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "big.tar.zst"
    digest = craft(archive, [(_info("big"), os.urandom(200_000))])
    into = tmp_path / "into"
    before = _sentinel(into)
    monkeypatch.setattr(restore_module, "_extract", _must_not_run)
    with pytest.raises(ArchiveTooLarge, match="larger than maxSize"):
        restore(archive, into, sha256=digest, max_size=100_000)
    assert _contents(into) == before


def test_archive_that_unpacks_too_large_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.zst"
    digest = craft(archive, [(_info("ok"), b"fine"), (_info("zeros"), bytes(50 << 20))])
    assert archive.stat().st_size < 100_000  # compresses to almost nothing
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(ArchiveTooLarge, match="unpacks to more than"):
        restore(archive, into, sha256=digest, max_unpacked=10 << 20)
    assert _contents(into) == before


def _must_not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("extraction started before the digest was verified")


def test_digest_mismatch_moves_nothing_into_the_target(tmp_path: Path) -> None:
    """The digest is computed in the same pass as the extraction (ADR 0053): members land in a staging
    directory first, and a mismatch removes it before anything is moved into the target. The damage
    is in file content (a stored frame), so every member is well-formed: only the digest can tell."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "f").write_bytes(os.urandom(300_000))
    (tmp_path / "state" / "g").write_bytes(b"fine")
    archive = tmp_path / "c.tar.zst"
    save_file(["state"], archive, root=tmp_path)
    blob = bytearray(archive.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    archive.write_bytes(bytes(blob))
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(DigestMismatch, match="nothing was extracted") as e:
        restore_file(archive, into)
    assert "sha256" in str(e.value)
    assert _contents(into) == before
    fresh = tmp_path / "fresh"
    with pytest.raises(DigestMismatch):
        restore_file(archive, fresh)
    assert not fresh.exists()


def test_digest_mismatch_in_a_store(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "f").write_bytes(b"good" * 1000)
    store = LocalStore(tmp_path / "store")
    m = store.save(["state"], root=tmp_path)
    other = tmp_path / "other.tar.zst"
    craft(other, [(_info("state/f"), b"evil" * 1000)])
    size = (tmp_path / "store" / m.archive).stat().st_size
    data = other.read_bytes()
    (tmp_path / "store" / m.archive).write_bytes((data + bytes(size))[:size])  # same size, other bytes
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(DigestMismatch, match="manifest committed"):
        store.restore(into)
    with pytest.raises(DigestMismatch):
        store.verify()
    assert _contents(into) == before


def test_truncated_archive_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "f").write_bytes(os.urandom(300_000))
    archive = tmp_path / "c.tar.zst"
    save_file(["state"], archive, root=tmp_path)
    archive.write_bytes(archive.read_bytes()[:150_000])
    with open(archive, "rb") as f, pytest.raises(CorruptArchive):
        inspect(f)
    into = tmp_path / "into"
    before = _sentinel(into)
    with pytest.raises(CorruptArchive, match="ends inside"):
        restore(archive, into)  # no digest to compare: the staging directory takes the damage
    assert _contents(into) == before


def test_not_zstd_at_all(tmp_path: Path) -> None:
    archive = tmp_path / "c.tar.zst"
    archive.write_bytes(b"this is not an archive" * 100)
    with open(archive, "rb") as f, pytest.raises(CorruptArchive, match="zstd"):
        inspect(f)


def test_max_size_on_save_commits_nothing(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "f").write_bytes(os.urandom(3 << 20))
    store = LocalStore(tmp_path / "store")
    first = store.save(["state"], root=tmp_path)
    with pytest.raises(ArchiveTooLarge, match=r"passed maxSize \(1048576 bytes\).*nothing was committed"):
        store.save(["state"], root=tmp_path, max_size=1 << 20)
    assert [m.seq for m in store.list()] == [first.seq]
    assert sorted(os.listdir(tmp_path / "store")) == sorted([first.archive, "0000000001.manifest.json"])
    with pytest.raises(ArchiveTooLarge):
        save_file(["state"], tmp_path / "one.tar.zst", root=tmp_path, max_size=1 << 20)
    assert not list(tmp_path.glob("*.tar.zst*")) and not list(tmp_path.glob(".tmp-*"))
