"""`nodus checkpoint` end to end in subprocesses, with a local store directory and with one archive file."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodus.cli import checkpoint as cli_checkpoint

BIN = Path(sys.executable).parent


NODUS = [str(BIN / "nodus"), "checkpoint"]
"""The installed CLI, as users run it."""


@pytest.fixture(scope="module")
def nodus() -> list[str]:
    return NODUS


def _run(nodus: list[str], cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*nodus, *args], capture_output=True, text=True, cwd=cwd)
    assert (r.returncode == 0) == ok, f"{args}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _tree(base: Path) -> Path:
    state = base / "state"
    (state / "sub").mkdir(parents=True)
    (state / "sub" / "weights.bin").write_bytes(os.urandom(200_000))
    (state / "log.txt").write_text("step 1\n" * 5000)
    (state / "latest").symlink_to("sub/weights.bin")
    os.chmod(state / "log.txt", 0o600)
    return state


def _same(a: Path, b: Path) -> None:
    r = subprocess.run(["diff", "-r", "--no-dereference", str(a), str(b)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_store_directory(tmp_path: Path, nodus: list[str]) -> None:
    _tree(tmp_path)
    out = _run(nodus, tmp_path, "save", "state", "--out", "ckpts").stdout
    assert "checkpoint 1" in out and "sha256" in out
    (tmp_path / "state" / "log.txt").write_text("step 2\n")
    _run(nodus, tmp_path, "save", "state", "--out", "ckpts", "--level", "9", "--attempt", "job-0-a2")
    table = _run(nodus, tmp_path, "ls", "ckpts").stdout.splitlines()
    assert table[0].split() == ["SEQ", "TIME", "SIZE", "FILES", "SHA256", "ATTEMPT"]
    assert [row.split()[0] for row in table[1:]] == ["1", "2"]
    assert table[2].split()[-1] == "job-0-a2" and len(table[1].split()[4]) == 12
    assert "ok" in _run(nodus, tmp_path, "verify", "ckpts").stdout
    assert "checkpoint 1" in _run(nodus, tmp_path, "verify", "ckpts", "--seq", "1").stdout

    r = _run(nodus, tmp_path, "restore", "ckpts", "--into", "latest").stdout
    assert "checkpoint 2" in r and "sha256 verified" in r
    _same(tmp_path / "state", tmp_path / "latest" / "state")
    _run(nodus, tmp_path, "restore", "ckpts", "--into", "first", "--seq", "1")
    assert (tmp_path / "first" / "state" / "log.txt").read_text().startswith("step 1")
    assert oct((tmp_path / "first" / "state" / "log.txt").stat().st_mode & 0o777) == "0o600"


def test_archive_file(tmp_path: Path, nodus: list[str]) -> None:
    _tree(tmp_path)
    _run(nodus, tmp_path, "save", str(tmp_path / "state"), "--out", "c.tar.zst")
    assert (tmp_path / "c.tar.zst.manifest.json").exists()
    v = _run(nodus, tmp_path, "verify", "c.tar.zst").stdout
    assert "matches its manifest" in v
    _run(nodus, tmp_path, "restore", "c.tar.zst", "--into", "DIR")
    _same(tmp_path / "state", tmp_path / "DIR" / str(tmp_path / "state").lstrip("/"))  # as tar -C DIR
    if shutil.which("zstd"):  # what we write, GNU tar reads the same way
        (tmp_path / "T").mkdir()
        subprocess.run(["tar", "-I", "zstd", "-xf", "c.tar.zst", "-C", "T"], cwd=tmp_path, check=True)
        _same(tmp_path / "state", tmp_path / "T" / str(tmp_path / "state").lstrip("/"))
    # without its manifest the digest is not compared, but can be given
    (tmp_path / "c.tar.zst.manifest.json").unlink()
    assert "not compared" in _run(nodus, tmp_path, "verify", "c.tar.zst").stdout
    _run(nodus, tmp_path, "verify", "c.tar.zst", "--sha256", "0" * 64, ok=False)


def test_user_errors_are_one_line_and_a_fix(tmp_path: Path, nodus: list[str]) -> None:
    _tree(tmp_path)
    r = _run(nodus, tmp_path, "restore", "missing.tar.zst", "--into", "x", ok=False)
    assert r.stderr.startswith("error: missing.tar.zst: no such archive file or store directory")
    assert "fix:" in r.stderr and "Traceback" not in r.stderr
    r = _run(nodus, tmp_path, "save", "state", "--out", "c.tar.zst", "--max-size", "10Ki", ok=False)
    assert "maxSize" in r.stderr and "fix: raise --max-size" in r.stderr
    assert not (tmp_path / "c.tar.zst").exists()
    r = _run(nodus, tmp_path, "save", "state", "--out", "c.tar.zst", "--max-size", "lots", ok=False)
    assert "not a size" in r.stderr
    r = _run(nodus, tmp_path, "save", "nothere", "--out", "c.tar.zst", ok=False)
    assert "nothere" in r.stderr and "Traceback" not in r.stderr
    _run(nodus, tmp_path, "save", "state", "--out", "c.tar.zst")
    blob = bytearray((tmp_path / "c.tar.zst").read_bytes())
    blob[100] ^= 1
    (tmp_path / "c.tar.zst").write_bytes(bytes(blob))
    r = _run(nodus, tmp_path, "restore", "c.tar.zst", "--into", "y", ok=False)
    assert "sha256" in r.stderr and "nothing was extracted" in r.stderr
    assert not (tmp_path / "y").exists()
    r = _run(nodus, tmp_path, "ls", "nostore", ok=False)
    assert "no such store" in r.stderr


def test_add_parser_plugs_into_a_parser_shaped_like_main() -> None:
    """main.py calls args.func(args) for operator verbs, without a REST client."""
    p = argparse.ArgumentParser(prog="nodus")
    sub = p.add_subparsers(dest="command", required=True)
    cli_checkpoint.add_parser(sub)
    for argv in (["checkpoint", "save", "a", "b", "--out", "s3://b/p", "--level", "5", "--max-size", "1Ti",
                  "--seq", "3"],
                 ["checkpoint", "restore", "f.tar.zst", "--into", "d"],
                 ["checkpoint", "verify", "f.tar.zst"],
                 ["checkpoint", "ls", "dir"]):
        args = p.parse_args(argv)
        assert args.operator is True and callable(args.func)
    args = p.parse_args(["checkpoint", "save", "a", "--out", "x"])
    assert args.paths == ["a"] and args.level == 3 and args.max_size == "1Ti" and args.seq is None
