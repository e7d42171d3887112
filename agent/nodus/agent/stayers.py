"""The agent's side of supervisors that stay (supervisor/stay.py, ADR 0124): by Job, the channels of the
supervisors it forked, and the hand-off of a new attempt of that Job to one that said it is idle.

Only attempts of the same Job are handed to a supervisor: what it held of the attempt before (its spec,
secrets, environment) is then the same Job's. A hand-off and a stop's signal (`guard`) never run at once:
a stop asked for an attempt whose supervisor moved on must not reach the attempt it moved on to (the
supervisor refuses a hand-off that finds a SIGTERM already delivered, and the agent forks afresh).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any

from .zygote import ZygoteError, _recv, _send

LIMIT = 256
"""Channels kept at most (each an idle or working supervisor); past it, a new supervisor does not stay."""
REPLY_SECONDS = 5.0
"""How long a hand-off waits for the supervisor's answer (it answers before it does anything else)."""


@dataclass(slots=True)
class Stayer:
    pid: int
    pidfd: int
    """Signals it with no pid reuse to fear (-1 where pidfd_open failed: it is then never signalled)."""
    channel: socket.socket
    idle: bool = False
    """It said it ended its attempt and gave back its lock, and nothing was handed to it since."""


class Stayers:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.by_job: dict[str, list[Stayer]] = {}
        self.guard = threading.Lock()
        """Held across a hand-off, and by `ProcessRuntime.request_stop` across its look at the lock and its signal."""

    def hand(self, job: str, request: dict[str, Any], fds: list[int]) -> int | None:
        """Hands an attempt to an idle supervisor of `job`; its pid, or None: none took it (fork one)."""
        with self.guard:
            pool = self.by_job.get(job)
            if not pool:
                return None
            self._look(pool)
            for stayer in [s for s in pool if s.idle]:
                stayer.idle = False
                try:
                    stayer.channel.settimeout(REPLY_SECONDS)
                    _send(stayer.channel, request, fds)
                    reply, _ = _recv(stayer.channel)
                except (OSError, EOFError, ValueError, ZygoteError):
                    reply = {}
                if "pid" in reply:
                    return int(reply["pid"])
                # It exited, refused with a stop pending (and exits), or did not answer: in that last case it
                # may hold the attempt, but waits at its start gate, which the agent opens only after a spawn
                # returned: killed now, it ran nothing of it and the zygote forks the attempt's supervisor.
                self._drop(pool, stayer, kill=True)
            return None

    def pair(self) -> tuple[socket.socket, socket.socket] | None:
        """A new channel (the agent's end, the supervisor's end), or None where enough supervisors stay
        already; `add` the agent's end once the supervisor runs."""
        with self.guard:
            for pool in list(self.by_job.values()):
                self._look(pool)
            if sum(len(p) for p in self.by_job.values()) >= self.limit:
                return None
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def add(self, job: str, pid: int, ours: socket.socket) -> None:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        with self.guard:
            self.by_job.setdefault(job, []).append(Stayer(pid, pidfd, ours))

    def _look(self, pool: list[Stayer]) -> None:
        """Reads what the pool's supervisors said: idle, or gone (the channel's end)."""
        ready, _, _ = select.select([s.channel for s in pool], [], [], 0)
        for stayer in [s for s in pool if s.channel in ready]:
            try:
                stayer.channel.settimeout(REPLY_SECONDS)
                said, _ = _recv(stayer.channel)
            except (OSError, EOFError, ValueError, ZygoteError):
                self._drop(pool, stayer)
                continue
            stayer.idle = bool(said.get("idle"))

    def _drop(self, pool: list[Stayer], stayer: Stayer, kill: bool = False) -> None:
        stayer.channel.close()
        if stayer.pidfd >= 0:
            if kill:
                try:
                    signal.pidfd_send_signal(stayer.pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.close(stayer.pidfd)
        pool.remove(stayer)
        for job in [j for j, p in self.by_job.items() if not p]:
            del self.by_job[job]

    def close(self) -> None:
        """The agent stops: every channel ends, and the idle supervisors exit (working ones at their end)."""
        with self.guard:
            for pool in list(self.by_job.values()):
                for stayer in list(pool):
                    self._drop(pool, stayer)
