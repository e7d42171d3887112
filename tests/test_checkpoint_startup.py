"""What `nodus checkpoint restore` pays before it reads a byte, and the lanes its files are written on
(ADR 0081): the restore path imports neither the save path nor modules it does not use, the package's
names still resolve, and the large files of one directory are written on different lanes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from nodus.checkpoint import CheckpointError, Manifest
from nodus.checkpoint.threads import Cancelled, Pool
from nodus.checkpoint.writers import Writers

NOT_ON_THE_RESTORE_PATH = ("tarfile", "tempfile", "secrets", "_strptime", "dataclasses", "concurrent.futures",
                           "logging", "nodus.checkpoint.archive", "nodus.checkpoint.stores",
                           "nodus.checkpoint.integration", "nodus.cli.main")


def test_a_file_restore_imports_nothing_of_the_save_path(tmp_path: Path) -> None:
    from nodus.checkpoint import save_file

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "w.bin").write_bytes(os.urandom(1000))
    save_file(["state"], tmp_path / "s.tar.zst", root=tmp_path)
    code = (
        "import sys\n"
        "from nodus.cli.checkpoint_files import main\n"
        f"rc = main(['checkpoint', 'restore', {str(tmp_path / 's.tar.zst')!r}, '--into', {str(tmp_path / 'out')!r}])\n"
        f"print(rc, sorted(m for m in {NOT_ON_THE_RESTORE_PATH!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 []", out
    assert (tmp_path / "out" / "state" / "w.bin").read_bytes() == (tmp_path / "state" / "w.bin").read_bytes()


def test_every_name_of_the_package_resolves() -> None:
    import nodus.checkpoint as package
    from nodus.checkpoint import restore

    assert callable(restore) and not isinstance(restore, type(package))  # the function, not the submodule
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


def test_manifest_time_reads_back_and_refuses_a_time_without_its_zone() -> None:
    m = Manifest(seq=1, time=datetime(2026, 12, 7, 8, 59, 1, 250, tzinfo=timezone.utc), archive="a", size=1,
                 sha256="0" * 64, paths=("s",), files=1, unpacked_size=1, level=3)
    assert Manifest.from_json(m.to_json()).time == m.time
    doc = json.loads(m.to_json())
    for bad in ("2026-12-07T08:59:01.000250", "2026-12-07 08:59:01Z", "yesterday", 17):
        doc["time"] = bad
        with pytest.raises(CheckpointError, match="not a checkpoint manifest"):
            Manifest.from_json(json.dumps(doc).encode())


def test_large_files_of_one_directory_are_written_on_different_lanes(tmp_path: Path) -> None:
    writers = Writers(4)
    lanes = []
    try:
        for i in range(3):
            writers.open_large(str(tmp_path / f"shard-{i}"), 0o644, 0)
            assert writers._current is not None
            lanes.append(writers._current[1])
            writers.piece([memoryview(b"x" * 10)], 0, 10)
            writers.end_large()
        writers.drain()
    finally:
        writers.close()
    assert len(set(map(id, lanes))) == 3
    assert all((tmp_path / f"shard-{i}").read_bytes() == b"x" * 10 for i in range(3))


def test_a_pool_runs_tasks_in_order_raises_their_errors_and_cancels_what_has_not_started() -> None:
    lane = Pool(1, "test")
    seen: list[int] = []
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait(5)

    try:
        first = lane.submit(hold)
        tasks = [lane.submit(seen.append, i) for i in range(5)]
        failing = lane.submit(int, "not a number")
        assert started.wait(5) and not first.done()
        gate.set()
        assert [t.result() for t in tasks] == [None] * 5 and seen == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError):
            failing.result()
        gate.clear()
        started.clear()
        blocked = lane.submit(hold)
        later = lane.submit(seen.append, 99)
        assert started.wait(5)
        lane.cancel()
        gate.set()
        assert blocked.result() is True  # it had started: it runs to its end
        with pytest.raises(Cancelled):
            later.result()
        assert 99 not in seen
    finally:
        gate.set()
        lane.close()


def test_a_file_restore_hashes_its_archive_before_it_imports_zstd_and_the_parser(tmp_path: Path) -> None:
    """ADR 0104: `nodus checkpoint restore FILE` maps FILE and starts its sha256 before it imports zstd and
    argparse, so that a second CPU hashes while the first imports; the restore still checks that digest."""
    from nodus.checkpoint import save_file

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "w.bin").write_bytes(os.urandom(100_000))
    save_file(["state"], tmp_path / "s.tar.zst", root=tmp_path)
    code = (
        "import os, sys\n"
        "def hook(event, args):\n"
        "    if event == 'mmap.__new__' or (event == 'import' and args[0] in ('zstandard', 'argparse')):\n"
        "        os.write(1, f'event {event} {args[0] if event == \"import\" else \"\"}\\n'.encode())\n"
        "sys.addaudithook(hook)\n"
        f"sys.argv = ['nodus', 'checkpoint', 'restore', {str(tmp_path / 's.tar.zst')!r}, '--into', "
        f"{str(tmp_path / 'out')!r}]\n"
        "from nodus.cli.entry import main\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    events = [line.split(maxsplit=1)[1].strip() for line in r.stdout.splitlines() if line.startswith("event ")]
    assert events[0] == "mmap.__new__", events
    assert {"import zstandard", "import argparse"} <= set(events[1:]), events
    assert "sha256 verified" in r.stdout
    assert (tmp_path / "out" / "state" / "w.bin").read_bytes() == (tmp_path / "state" / "w.bin").read_bytes()


def test_an_archive_opened_early_is_refused_as_before(tmp_path: Path) -> None:
    """The early-opened archive (ADR 0104) goes through every refusal: another digest than its manifest's,
    a size over --max-size; the target is left as it was."""
    from nodus.checkpoint import save_file

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "w.bin").write_bytes(os.urandom(300_000))
    save_file(["state"], tmp_path / "s.tar.zst", root=tmp_path)
    nodus = str(Path(sys.executable).parent / "nodus")
    r = subprocess.run([nodus, "checkpoint", "restore", "s.tar.zst", "--into", "a", "--max-size", "1Ki"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and "maxSize" in r.stderr and not (tmp_path / "a").exists(), r.stderr
    blob = bytearray((tmp_path / "s.tar.zst").read_bytes())
    blob[-10] ^= 1
    (tmp_path / "s.tar.zst").write_bytes(bytes(blob))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep").write_text("mine")
    r = subprocess.run([nodus, "checkpoint", "restore", "s.tar.zst", "--into", "b"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "sha256" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path / "b")) == ["keep"]
