"""What runs beside and after the main command: the sidecars (started in order, each until it is
ready; stopped in reverse) and a gang member's teardown steps (armed once its launch starts, run
once, each bounded; their failures are logged, never the attempt's result)."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Callable

from ..clock import Clock
from .processes import Child, Processes

PREFIX_TEARDOWN = b"[teardown] "
TEARDOWN_TIMEOUT = 60.0
"""Seconds one teardown step may run before it is killed."""
READY_POLL = 0.05
"""Seconds between looks for a starting sidecar's readiness."""


class Sidecars:
    def __init__(self, procs: Processes, note: Callable[[str], None], stop_grace: float, clock: Clock) -> None:
        self.procs = procs
        self.clock = clock
        self.note = note
        self.stop_grace = stop_grace
        self.started: list[Child] = []

    def start(self, sc: dict[str, Any], env: dict[str, str], ready_file: Path) -> str | None:
        """Starts one sidecar and waits until it is ready; returns why it is not (None: it is)."""
        name = sc["name"]
        timeout = float(sc.get("startup_timeout") or 60)
        try:
            child = self.procs.spawn(f"sidecar {name}", list(sc["command"]), env, f"[sidecar {name}] ".encode())
        except OSError as e:
            return f"sidecar {name} could not start: {e.strerror or e}"
        self.started.append(child)
        deadline = self.clock.monotonic() + timeout
        while True:
            if ready_file.exists() or _listening(child.proc.pid):
                self.note(f"sidecar {name} is ready")
                return None
            if child.exit_code is not None:
                self.procs.drain(child)
                lines = list(child.tail)[-2:]
                return "\n".join([f"sidecar {name} exited with code {child.exit_code} before it was ready", *lines])
            if self.clock.monotonic() >= deadline:
                return (f"sidecar {name} was not ready within {timeout:g}s (no listening TCP port and no "
                        "$NODUS_READY_FILE)")
            self.procs.wait(READY_POLL, [child])

    def stop(self) -> None:
        """Every started sidecar, the last started first."""
        for sidecar in reversed(self.started):
            self.procs.terminate(sidecar, self.stop_grace)


class Teardown:
    def __init__(self, procs: Processes, note: Callable[[str], None]) -> None:
        self.procs = procs
        self.note = note
        self.steps: list[tuple[tuple[str, ...], dict[str, str]]] = []
        """A gang member's teardown steps and their env, armed once its first launch step starts."""

    def arm(self, steps: list[tuple[str, ...]], env: dict[str, str]) -> None:
        self.steps = [(step, env) for step in steps]

    def run(self) -> None:
        """The armed steps, once."""
        steps, self.steps = self.steps, []
        for number, (argv, env) in enumerate(steps, 1):
            name = f"teardown step {number} ({argv[0] if argv else ''})"
            try:
                child = self.procs.spawn("teardown", list(argv), env, PREFIX_TEARDOWN)
            except OSError as e:
                self.note(f"{name} could not start: {e.strerror or e}")
                continue
            self.procs.wait(TEARDOWN_TIMEOUT, [child], interruptible=False)
            if child.exit_code is None:
                self.note(f"{name} did not end within {TEARDOWN_TIMEOUT:g}s; killed")
                self.procs.terminate(child, 0)
            else:
                self.procs.drain(child)
                self.procs.signal_group(child, signal.SIGKILL)
                if child.exit_code != 0:
                    self.note(f"{name} exited with code {child.exit_code}")


def _listening(pid: int) -> bool:
    """Whether the process or any of its descendants has a listening TCP socket."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for p in procs:
        try:
            if any(c.status == psutil.CONN_LISTEN for c in p.net_connections(kind="tcp")):
                return True
        except psutil.Error:
            continue
    from ..oci.pod import listening_ports
    return bool(listening_ports(pid))  # a container's sockets: psutil looks only in this network namespace
