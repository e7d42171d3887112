"""bench/fleet.py's diagnostics: py-spy recordings of the coordinators (`--py-spy DIR`) and the terms a
replica lost while the fleet ran, read from the replicas' logs (controllers/leader.py's warning)."""
from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
from pathlib import Path

from daemons import Coordinator


def profile(args: argparse.Namespace, cs: list[Coordinator], n: int, tail: str = "",
            stem: str = "fleet", rate: int = 50) -> list[subprocess.Popen[bytes]]:
    """With --py-spy DIR: one `py-spy record --gil` per coordinator, sampling from now until stopped, into
    DIR/<stem>-<n>-r<i><tail>.txt (also bench/backlog.py's)."""
    if not args.py_spy:
        return []
    folder = Path(args.py_spy)
    folder.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "--gil", "--format", "raw", "--rate", str(rate), "--nonblocking",
                              "-p", str(c.proc.pid), "-o", str(folder / f"{stem}-{n}-r{i}{tail}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i, c in enumerate(cs)]


def unprofile(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:  # SIGINT: py-spy writes what it sampled and exits
        spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(30)


def terms_lost(root: Path) -> list[str]:
    """Every time a replica stopped leading the controllers for another reason than its own stop (the
    storm's restart): the reasons, from the replicas' logs (leader.py's warning)."""
    lost = []
    for log in sorted(root.glob("r*/coordinator.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "no longer leading the controllers" in line and not line.endswith(": stopping"):
                lost.append(line.split("no longer leading the controllers", 1)[1].strip())
    return lost
