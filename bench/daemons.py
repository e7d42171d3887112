"""Stopping what a benchmark started: its daemons, their children, and the attempt supervisors the
agents spawned in sessions of their own (found through each attempt's run/status.json)."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Iterable

import psutil


def stop_all(daemons: Iterable[subprocess.Popen[bytes] | None], agent_work_dirs: Iterable[Path]) -> None:
    """SIGTERM for the daemons (they stop what they run), SIGKILL for the rest; then SIGKILL stragglers."""
    running = [p for p in daemons if p is not None and p.poll() is None]
    procs: list[psutil.Process] = []
    for d in running:
        try:
            procs += [psutil.Process(d.pid), *psutil.Process(d.pid).children(recursive=True)]
        except psutil.Error:
            pass
    for work_dir in agent_work_dirs:
        attempts = work_dir / "attempts"
        for status in attempts.glob("*/run/status.json") if attempts.is_dir() else []:
            try:
                pid = json.loads(status.read_text()).get("supervisor_pid")
                if pid:
                    procs.append(psutil.Process(int(pid)))
            except (OSError, ValueError, psutil.Error):
                pass
    gentle = {d.pid for d in running}
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM if p.pid in gentle else signal.SIGKILL)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
