"""The coordinator's clocks: OffsetClock, which drills and tests use to move a running coordinator's
time, follows every write of its file, including two of the same length in quick succession."""
from __future__ import annotations

import time
from pathlib import Path

from nodus.coordinator.clock import OffsetClock


def test_the_offset_follows_each_write_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    clock = OffsetClock(path)
    assert abs(clock.now() - time.time()) < 1, "no file: no offset"
    for offset in (20.0, 40.0, 60.0):  # the same length each time, written within one mtime tick
        path.write_text(str(offset))
        time.sleep(OffsetClock.REREAD * 2)
        assert abs(clock.now() - time.time() - offset) < 1
    path.write_text("not a number")
    time.sleep(OffsetClock.REREAD * 2)
    assert abs(clock.now() - time.time() - 60.0) < 1, "a half-written file keeps the last offset"
