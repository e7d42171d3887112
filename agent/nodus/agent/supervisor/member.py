"""A gang member's launch, as the supervisor runs it after its gate opens: the launcher's files,
then the wait for rank 0's head (the setup, main and teardown steps run as any other child)."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable

from ..clock import Clock
from ..launch import split_endpoint

GATE_POLL = 0.02
"""Seconds between looks for launch.json at the gate (a stop is noticed as often)."""
HEAD_POLL = 0.2
"""Seconds between tries of rank 0's endpoint."""


def write_launch_files(files: dict[str, str], user: dict[str, Any] | None) -> None:
    """The launcher's files (a hostfile, a config), owned by the workload user."""
    for name, text in files.items():
        path = Path(name)
        missing = [p for p in path.parents if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: the supervisor may be root, and the path may be in a directory the workload writes.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data):]
            if user:
                os.fchown(fd, user["uid"], user["gid"])
        finally:
            os.close(fd)
        if user:
            for d in missing:
                os.chown(d, user["uid"], user["gid"])


def await_head(head: str, timeout: float, wait: Callable[[float], None], note: Callable[[str], None],
               clock: Clock) -> str | None:
    """Polls rank 0's endpoint until it accepts a TCP connection (`wait` pumps the supervisor's
    children and raises its Stop); returns why not after `timeout` on `clock` (None: it accepts)."""
    host, port = split_endpoint(head)
    note(f"waiting up to {timeout:g}s for the gang's head at {head}")
    deadline = clock.monotonic() + timeout
    while True:
        left = deadline - clock.monotonic()
        if _accepts(host, port, max(0.05, min(1.0, left))):
            note(f"the gang's head at {head} accepts connections")
            return None
        left = deadline - clock.monotonic()
        if left <= 0:
            return f"rank 0's rendezvous endpoint {head} did not accept connections within {timeout:g}s"
        wait(min(HEAD_POLL, left))


def _accepts(host: str, port: int, timeout: float) -> bool:
    """Whether host:port accepts a TCP connection within `timeout` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
