"""The coordinator's clocks: OffsetClock, which drills and tests use to move a running coordinator's
time, follows every write of its file, including two of the same length in quick succession; and
rfc3339, which formats the times a decision writes."""
from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from pathlib import Path

from nodus.coordinator.api import units
from nodus.coordinator.clock import OffsetClock, parse, rfc3339


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


def _rfc3339_through_datetime(t: float) -> str:
    """What rfc3339 wrote before it formatted by hand (datetime and units.format_time): the oracle."""
    dt = datetime.fromtimestamp(round(t, 3), timezone.utc)
    return units.format_time(dt.replace(microsecond=dt.microsecond // 1000 * 1000))


def test_rfc3339_writes_what_datetime_writes_at_millisecond_precision() -> None:
    rng = random.Random(13)
    times = [rng.uniform(0, 4e9) for _ in range(20_000)]
    times += [whole + milli / 1000 for whole in (0, 1_765_000_000, 4_102_444_799) for milli in range(1000)]
    times += [whole + edge for whole in range(1_765_000_000, 1_765_000_200) for edge in (0.0005, 0.9995, 0.99949, 0.9999)]
    assert [rfc3339(t) for t in times] == [_rfc3339_through_datetime(t) for t in times]
    assert rfc3339(1_765_000_000.1204) == "2025-12-06T05:46:40.12Z"
    assert rfc3339(1_765_000_000.9996) == "2025-12-06T05:46:41Z", "rounds up into the next second"
    assert parse(rfc3339(1_765_000_000.25)) == 1_765_000_000.25
