"""A supervisor that stays: once its attempt ended, it waits for the agent to hand it the next attempt of
the same Job instead of exiting, so a Job of many short indexes forks (and copies the zygote's pages for)
one supervisor per slot, not one per index (ADR 0124).

Between attempts it holds nothing of the one before: its final status is written, its cgroup removed, its
attempt log, step descriptors and wake-up pipe closed, and its supervisor lock given back (so the agent,
which tells a live supervisor by that lock, sees the attempt's supervisor gone, as when it exited). The
supervisor is root with its saved uid and wears an attempt's uid only for the instant it starts a step
(identity.py), so running attempts of different uids in turn separates them as separate supervisors did.

The channel is one end of a socket pair the agent made at the first spawn (zygote.py's framing):
    supervisor → agent   {"idle": true}                      once per ended attempt, the lock given back
    agent → supervisor   the zygote's request, with the next attempt's lock (and start gate) descriptors
    supervisor → agent   {"pid": N}, before anything of it runs; or {"stopped": ...} and its exit
It exits at the channel's end (the agent exited or dropped it), after `idle_seconds` with nothing handed
to it, and on SIGTERM while idle. A SIGTERM found pending when a request arrives was sent before the
request (the agent serializes its stops and its hand-offs): it was meant for an attempt that has ended or
for this idle supervisor, so the request is refused and the agent forks a fresh supervisor for it.
"""
from __future__ import annotations

import os
import select
import signal
import socket
from typing import Any, Callable

from ..zygote import _recv, _send

IDLE_SECONDS = 2.0
"""How long a supervisor waits for its Job's next attempt; longer than the end → next assignment of a
busy node (~60-300 ms on the loaded 2-CPU VM), short enough that a finished Job's supervisors go soon."""

RunAttempt = Callable[[dict[str, Any], int, int], None]
"""Runs one attempt to its end (request, lock descriptor, start gate descriptor or -1)."""


class _Idle:
    """The signal wake-up pipe and SIGTERM handler of a supervisor between attempts."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the wake-up pipe says it

    def termed(self) -> bool:
        """Whether a SIGTERM arrived so far (its C handler wrote it to the pipe on delivery)."""
        try:
            return signal.SIGTERM in os.read(self.read, 512)
        except BlockingIOError:
            return False

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self.read)
        os.close(self.write)


def stay(run_attempt: RunAttempt, request: dict[str, Any], lock_fd: int, gate_fd: int, channel_fd: int,
         idle_seconds: float = IDLE_SECONDS) -> None:
    """Runs `request`'s attempt, then each attempt the agent hands over `channel_fd`, until it stops handing."""
    with socket.socket(fileno=channel_fd) as channel:
        channel.settimeout(None)
        while True:
            run_attempt(request, lock_fd, gate_fd)
            os.close(lock_fd)  # the attempt's supervisor is gone, as far as the agent can tell
            idle = _Idle()
            try:
                handed = _await_next(channel, idle, idle_seconds)
                if handed is None:
                    return
                request, fds = handed
                if idle.termed() or len(fds) not in (1, 2):
                    for fd in fds:
                        os.close(fd)
                    _send(channel, {"stopped": "a stop signal came before this attempt"})
                    return
                for fd in fds:
                    os.set_inheritable(fd, False)  # as the zygote's child makes its own: no step inherits them
                _send(channel, {"pid": os.getpid()})
            except (OSError, EOFError, ValueError):
                return  # the agent dropped the channel: it forks a fresh supervisor for what it had
            finally:
                idle.close()
            lock_fd, gate_fd = fds[0], fds[1] if len(fds) == 2 else -1


def _await_next(channel: socket.socket, idle: _Idle, idle_seconds: float) -> tuple[dict[str, Any], list[int]] | None:
    _send(channel, {"idle": True})
    ready, _, _ = select.select([channel.fileno(), idle.read], [], [], idle_seconds)
    if channel.fileno() not in ready:
        return None  # nothing handed in time, or a SIGTERM while idle
    return _recv(channel, with_fds=True)
