"""Starting a benchmark's coordinator, and stopping what a benchmark started: its daemons, their
children, and the attempt supervisors the agents spawned in sessions of their own (found through each
attempt's run/status.json)."""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import psutil
import yaml

BIN = Path(sys.executable).parent


@dataclass
class Coordinator:
    """A started nodus-coordinator: its process, endpoints, the operator token of its kubeconfig and a
    copy of the CA its REST certificate chains to."""

    proc: subprocess.Popen[bytes]
    http: str
    grpc: str
    token: str
    ca: Path
    data: Path


def start_coordinator(root: Path, *args: str) -> Coordinator:
    """Starts nodus-coordinator on loopback with its data in ROOT/data (log in ROOT/coordinator.log) and
    waits for its endpoints file; a coordinator that exits or takes over a minute raises with its log."""
    return ready_coordinator(root, spawn_coordinator(root, *args))


def spawn_coordinator(root: Path, *args: str) -> subprocess.Popen[bytes]:
    """Starts nodus-coordinator as `start_coordinator` does, without waiting for it (`ready_coordinator`)."""
    with open(root / "coordinator.log", "ab") as out:
        return subprocess.Popen(
            [str(BIN / "nodus-coordinator"), "--data-dir", str(root / "data"), "--http-listen", "127.0.0.1:0",
             "--grpc-listen", "127.0.0.1:0", "--log-level", "WARNING", *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def ready_coordinator(root: Path, proc: subprocess.Popen[bytes]) -> Coordinator:
    """Waits for a spawned coordinator's endpoints file (ROOT/data/endpoints.json)."""
    data = root / "data"
    endpoints = data / "endpoints.json"
    deadline = time.monotonic() + 60
    while not endpoints.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("nodus-coordinator did not start:\n" + (root / "coordinator.log").read_text())
        time.sleep(0.05)
    ep = json.loads(endpoints.read_text())
    config = yaml.safe_load((data / "kubeconfig").read_text())
    ca = root / "ca.crt"
    ca.write_bytes(base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]))
    return Coordinator(proc, ep["http"], ep["grpc"], config["users"][0]["user"]["token"], ca, data)


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
