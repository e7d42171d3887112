"""`python -m nodus.agent.supervisor ATTEMPT_DIR --lock-fd N`, or `--zygote` (fork supervisors on request)."""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..clock import supervisor_clock
from ..layout import AttemptLayout
from ..statefile import read_json
from .lifecycle import Supervisor
from .stay import IDLE_SECONDS, stay


def _notify_address(text: str | None) -> str | None:
    if text and text.startswith("@"):
        return "\0" + text[1:]  # an abstract unix socket
    return text


class LazyLog:
    """run/supervisor.log as the supervisor's stdout and stderr, made at the first text written to it: most
    supervisors write none, and each file made costs an inode (ADR 0112). Once made, it is fds 1 and 2 too."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def fileno(self) -> int:
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.dup2(self.fd, 1)
            os.dup2(self.fd, 2)
        return self.fd

    def write(self, text: str) -> int:
        data = text.encode(errors="replace")
        fd = self.fileno()
        while data:
            data = data[os.write(fd, data):]
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _from_zygote(request: dict[str, Any], lock_fd: int, gate_fd: int = -1, channel_fd: int = -1) -> None:
    """In a child the zygote forked: become the supervisor of request["attempt_dir"], and with a channel
    (`channel_fd`) of each attempt of its Job the agent hands it after that (stay.py, ADR 0124)."""
    if channel_fd < 0:
        _run_attempt(request, lock_fd, gate_fd)
        return
    os.set_inheritable(channel_fd, False)
    zygote_log = os.dup(1)  # fds 1 and 2 go back to it after an attempt whose run/supervisor.log was made
    stay(lambda r, lock, gate: _run_attempt(r, lock, gate, zygote_log), request, lock_fd, gate_fd, channel_fd,
         float(request.get("stay_seconds") or IDLE_SECONDS))


def _run_attempt(request: dict[str, Any], lock_fd: int, gate_fd: int, zygote_log: int = -1) -> None:
    """The supervisor of one attempt, from its spec to its final status. With `zygote_log` (a supervisor
    that stays) it leaves nothing of the attempt open: its log files, descriptors and stdout."""
    layout = AttemptLayout(Path(request["attempt_dir"]))
    sys.stdout = sys.stderr = out = LazyLog(layout.run / "supervisor.log")
    try:
        os.set_inheritable(lock_fd, False)
        if gate_fd >= 0:
            os.set_inheritable(gate_fd, False)
        spec = read_json(layout.spec)
        if spec is None:
            print(f"no spec at {layout.spec}", file=sys.stderr)
            if zygote_log >= 0 and gate_fd >= 0:
                os.close(gate_fd)
            return
        supervisor = Supervisor(layout, spec, request.get("secrets") or {}, _notify_address(request.get("notify")),
                                supervisor_clock(layout.root), gate_fd)
        supervisor.run()
        if zygote_log >= 0:
            supervisor.close()
    finally:
        if zygote_log >= 0 and out.fd >= 0:
            os.dup2(zygote_log, 1)
            os.dup2(zygote_log, 2)
            os.close(out.fd)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="nodus-supervisor")
    p.add_argument("attempt_dir", nargs="?")
    p.add_argument("--lock-fd", type=int, default=-1)
    p.add_argument("--notify", default=None)
    p.add_argument("--gate-fd", type=int, default=-1, help="the start gate's read end (start_gate.py)")
    p.add_argument("--zygote", action="store_true", help="fork supervisors on request (fd 0: the agent's socket)")
    args = p.parse_args(argv)
    if args.zygote:
        import importlib

        from ..zygote import serve
        # Warm what supervisors need, once: an image attempt's container runtime too (importing it after
        # each fork cost an image Job ~140 ms of its start; bench/startup.py).
        for module in ("tarfile", "psutil", "zstandard", "nodus.agent.supervisor.containers"):
            importlib.import_module(module)
        serve(_from_zygote)
        return
    if not args.attempt_dir:
        p.error("ATTEMPT_DIR is required")
    layout = AttemptLayout(Path(args.attempt_dir))
    if args.gate_fd >= 0:
        os.set_inheritable(args.gate_fd, False)
    if args.lock_fd >= 0:
        os.set_inheritable(args.lock_fd, False)
    else:  # started by hand: take the lock ourselves
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    secrets: dict[str, Any] = {}
    if not sys.stdin.isatty():
        raw = sys.stdin.read()
        secrets = json.loads(raw) if raw.strip() else {}
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    spec = read_json(layout.spec)
    if spec is None:
        print(f"no spec at {layout.spec}", file=sys.stderr)
        sys.exit(2)
    Supervisor(layout, spec, secrets, _notify_address(args.notify), supervisor_clock(layout.root), args.gate_fd).run()


if __name__ == "__main__":
    main()
