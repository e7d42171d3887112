"""Checkpoint library: round trips over arbitrary trees (hypothesis), names as tar gives them, and the
pure parts (sizes, manifests, part sizing, the import boundary)."""
from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.checkpoint import (LocalStore, Manifest, SourceError, format_size, member_name, parse_size,
                              restore_file, save_file, scan, verify_file)
from nodus.checkpoint.stores.s3 import MIN_PART, part_size_for

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20

# -- arbitrary trees --------------------------------------------------------------------------------

NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1,
                max_size=16).filter(lambda s: s not in (".", "..") and len(s.encode()) <= 255)
FILE_MODES = st.sampled_from([0o644, 0o600, 0o755, 0o400, 0o640, 0o700, 0o444, 0o666, 0o777, 0o000])
DIR_MODES = st.sampled_from([0o755, 0o700, 0o750, 0o555])
MTIMES = st.integers(min_value=0, max_value=4_000_000_000)
CONTENT = st.one_of(st.just(b""), st.binary(max_size=2048), st.binary(min_size=1, max_size=8).map(lambda b: b * 4000))


@st.composite
def trees(draw: st.DrawFn, depth: int = 0) -> dict[str, tuple]:
    """name → ("file", bytes, mode, mtime) | ("dir", tree, mode, mtime)."""
    names = draw(st.lists(NAMES, max_size=5 if depth < 2 else 2, unique_by=lambda s: s.casefold()))
    out: dict[str, tuple] = {}
    for name in names:
        if depth < 3 and draw(st.booleans()):
            out[name] = ("dir", draw(trees(depth + 1)), draw(DIR_MODES), draw(MTIMES))
        else:
            out[name] = ("file", draw(CONTENT), draw(FILE_MODES), draw(MTIMES))
    return out


def _build(base: Path, tree: dict[str, tuple]) -> list[Path]:
    """Create the tree; returns every path made (dirs get their mode and mtime after their children)."""
    made = []
    for name, node in tree.items():
        p = base / name
        made.append(p)
        if node[0] == "dir":
            p.mkdir()
            made += _build(p, node[1])
        else:
            p.write_bytes(node[1])
            os.chmod(p, node[2])
            os.utime(p, (node[3], node[3]))
    for name, node in tree.items():
        if node[0] == "dir":
            os.chmod(base / name, node[2])
            os.utime(base / name, (node[3], node[3]))
    return made


