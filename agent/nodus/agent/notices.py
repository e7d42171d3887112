"""The datagram socket supervisors poke after every status write, so the agent looks at once
instead of at the next poll. Each datagram names its attempt, so the agent looks at that attempt
alone (the poll interval still looks at every one)."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from pathlib import Path

log = logging.getLogger("nodus.agent")


def notify_address(work_dir: Path) -> str:
    """An abstract unix socket name for supervisors to poke (no path length limit, nothing to clean)."""
    return "\0nodus-agent-" + hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:24]


class SupervisorNotices:
    """Sets `wake` whenever a supervisor pokes, and keeps the attempt ids the pokes named until
    `take`; without the socket the agent polls only."""

    def __init__(self, address: str, wake: asyncio.Event) -> None:
        self.address = address
        self.wake = wake
        self._sock: socket.socket | None = None
        self._poked: set[str] = set()

    def add(self, attempt_id: str) -> None:
        """As if the attempt's supervisor had poked."""
        self._poked.add(attempt_id)
        self.wake.set()

    def take(self) -> set[str]:
        """The attempts poked since the last take."""
        poked, self._poked = self._poked, set()
        return poked

    def open(self, poll_interval: float) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            s.bind(self.address)
        except OSError as e:
            log.warning("supervisor notifications unavailable (%s); polling every %.1fs", e, poll_interval)
            s.close()
            return
        self._sock = s
        asyncio.get_running_loop().add_reader(s.fileno(), self._on_datagram)

    def _on_datagram(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(512)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            self._poked.add(data.decode(errors="replace"))
        self.wake.set()

    def close(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
