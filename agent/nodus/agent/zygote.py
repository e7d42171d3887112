"""A warm, single-threaded process that forks attempt supervisors on the agent's request.

Starting a Python interpreter per attempt costs ~50 ms of CPU and most of the create→Running
latency. The agent therefore keeps one zygote (`python -m nodus.agent.supervisor --zygote`, its
own session, modules preloaded) connected over a unix socket pair. For each attempt the agent takes
the supervisor lock, sends the attempt directory, the notify address and the secret values, with
the lock's descriptor attached (SCM_RIGHTS); the zygote forks, the child calls setsid() and becomes
the attempt's supervisor holding the lock, and the zygote answers with its pid. Forking a process
with no threads is safe, and costs a millisecond. A second descriptor may come with the lock: the read
end of the attempt's start gate (supervisor/start_gate.py), which the child keeps too.

The zygote lives as long as its socket: when the agent exits or dies, it reads EOF and exits, and
the supervisors it forked (in their own sessions) keep running. If the zygote is unusable the
runtime falls back to a cold `python -m nodus.agent.supervisor` spawn.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

HEADER = struct.Struct("!I")
MAX_MESSAGE = 64 << 20


class ZygoteError(Exception):
    pass


def _send(sock: socket.socket, payload: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(payload).encode()
    frame = HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [frame[:4096]], fds)
        frame = frame[sent:]
    sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int, first: bytes = b"") -> bytes:
    buf = bytearray(first)
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise EOFError("socket closed")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, with_fds: bool = False) -> tuple[dict[str, Any], list[int]]:
    """One framed message (and the descriptors that came with its first bytes); EOFError at the end. It
    reads no byte past the message: on a supervisor's channel (supervisor/stay.py) the next may follow."""
    fds: list[int] = []
    if with_fds:
        first, fds, _, _ = socket.recv_fds(sock, HEADER.size, 4)
    else:
        first = sock.recv(HEADER.size)
    if not first:
        raise EOFError("socket closed")
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size, first))
    if length > MAX_MESSAGE:
        raise ZygoteError(f"message of {length} bytes refused")
    return json.loads(_recv_exact(sock, length)), fds


# -- the agent's side --------------------------------------------------------------------------------
class Zygote:
    """The agent's handle on its zygote process."""

    def __init__(self, python: str, env: Mapping[str, str], log_path: Path) -> None:
        self.python = python
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            self._start()

    def _start(self) -> None:
        self._close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.set_inheritable(False)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([self.python, "-m", "nodus.agent.supervisor", "--zygote"],
                                             stdin=theirs.fileno(), stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, close_fds=True, env=self.env)
        finally:
            theirs.close()
        self.sock = ours

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def spawn(self, attempt_dir: str, notify: str | None, secrets: dict[str, Any], lock_fd: int,
              gate_fd: int = -1, timeout: float = 15.0, channel_fd: int = -1, stay_seconds: float = 0.0) -> int:
        """Has the zygote fork a supervisor for `attempt_dir`; returns its pid. Blocking. With `gate_fd`
        (a pipe's read end) the supervisor starts no step before the agent opens the gate; with `channel_fd`
        (a socket) it stays for the next attempts the agent hands it there (supervisor/stay.py)."""
        with self.lock:
            if not self.alive:
                self._start()
            assert self.sock is not None
            try:
                self.sock.settimeout(timeout)
                fds = [lock_fd] if gate_fd < 0 else [lock_fd, gate_fd]
                if channel_fd >= 0:
                    fds.append(channel_fd)
                _send(self.sock, {"attempt_dir": attempt_dir, "notify": notify, "secrets": secrets,
                                  "stay": channel_fd >= 0, "stay_seconds": stay_seconds}, fds)
                reply, _ = _recv(self.sock)
            except (OSError, EOFError, ValueError) as e:
                self._close()
                raise ZygoteError(f"the supervisor zygote failed: {e}") from e
            if "pid" not in reply:
                raise ZygoteError(str(reply.get("error") or reply))
            return int(reply["pid"])

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)  # it exits on EOF
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        with self.lock:
            self._close()


# -- the zygote's side ---------------------------------------------------------------------------
def serve(run_supervisor: Any) -> None:
    """The zygote's loop: fd 0 is the agent's socket. `run_supervisor(request, lock_fd, gate_fd)` runs in the
    child (gate_fd -1: no gate came); with request["stay"], the last descriptor is the channel of a supervisor
    that stays (supervisor/stay.py), passed as a fourth argument."""
    sock = socket.socket(fileno=0)
    os.set_blocking(0, True)
    devnull = os.open(os.devnull, os.O_RDONLY)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        ready, _, _ = select.select([sock], [], [], 1.0)
        _reap()
        if not ready:
            continue
        try:
            request, fds = _recv(sock, with_fds=True)
        except (EOFError, OSError):
            break  # the agent is gone: supervisors already forked keep running on their own
        channel_fd = fds.pop() if request.get("stay") and fds else -1
        if len(fds) not in (1, 2):
            for fd in [*fds, channel_fd] if channel_fd >= 0 else fds:
                os.close(fd)
            _send(sock, {"error": "expected a lock descriptor and at most a gate's (and a stay channel's)"})
            continue
        lock_fd, gate_fd = fds[0], fds[1] if len(fds) == 2 else -1
        if channel_fd >= 0:
            fds.append(channel_fd)  # closed here after the fork, as the others
        pid = os.fork()
        if pid == 0:  # the supervisor
            code = 0
            try:
                sock.close()
                os.setsid()
                os.dup2(devnull, 0)
                if channel_fd >= 0:
                    run_supervisor(request, lock_fd, gate_fd, channel_fd)
                else:
                    run_supervisor(request, lock_fd, gate_fd)
            except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