def _snapshot(base: Path) -> dict[str, tuple]:
    """What a restore must reproduce: kind, content or target, permission bits, mtime, link identity."""
    out: dict[str, tuple] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, base)
            s = os.lstat(p)
            if stat.S_ISLNK(s.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            elif stat.S_ISDIR(s.st_mode):
                out[rel] = ("dir", stat.S_IMODE(s.st_mode), int(s.st_mtime))
            else:
                first = inodes.setdefault(s.st_ino, rel)
                out[rel] = ("file", Path(p).read_bytes(), stat.S_IMODE(s.st_mode), int(s.st_mtime),
                            first if first != rel else "")
    return out


def _links_of(snapshot: dict[str, tuple]) -> dict[str, str]:
    return {k: v[4] for k, v in snapshot.items() if v[0] == "file" and v[4]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(tree=trees(), data=st.data())
def test_any_tree_round_trips(tmp_path_factory: pytest.TempPathFactory, tree: dict[str, tuple],
                              data: st.DataObject) -> None:
    work = tmp_path_factory.mktemp("rt")
    src = work / "state"
    src.mkdir()
    made = _build(src, tree)
    files = [p for p in made if p.is_file()]
    # symlinks inside the tree (relative, possibly dangling) and hardlinks between files
    for i in range(data.draw(st.integers(0, 3))):
        if not made:
            break
        target = data.draw(st.sampled_from(made))
        where = data.draw(st.sampled_from([src] + [p for p in made if p.is_dir() and not p.is_symlink()]))
        link = where / f"link{i}"
        if not link.exists() and not link.is_symlink() and os.access(where, os.W_OK):
            link.symlink_to(os.path.relpath(target, where))
    if files and data.draw(st.booleans()):
        first = data.draw(st.sampled_from(files))
        os.link(first, src / "hardlink")
    expected = _snapshot(src)

    archive = work / "state.tar.zst"
    manifest = save_file(["state"], archive, root=work)
    assert manifest.paths == ("state",)
    assert verify_file(archive)[1].sha256 == manifest.sha256

    out = work / "out"
    _, summary = restore_file(archive, out)
    got = _snapshot(out / "state")
    # which of two hardlinked names is "first" depends on walk order; compare the link classes
    assert {k: v[:4] for k, v in got.items() if v[0] == "file"} == \
        {k: v[:4] for k, v in expected.items() if v[0] == "file"}
    assert {k: v for k, v in got.items() if v[0] != "file"} == {k: v for k, v in expected.items() if v[0] != "file"}
    assert _link_classes(out / "state") == _link_classes(src)
    assert summary.files == manifest.files
    assert not [n for n in os.listdir(out) if n.startswith(".nodus-")]


def _link_classes(base: Path) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for p in base.rglob("*"):
        if p.is_file() and not p.is_symlink():
            groups.setdefault(p.stat().st_ino, set()).add(str(p.relative_to(base)))
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def test_store_round_trip_and_tar_naming(tmp_path: Path) -> None:
    """Absolute paths lose their leading /, relative ones keep their form: restore under DIR is tar -C DIR."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_text("x")
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "y").write_text("y")
    store = LocalStore(tmp_path / "store")
    m = store.save([str(tmp_path / "a"), "rel"], root=tmp_path)
    assert m.paths == (member_name(str(tmp_path / "a")), "rel")
    store.restore(tmp_path / "out")
    assert (tmp_path / "out" / str(tmp_path / "a" / "b" / "x").lstrip("/")).read_text() == "x"
    assert (tmp_path / "out" / "rel" / "y").read_text() == "y"
    # GNU tar reads what we write, and names it the same way
    listing = subprocess.run(["tar", "-I", "zstd", "-tf", str(tmp_path / "store" / m.archive)], capture_output=True,
                             text=True)
    if listing.returncode == 0:  # zstd may be absent; the library does not need it
        assert "rel/y" in listing.stdout.split()


def test_dot_saves_the_contents_and_restore_merges(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "new").write_text("new")
    (src / "f").write_text("saved")
    save_file(["."], tmp_path / "c.tar.zst", root=src)
    into = tmp_path / "into"
    (into / "d").mkdir(parents=True)
    (into / "d" / "keep").write_text("kept")
    (into / "f").write_text("old")
    restore_file(tmp_path / "c.tar.zst", into)
    assert (into / "d" / "keep").read_text() == "kept"  # directories merge, as with tar -x
    assert (into / "d" / "new").read_text() == "new"
    assert (into / "f").read_text() == "saved"  # files are replaced


def test_restore_replaces_a_symlink_in_the_target_instead_of_following_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("inside")
    save_file(["d"], tmp_path / "c.tar.zst", root=src)
    outside = tmp_path / "outside"
    outside.mkdir()
    into = tmp_path / "into"
    into.mkdir()
    (into / "d").symlink_to(outside)
    restore_file(tmp_path / "c.tar.zst", into)
    assert not (into / "d").is_symlink() and (into / "d" / "f").read_text() == "inside"
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("given_path,name", [("/nodus/state", "nodus/state"), ("state", "state"),
                                             ("./a//b/", "a/b"), ("../../up", "up"), ("/", ""), (".", "")])
def test_member_names_follow_tar(given_path: str, name: str) -> None:
    assert member_name(given_path) == name


def test_save_refuses_what_a_restore_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "abs").symlink_to("/etc/passwd")
    with pytest.raises(SourceError, match="absolute path"):
        scan(["s"], root=tmp_path)
    (tmp_path / "s" / "abs").unlink()
    (tmp_path / "s" / "up").symlink_to("../../x")
    with pytest.raises(SourceError, match="leaves the target"):
        scan(["s"], root=tmp_path)
    (tmp_path / "s" / "up").unlink()
    os.mkfifo(tmp_path / "s" / "fifo")
    with pytest.raises(SourceError, match="fifo"):
        scan(["s"], root=tmp_path)
    with pytest.raises(SourceError, match="No such file"):
        scan(["missing"], root=tmp_path)


def test_symlinked_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("content")
    (tmp_path / "state").symlink_to("real")
    save_file(["state"], tmp_path / "c.tar.zst", root=tmp_path)
    restore_file(tmp_path / "c.tar.zst", tmp_path / "out")
    assert (tmp_path / "out" / "state" / "f").read_text() == "content"
    assert not (tmp_path / "out" / "state").is_symlink()


@pytest.mark.parametrize("text,n", [("4096", 4096), ("1Ti", 1 << 40), ("512Mi", 512 << 20), ("10G", 10**10),
                                    ("1.5Ki", 1536), ("2k", 2000)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_parse_size_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1536, 3 << 20, 200 << 30)] == ["0", "1023", "1.5Ki", "3Mi", "200Gi"]


def test_manifest_json_round_trip() -> None:
    m = Manifest(seq=7, time=datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc), archive="x.tar.zst",
                 size=10, sha256="ab" * 32, paths=("nodus/state",), files=3, unpacked_size=99, level=3,
                 format="Snapshot", attempt="job-1-a2", epoch=4, labels={"integration": "HFTrainer"})
    assert Manifest.from_json(m.to_json()) == m
    doc = m.to_json().decode()
    for key in ('"seq": 7', '"sha256"', '"paths"', '"attempt"', '"epoch"', '"format"', '"files"', '"level": 3'):
        assert key in doc


def test_s3_part_size_rule() -> None:
    assert part_size_for(0) == MIN_PART == 8 * MiB
    assert part_size_for(80_000 * MiB) == 8 * MiB
    assert part_size_for(1 << 40) == 105 * MiB  # 1 TiB / 10,000 = 104.9 MiB, rounded up to a MiB
    assert part_size_for(1 << 40) * 10_000 >= 1 << 40


def test_checkpoint_imports_only_stdlib_zstandard_and_boto3() -> None:
    allowed = set(sys.stdlib_module_names) | {"zstandard", "boto3", "botocore"}
    bad = []
    for path in sorted((ROOT / "checkpoint" / "nodus" / "checkpoint").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not bad, bad


def test_large_files_cross_every_chunk_boundary(tmp_path: Path) -> None:
    from nodus.checkpoint.archive import CHUNK
    (tmp_path / "s").mkdir()
    big = os.urandom(2 * CHUNK + 12345)
    (tmp_path / "s" / "big").write_bytes(big)
    (tmp_path / "s" / "after").write_text("after the big one")
    save_file(["s"], tmp_path / "c.tar.zst", root=tmp_path)
    restore_file(tmp_path / "c.tar.zst", tmp_path / "out")
    assert (tmp_path / "out" / "s" / "big").read_bytes() == big
    assert (tmp_path / "out" / "s" / "after").read_text() == "after the big one"


def test_a_later_member_of_the_same_name_wins_as_in_tar(tmp_path: Path) -> None:
    import io
    import tarfile

    import zstandard

    def info(name: str, kind: bytes, size: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.size, ti.mode, ti.mtime = kind, size, 0o644 if kind != tarfile.DIRTYPE else 0o755, 1_700_000_000
        return ti

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info("x", tarfile.REGTYPE, 3), io.BytesIO(b"old"))
        tar.addfile(info("x", tarfile.DIRTYPE))  # a directory replaces the file
        tar.addfile(info("x/in", tarfile.REGTYPE, 2), io.BytesIO(b"in"))
        tar.addfile(info("y/z", tarfile.REGTYPE, 1), io.BytesIO(b"z"))  # parent not listed
        tar.addfile(info("y", tarfile.REGTYPE, 3), io.BytesIO(b"new"))  # a file replaces the directory
    archive = tmp_path / "dup.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    restore_file(archive, tmp_path / "out")
    assert (tmp_path / "out" / "x" / "in").read_bytes() == b"in"
    assert (tmp_path / "out" / "y").read_bytes() == b"new"
