"""bench/fleet.py's diagnostics: py-spy recordings of the coordinators (`--py-spy DIR`) and the terms a
replica lost while the fleet ran, read from the replicas' logs (controllers/leader.py's warning)."""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pyspy
from daemons import Coordinator


def profile(args: argparse.Namespace, cs: list[Coordinator], n: int, tail: str = "",
            stem: str = "fleet", rate: int = 50) -> list[subprocess.Popen[bytes]]:
    """With --py-spy DIR: one `py-spy record --gil` per coordinator, sampling from now until stopped, into
    DIR/<stem>-<n>-r<i><tail>.txt (also bench/backlog.py's; bench/pyspy.py)."""
    return pyspy.record(args.py_spy, {f"{stem}-{n}-r{i}{tail}.txt": c.proc.pid for i, c in enumerate(cs)}, rate)


unprofile = pyspy.stop


def terms_lost(root: Path) -> list[str]:
    """Every time a replica stopped leading the controllers for another reason than its own stop (the
    storm's restart): the reasons, from the replicas' logs (leader.py's warning)."""
    lost = []
    for log in sorted(root.glob("r*/coordinator.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "no longer leading the controllers" in line and not line.endswith(": stopping"):
                lost.append(line.split("no longer leading the controllers", 1)[1].strip())
    return lost
