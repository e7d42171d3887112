"""The start gate: a supervisor forked before the agent's state.json durably holds its attempt starts no
step until the agent says it does (ADR 0082).

The agent writes the SUPERVISED stage and forks the supervisor at once, and the fsync of state.json runs
while the supervisor reads its spec and makes its cgroup; only the first step (init, a sidecar, the main
command) waits for the gate. The gate is a pipe: the agent keeps the write end and writes one byte once
state.json is on disk; the supervisor holds the read end. End of file without the byte means the agent
went away (or its write failed) before the attempt was on disk: nothing of the attempt may run, since
an agent that restarts without it could be given it again and run it twice.
"""
from __future__ import annotations

import os
import selectors
from typing import Callable

OPEN = b"1"
"""The byte the agent writes once state.json holds the attempt."""
POLL = 0.5
"""Seconds between looks for a stop request while the gate is shut (a signal is noticed at once)."""


def open_gate(fd: int) -> None:
    """The agent's side: opens the gate and closes its end."""
    try:
        os.write(fd, OPEN)
    except OSError:
        pass  # the supervisor is gone already: nothing waits
    finally:
        os.close(fd)


def shut_gate(fd: int) -> None:
    """The agent's side: the attempt is not on disk and never will be: closes its end unopened."""
    os.close(fd)


def await_gate(fd: int, wake_fd: int, check_stop: Callable[[], None]) -> bool:
    """The supervisor's side: waits until the gate opens (True) or its writer is gone (False); calls
    `check_stop` (which raises) before each wait, and whenever `wake_fd` (the signal wake-up pipe) is readable."""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.register(wake_fd, selectors.EVENT_READ)
        try:
            while True:
                check_stop()
                for key, _ in sel.select(POLL):
                    if key.fd == wake_fd:
                        try:
                            os.read(wake_fd, 512)
                        except BlockingIOError:
                            pass
                        continue
                    try:
                        return os.read(fd, 1) == OPEN
                    except OSError:
                        return False
        finally:
            os.close(fd)
