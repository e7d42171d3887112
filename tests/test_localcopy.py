"""The in-process local copy the agent makes while it holds a program: the same tree `cp -a` makes
(contents, modes, owners, ns times, symlinks, hard links, holes), merged into an existing directory,
with files that vanish left out and fifos refused by path."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from nodus.checkpoint import SourceError
from nodus.checkpoint import localcopy
from nodus.checkpoint.localcopy import copy_tree

MiB = 1 << 20
ROOT = os.geteuid() == 0


def build(src: Path) -> None:
    """A tree with one of everything a state directory holds. Every atime is an hour ahead, after
    mtime and ctime, so reading the tree (relatime) leaves the times as they were."""
    (src / "a" / "b" / "c").mkdir(parents=True)
    (src / "a" / "b" / "c" / "deep.txt").write_text("deep\n")
    (src / "empty").write_bytes(b"")
    (src / "big.bin").write_bytes(os.urandom(3 * MiB + 123))
    (src / "odd").write_bytes(b"#!/bin/sh\n")
    os.chmod(src / "odd", 0o751)
    (src / "link-to-file").symlink_to("a/b/c/deep.txt")
    (src / "dangling").symlink_to("../nowhere/else")
    (src / "hard1").write_bytes(b"one inode, two names\n")
    os.link(src / "hard1", src / "a" / "hard2")
    (src / "ünïcødé-名前.txt").write_text("名前\n")
    (src / "ro").mkdir()
    (src / "ro" / "inside").write_text("in a read-only directory\n")
    if ROOT:
        os.chown(src / "odd", 1234, 5678)
        os.chown(src / "link-to-file", 4321, 8765, follow_symlinks=False)
    now = time.time_ns()
    paths = sorted((p for p in src.rglob("*")), key=lambda p: -len(p.parts)) + [src]
    for i, p in enumerate(paths):  # children before parents: a parent's times are set last
        mtime = now - (10_000 + i) * 1_000_000_007
        os.utime(p, ns=(now + 3600 * 10**9 + i, mtime), follow_symlinks=False)
    os.chmod(src / "ro", 0o555)


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything the copy must keep, by relative path; hard links as a group index."""
    out: dict[str, tuple[object, ...]] = {}
    inodes: dict[int, int] = {}
    for p in sorted([root, *root.rglob("*")]):
        st = p.lstat()
        rel = str(p.relative_to(root))
        what: object
        if stat.S_ISLNK(st.st_mode):
            what = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            what = "dir"
        else:
            what = ("file", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest(),
                    inodes.setdefault(st.st_ino, len(inodes)) if st.st_nlink > 1 else None)
        owner = (st.st_uid, st.st_gid) if ROOT else None
        mode = None if stat.S_ISLNK(st.st_mode) else st.st_mode
        out[rel] = (what, mode, owner, st.st_mtime_ns, st.st_atime_ns)
    return out


@pytest.mark.parametrize("threads", [1, 4])
def test_the_copy_is_the_tree_cp_a_makes(tmp_path: Path, threads: int) -> None:
    src = tmp_path / "src"
    src.mkdir()
    build(src)
    before = tree(src)
    stats = copy_tree(src, tmp_path / "ours", threads=threads)
    subprocess.run(["cp", "-a", str(src), str(tmp_path / "cp")], check=True)
    ours = tree(tmp_path / "ours")
    assert ours == before
    assert ours == tree(tmp_path / "cp")
    assert os.stat(tmp_path / "ours" / "hard1").st_ino == os.stat(tmp_path / "ours" / "a" / "hard2").st_ino
    assert stat.S_IMODE(os.stat(tmp_path / "ours" / "odd").st_mode) == 0o751
    assert (stats.files, stats.bytes) == (7, sum(p.stat().st_size for p in src.rglob("*")
                                                  if p.is_file() and not p.is_symlink() and p.name != "hard2"))


