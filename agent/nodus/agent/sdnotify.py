"""sd_notify(3) without a dependency: one datagram to $NOTIFY_SOCKET per state change."""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("nodus.agent.sdnotify")


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Sends `message` (for example READY=1) to systemd; False when not under systemd or on error."""
    addr = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("sd_notify %s failed: %s", message.split("=")[0], e)
        return False


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog is set.

    WATCHDOG_PID, when present, must name this process (systemd sets it for the main process only).
    """
    env = env if env is not None else dict(os.environ)
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None
