"""A file rewritten by exchanging it with its previous inode (ADR 0112): always whole, two inodes in all."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodus.agent import swapfile
from nodus.agent.statefile import StateWriter, read_json
from nodus.agent.swapfile import SwapFile


def test_durable_rewrites_keep_the_content_whole_and_reuse_two_inodes(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    f = SwapFile(target)
    seen = set()
    for n in range(20):
        f.write(json.dumps({"n": n}).encode())
        assert read_json(target) == {"n": n}
        seen.add(target.stat().st_ino)
    assert len(seen) == 2 and f.inodes == 2
    assert [p.name for p in tmp_path.iterdir() if p != target] == [".state.json.swap"]


def test_a_reader_holding_the_file_keeps_what_it_opened(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    f = SwapFile(target)
    f.write(b'{"n": 1}')
    with open(target, "rb") as held:
        f.write(b'{"n": 2}')
        assert read_json(target) == {"n": 2}
        assert json.loads(held.read()) == {"n": 1}  # the exchange leaves the old inode as it was


def test_after_a_write_not_on_disk_the_next_makes_a_new_temp_file(tmp_path: Path) -> None:
    """Its exchange may not be on disk yet: after a host crash the name could still point at the old
    inode, so that inode must not be truncated by the next write."""
    target = tmp_path / "state.json"
    f = SwapFile(target)
    f.write(b'{"n": 1}')
    f.write(b'{"n": 2}', durable=False)
    os.link(tmp_path / ".state.json.swap", tmp_path / "on-disk")  # the name the disk may still give it
    made = f.inodes
    f.write(b'{"n": 3}')
    assert f.inodes == made + 1 and (tmp_path / "on-disk").read_bytes() == b'{"n": 1}'
    assert read_json(target) == {"n": 3}


def test_torn_ok_reuses_the_temp_file_after_any_write(tmp_path: Path) -> None:
    target = tmp_path / "uids.json"
    f = SwapFile(target, torn_ok=True)
    for n in range(10):
        f.write(json.dumps({"n": n}).encode(), durable=False)
    assert f.inodes == 2 and read_json(target) == {"n": 9}


def test_a_temp_file_left_by_another_process_is_replaced_not_truncated(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    leftover = tmp_path / ".state.json.swap"
    leftover.write_bytes(b"left")
    link = tmp_path / "link"
    os.link(leftover, link)  # stands for a name on disk that may still point at it
    SwapFile(target).write(b'{"n": 1}')
    assert link.read_bytes() == b"left" and read_json(target) == {"n": 1}


def test_without_exchange_it_renames_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(swapfile, "exchange", lambda a, b: False)
    target = tmp_path / "state.json"
    f = SwapFile(target)
    for n in range(3):
        f.write(json.dumps({"n": n}).encode())
    assert read_json(target) == {"n": 2} and not (tmp_path / ".state.json.swap").exists()


def test_the_state_writer_makes_no_inode_per_durable_write(tmp_path: Path) -> None:
    state = {"n": 0}
    writer = StateWriter(tmp_path / "state.json", lambda: state)
    for n in range(10):
        state["n"] = n
        writer.changed()  # no loop: written at once, durably
    assert read_json(tmp_path / "state.json") == {"n": 9}
    assert writer.writes == 10 and writer.file.inodes == 2
