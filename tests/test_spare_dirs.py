"""Spare attempt directories (spares.py, ADR 0095): an ended attempt's tree comes back as exactly what
AttemptLayout.make gives a new attempt (its bare directories, empty, the agent's, with make's modes), or
it is not kept at all and the caller removes it as before."""
from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from nodus.agent.layout import AttemptLayout
from nodus.agent.spares import BARE, SpareDirs


def ended_attempt(root: Path) -> AttemptLayout:
    """A tree as an attempt leaves it: files and directories in each place it writes, secrets read-only."""
    layout = AttemptLayout(root)
    layout.make()
    layout.handshake.mkdir()
    (layout.state / "deep" / "er").mkdir(parents=True)
    (layout.state / "deep" / "er" / "weights.bin").write_bytes(b"w" * 100)
    (layout.outputs / "result.txt").write_text("42")
    (layout.inputs / "data").mkdir()
    layout.log.write_text("hello\n")
    layout.status.write_text("{}")
    (layout.tmp / "scratch").write_text("x")
    (layout.ready / "main").touch()
    layout.secrets.mkdir()
    (layout.secrets / "token").write_text("s3cret")
    os.symlink("/etc", layout.state / "escape")  # removed as a link, never followed
    (root / "volumes" / "v").mkdir(parents=True)
    return layout


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its mode bits and owner."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            found[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), st.st_uid)
    return found


def test_an_ended_attempts_tree_comes_back_as_make_makes_it(tmp_path: Path) -> None:
    spares = SpareDirs(tmp_path / "spare")
    old = ended_attempt(tmp_path / "attempts" / "old")
    assert spares.give(old.root)
    assert not old.root.exists() and len(spares) == 1
    new = AttemptLayout(tmp_path / "attempts" / "new")
    assert spares.take(new.root)
    assert len(spares) == 0
    fresh = AttemptLayout(tmp_path / "fresh")
    fresh.make()
    fresh.handshake.mkdir()
    new.make()
    assert tree(new.root) == tree(fresh.root)
    assert sorted(tree(new.root)) == sorted(BARE)
    assert (Path("/etc") / "passwd").exists(), "the link was followed"


def test_a_tree_with_an_entry_of_its_own_is_not_kept(tmp_path: Path) -> None:
    spares = SpareDirs(tmp_path / "spare")
    old = ended_attempt(tmp_path / "old")
    (old.root / "rootfs").mkdir()  # not an attempt layout's: perhaps a mount, the caller's to handle
    before = tree(old.root)
    assert not spares.give(old.root)
    assert tree(old.root) == before, "a tree not kept is left for the caller as it was"
    assert not spares.take(tmp_path / "new")


def test_a_bare_directory_that_is_a_link_is_not_kept(tmp_path: Path) -> None:
    spares = SpareDirs(tmp_path / "spare")
    old = ended_attempt(tmp_path / "old")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the attempt's")
    for entry in old.outputs.iterdir():
        entry.unlink()
    old.outputs.rmdir()
    os.symlink(outside, old.outputs)
    before = tree(old.root)
    assert not spares.give(old.root)
    assert tree(old.root) == before
    assert (outside / "keep.txt").read_text() == "not the attempt's"


def test_the_pool_is_bounded(tmp_path: Path) -> None:
    spares = SpareDirs(tmp_path / "spare", keep=2)
    assert [spares.give(ended_attempt(tmp_path / f"a{i}").root) for i in range(3)] == [True, True, False]
    assert (tmp_path / "a2").exists()
    assert spares.take(tmp_path / "b0") and spares.take(tmp_path / "b1") and not spares.take(tmp_path / "b2")


def test_a_new_agent_empties_the_spares_a_killed_one_left(tmp_path: Path) -> None:
    first = SpareDirs(tmp_path / "spare")
    assert first.give(ended_attempt(tmp_path / "old").root)
    second = SpareDirs(tmp_path / "spare")
    assert not (tmp_path / "spare").exists() and not second.take(tmp_path / "new")


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL as the kernel's system.posix_acl_* xattr holds it (version 2, then tag, perm, id each)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_acls_and_xattrs_the_ended_attempt_set_do_not_reach_the_next_one(tmp_path: Path) -> None:
    """An attempt owns its directories and may give a uid of its choosing (perhaps the one the next attempt
    gets, or a later one) a named-user or default ACL entry on them; a spare must not carry it over."""
    spares = SpareDirs(tmp_path / "spare")
    old = ended_attempt(tmp_path / "attempts" / "old")
    any_id = 0xFFFFFFFF
    acl = _acl((0x01, 7, any_id), (0x02, 7, 12345), (0x04, 5, any_id), (0x10, 7, any_id), (0x20, 5, any_id))
    for d in (old.root, old.state, old.outputs):
        os.setxattr(d, "system.posix_acl_access", acl)
        os.setxattr(d, "system.posix_acl_default", acl)
        os.setxattr(d, "user.planted", b"1")
    assert spares.give(old.root)
    new = AttemptLayout(tmp_path / "attempts" / "new")
    assert spares.take(new.root)
    fresh = AttemptLayout(tmp_path / "fresh")
    fresh.make()
    fresh.handshake.mkdir()
    new.make()
    assert tree(new.root) == tree(fresh.root)
    for d in (new.root, *(new.root / b for b in BARE)):
        assert [n for n in os.listxattr(d) if not n.startswith("security.")] == [], d