def test_a_sparse_file_stays_sparse(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse.img", "wb") as f:
        f.truncate(64 * MiB)
        for off in (1 * MiB, 40 * MiB, 64 * MiB - 4096):
            f.seek(off)
            f.write(os.urandom(4096))
    (src / "hole-only.img").touch()
    os.truncate(src / "hole-only.img", 64 * MiB)
    if os.stat(src / "sparse.img").st_blocks * 512 > 16 * MiB:
        pytest.skip("this filesystem does not keep holes")
    copy_tree(src, tmp_path / "dst")
    for name in ("sparse.img", "hole-only.img"):
        a, b = src / name, tmp_path / "dst" / name
        assert b.stat().st_size == a.stat().st_size
        assert b.stat().st_blocks * 512 <= a.stat().st_blocks * 512 + MiB
        assert hashlib.sha256(b.read_bytes()).digest() == hashlib.sha256(a.read_bytes()).digest()


def test_an_existing_directory_receives_the_contents(tmp_path: Path) -> None:
    """`cp -a SRC/. DST`: what was in DST stays, what SRC has replaces it, and no SRC/ level appears."""
    src, dst, ref = tmp_path / "src", tmp_path / "dst", tmp_path / "ref"
    src.mkdir()
    build(src)
    now = time.time_ns()
    for d in (dst, ref):
        (d / "a").mkdir(parents=True)
        (d / "only-here").write_text("kept\n")
        (d / "big.bin").write_text("replaced\n")
        (d / "link-to-file").write_text("a file where the source has a link\n")
        os.utime(d / "only-here", ns=(now + 3600 * 10**9, now - 10**9))  # the same in both, and not touched by reading
    before = tree(src)
    copy_tree(src, dst)
    subprocess.run(["cp", "-a", f"{src}/.", str(ref)], check=True)
    assert tree(dst) == tree(ref)
    assert (dst / "only-here").read_text() == "kept\n"
    assert {k: v for k, v in tree(dst).items() if k != "only-here"} == before


def test_a_symlink_given_as_the_root_is_followed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    (tmp_path / "via").symlink_to("src")
    (tmp_path / "file-via").symlink_to("src/f")
    copy_tree(tmp_path / "via", tmp_path / "dst")
    copy_tree(tmp_path / "file-via", tmp_path / "one")
    assert (tmp_path / "dst").is_dir() and not (tmp_path / "dst").is_symlink()
    assert (tmp_path / "dst" / "f").read_text() == "x"
    assert not (tmp_path / "one").is_symlink() and (tmp_path / "one").read_text() == "x"


def test_a_file_that_vanishes_after_the_walk_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    build(src)
    walk = localcopy._walk

    def walk_then_remove(s: str, d: str) -> localcopy._Plan:
        plan = walk(s, d)
        (src / "big.bin").unlink()
        (src / "hard1").unlink()  # the first name of a hard-linked pair: the other name is copied
        return plan

    monkeypatch.setattr(localcopy, "_walk", walk_then_remove)
    copy_tree(src, tmp_path / "dst")
    assert not (tmp_path / "dst" / "big.bin").exists()
    assert not (tmp_path / "dst" / "hard1").exists()
    assert (tmp_path / "dst" / "a" / "hard2").read_bytes() == b"one inode, two names\n"
    assert (tmp_path / "dst" / "a" / "b" / "c" / "deep.txt").read_text() == "deep\n"


def test_a_fifo_is_refused_by_path_before_anything_is_written(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "f").write_text("x")
    os.mkfifo(src / "d" / "pipe")
    with pytest.raises(SourceError, match=re.escape(f"{src / 'd' / 'pipe'}: fifos cannot be checkpointed")):
        copy_tree(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_a_socket_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    monkeypatch.chdir(src)  # a relative name: AF_UNIX paths are short
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("sock")
        copy_tree(src, tmp_path / "dst")
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["f"]


@pytest.mark.parametrize("unsupported", [("copy_file_range",), ("copy_file_range", "sendfile")])
def test_without_copy_file_range_the_bytes_still_arrive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        unsupported: tuple[str, ...]) -> None:
    def refuse(*_: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    for name in unsupported:
        monkeypatch.setattr(localcopy.os, name, refuse)
    src = tmp_path / "src"
    src.mkdir()
    build(src)
    before = tree(src)
    copy_tree(src, tmp_path / "dst")
    assert tree(tmp_path / "dst") == before


def test_a_failed_copy_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(localcopy.os, "copy_file_range", full)
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.bin").write_bytes(b"weights")
    with pytest.raises(OSError, match="No space left on device") as e:
        copy_tree(src, tmp_path / "dst")
    assert e.value.errno == errno.ENOSPC
    assert (e.value.filename, e.value.filename2) == (str(src / "model.bin"), str(tmp_path / "dst" / "model.bin"))


def test_where_the_owner_cannot_be_kept_the_copy_is_ours_without_setuid(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: chown is refused (EPERM), and the copy goes on, as cp -a does, dropping setuid/setgid
    rather than granting them to the copier's own user."""
    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    src = tmp_path / "src"
    src.mkdir()
    (src / "tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(src / "tool", 0o6755)
    (src / "link").symlink_to("tool")
    monkeypatch.setattr(localcopy.os, "fchown", refuse)
    monkeypatch.setattr(localcopy.os, "chown", refuse)
    copy_tree(src, tmp_path / "dst")
    assert stat.S_IMODE(os.stat(tmp_path / "dst" / "tool").st_mode) == 0o755
    assert os.readlink(tmp_path / "dst" / "link") == "tool"
