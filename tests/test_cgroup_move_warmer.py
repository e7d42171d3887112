"""The agent's MoveWarmer (cgroups.py, ADR 0072, 0082): from an accept until shortly after the spawn it
moves its own process to the cgroup it is already in, so the kernel's cgroup-move lock is in its fast
state when the attempt's supervisor makes its first move. Here: the move changes nothing, pokes never
block, a hold keeps moving and then stops, and a refused move stops it. (What it saves is a timing:
bench/startup.py and ADR 0082 measure it, not this test.)"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cgroup_root import cgroups_unavailable
from nodus.agent.cgroups import MoveWarmer


def wait_until(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")
def test_a_warming_move_leaves_the_process_where_it_was() -> None:
    script = ("import time\n"
              "from nodus.agent.cgroups import MoveWarmer\n"
              "before = open('/proc/self/cgroup').read()\n"
              "w = MoveWarmer.of_self()\n"
              "assert w is not None and str(__import__('os').getpid()) in w.procs.read_text().split()\n"
              "for _ in range(5):\n"
              "    w.poke(hold=0)\n"
              "deadline = time.monotonic() + 30\n"
              "while w.moves < 1 and w.failed is None and time.monotonic() < deadline:\n"
              "    time.sleep(0.01)\n"
              "assert w.failed is None and w.moves >= 1, (w.failed, w.moves)\n"
              "assert open('/proc/self/cgroup').read() == before\n"
              "print('ok', w.moves)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    moves = int(out.stdout.split()[1])
    assert 1 <= moves <= 5, "pokes made more moves than were asked for"


@pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")
def test_a_hold_keeps_moving_and_then_stops() -> None:
    script = ("import time\n"
              "from nodus.agent.cgroups import MoveWarmer\n"
              "w = MoveWarmer.of_self()\n"
              "assert w is not None\n"
              "w.poke(hold=0.3)\n"
              "deadline = time.monotonic() + 30\n"
              "while (w.moves < 3 or w.holding) and w.failed is None and time.monotonic() < deadline:\n"
              "    time.sleep(0.005)\n"
              "assert w.failed is None and w.moves >= 3 and not w.holding, (w.failed, w.moves, w.holding)\n"
              "made = w.moves\n"
              "time.sleep(0.1)\n"
              "assert w.moves == made, 'it moved on after its hold ended'\n"
              "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_refused_move_stops_the_warmer(tmp_path: Path) -> None:
    warmer = MoveWarmer(tmp_path / "no-such-cgroup" / "cgroup.procs")
    warmer.poke()
    wait_until(lambda: warmer.failed is not None, "the refused move to be noticed")
    assert isinstance(warmer.failed, FileNotFoundError) and warmer.moves == 0
    warmer.poke()  # returns at once and does nothing
    assert warmer.moves == 0
