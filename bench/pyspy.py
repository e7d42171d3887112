"""The benches' `--py-spy DIR`: `py-spy record --gil` of running processes (collapsed stacks, one file each),
from `record` until `stop`. Used by bench/api.py (the create phase), bench/backlog.py (each burst) and
bench/fleet.py (the burst and the drained steady state)."""
from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path


def record(folder: str | None, files: dict[str, int], rate: int = 50) -> list[subprocess.Popen[bytes]]:
    """With a folder: one `py-spy record` per {file name: pid}, sampling from now until `stop`; none without.
    Needs py-spy on PATH and ptrace rights."""
    if not folder:
        return []
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "--gil", "--format", "raw", "--rate", str(rate), "--nonblocking",
                              "-p", str(pid), "-o", str(out / name)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in files.items()]


def stop(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:  # SIGINT: py-spy writes what it sampled and exits
        spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(30)
