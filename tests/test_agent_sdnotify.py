"""systemd readiness and watchdog: the agent speaks sd_notify over $NOTIFY_SOCKET."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from nodus.agent import sdnotify
from agent_double import AgentProcess, FakeCoordinator


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.2)
    try:
        yield s, path
    finally:
        s.close()


def receive(s: socket.socket, until: float) -> list[str]:
    got: list[str] = []
    while time.monotonic() < until:
        try:
            got.append(s.recv(4096).decode())
        except socket.timeout:
            continue
    return got


def test_ready_and_watchdog_pings_reach_systemd(tmp_path: Path, notify_socket: tuple[socket.socket, str]) -> None:
    s, path = notify_socket
    fake = FakeCoordinator()
    address = fake.address  # nobody listens: readiness must not wait for the coordinator
    fake.server.stop(None)
    agent = AgentProcess(tmp_path / "work", address, fake.token,
                         env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}).start()
    try:
        got: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (any(m.startswith("READY=1") for m in got)
                                                   and sum(m == "WATCHDOG=1" for m in got) >= 3):
            got += receive(s, time.monotonic() + 0.2)
        assert any(m.startswith("READY=1") for m in got), (got, agent.log())
        assert sum(m == "WATCHDOG=1" for m in got) >= 3, "pings every WATCHDOG_USEC/2"
        assert agent.signal(signal.SIGTERM) == 0
        assert "STOPPING=1" in receive(s, time.monotonic() + 1.0)
    finally:
        agent.reap()


def test_notify_helpers(notify_socket: tuple[socket.socket, str]) -> None:
    s, path = notify_socket
    assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": path})
    assert s.recv(100) == b"READY=1"
    assert not sdnotify.notify("READY=1", {})
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": path + ".missing"})
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval({}) is None
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind("\0nodus-test-notify-%d" % os.getpid())
    try:
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@nodus-test-notify-%d" % os.getpid()})
        assert abstract.recv(100) == b"WATCHDOG=1"
    finally:
        abstract.close()
