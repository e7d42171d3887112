"""The supervisor's children and its one select loop: spawn, wait (pumping output), drain, terminate.

Single-threaded: init, setup, teardown and sidecar output is pumped through one selector, and a
signal wakes it through a pipe (`signal.set_wakeup_fd`), so the supervisor may take on the attempt's
cgroup and user for the instant it starts a step (identity.py, ADR 0072).

How a step's process is made and signalled is a `StepRuntime` (ADR 0018's seam): `ForkExec` here
(vfork and exec into the attempt's cgroup), or the runc containers of `containers.py`; waiting,
output, stops and the status file are the same path for both.
"""
from __future__ import annotations

import collections
import os
import selectors
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from ..cgroups import Cgroup
from ..clock import Clock
from .identity import AttemptIdentity, clear_ambient

MESSAGE_LINES = 3
"""Lines of a child's output kept for the attempt's message."""
LINE_LIMIT = 400
STOP_CHECK_INTERVAL = 0.5
"""Seconds between looks for a stop request while waiting (a signal is noticed at once)."""


class StepProcess(Protocol):
    """A step's running process as the supervisor waits for it (a Popen, or a container's init)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None:
        """The exit status once it exited (signal N as -N or 128+N), else None."""


class StepRuntime(Protocol):
    """How a step's process is made, signalled, and what is left of the steps cleaned up."""

    def launch(self, name: str, argv: list[str], env: dict[str, str], stdout: int) -> StepProcess:
        """Starts the step with `stdout` as its stdout and stderr; raises OSError when it cannot start."""

    def signal(self, proc: StepProcess, sig: int) -> None:
        """Delivers `sig` to the step and what it started (SIGKILL: all of it)."""

    def oom_kills(self, proc: StepProcess | None) -> int:
        """How often the OOM killer struck `proc`'s step so far (None: before it started)."""

    def close(self) -> None:
        """Removes what the steps left once the attempt ended."""


@dataclass(slots=True)
class Child:
    """One process the supervisor started (init, a sidecar, a setup or teardown step, or the main command)."""

    name: str
    proc: StepProcess
    pidfd: int
    prefix: bytes = b""
    pipe: int | None = None
    partial: bytes = b""
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=MESSAGE_LINES))

    @property
    def exit_code(self) -> int | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        return 128 - rc if rc < 0 else rc


class Processes:
    """Every child of one supervisor, the attempt log they write to, and the wait that pumps them."""

    def __init__(self, log_fd: int, cwd: str, user: dict[str, Any] | None, check_stop: Callable[[], None],
                 clock: Clock) -> None:
        self.log_fd = log_fd
        self.cwd = cwd
        self.user = user
        """{"uid", "gid", "groups"} or None: children run as the supervisor's user."""
        self.check_stop = check_stop
        """Raises the supervisor's Stop when a stop was asked for; called by interruptible waits."""
        self.clock = clock
        """Every wait's deadline is on it (the supervisor's one clock, from __main__)."""
        self.cgroup = Cgroup(0)
        """Where children go; the supervisor replaces it once it created the attempt's cgroup."""
        self.runtime: StepRuntime = ForkExec(self)
        """How children are made; the supervisor replaces it for an attempt that runs an image."""
        self.children: list[Child] = []
        self.process_groups: list[int] = []
        self.stop_signalled = False
        self.selector = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_r, self.wake_w = wake_r, wake_w
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(wake_r, selectors.EVENT_READ, None)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True

    def close(self) -> None:
        """Gives back every descriptor of the attempt's steps and the signal wake-up pipe: a supervisor that
        stays for the next attempt (stay.py) must not carry this one's."""
        for child in self.children:
            if child.pipe is not None:
                os.close(child.pipe)
                child.pipe = None
            if child.pidfd >= 0:
                os.close(child.pidfd)
                child.pidfd = -1
        signal.set_wakeup_fd(-1)
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def wait(self, timeout: float, children: Sequence[Child] = (), interruptible: bool = True) -> None:
        """Waits up to `timeout` for one of `children` to exit, pumping output meanwhile."""
        deadline = self.clock.monotonic() + timeout
        checked = float("-inf")  # look for a stop before the first select
        watched = {c.pidfd: c for c in children if c.pidfd >= 0}
        for fd in watched:
            self.selector.register(fd, selectors.EVENT_READ, "exit")
        try:
            while True:
                if interruptible and (self.stop_signalled or self.clock.monotonic() - checked >= STOP_CHECK_INTERVAL):
                    checked = self.clock.monotonic()
                    self.check_stop()
                if any(c.exit_code is not None for c in children):
                    return
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return
                for key, _ in self.selector.select(min(left, 1.0)):
                    if key.fd == self.wake_r:
                        self._read_wake()
                    elif isinstance(key.data, Child):
                        self._pump(key.data)
        finally:
            for fd in watched:
                self.selector.unregister(fd)

    def _read_wake(self) -> None:
        try:
            os.read(self.wake_r, 512)
        except BlockingIOError:
            pass

    def _pump(self, child: Child) -> None:
        assert child.pipe is not None
        try:
            data = os.read(child.pipe, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(child)
            return
        buf = child.partial + data
        lines = buf.split(b"\n")
        child.partial = lines.pop()
        if len(child.partial) > 65536:
            lines.append(child.partial)
            child.partial = b""
        self._emit(child, lines)

    def _emit(self, child: Child, lines: list[bytes]) -> None:
        if not lines:
            return
        out = b"".join(child.prefix + line + b"\n" for line in lines)
        os.write(self.log_fd, out)
        for line in lines:
            text = line.decode(errors="replace").rstrip()
            if text:
                child.tail.append(text[:LINE_LIMIT])

    def _close_pipe(self, child: Child) -> None:
        if child.pipe is None:
            return
        if child.partial:
            self._emit(child, [child.partial])
            child.partial = b""
        self.selector.unregister(child.pipe)
        os.close(child.pipe)
        child.pipe = None

    def drain(self, child: Child, timeout: float = 1.0) -> None:
        """Reads what an exited child left in its pipe (its own children may hold it open)."""
        deadline = self.clock.monotonic() + timeout
        while child.pipe is not None and self.clock.monotonic() < deadline:
            ready = self.selector.select(max(0.0, deadline - self.clock.monotonic()))
            for key, _ in ready:
                if isinstance(key.data, Child):
                    self._pump(key.data)
                elif key.fd == self.wake_r:
                    self._read_wake()
        if child.pipe is not None:
            self._close_pipe(child)

    def spawn(self, name: str, argv: list[str], env: dict[str, str], prefix: bytes | None) -> Child:
        """Starts a child through the runtime; `prefix` None: its output goes to the log unprefixed."""
        if prefix is None:
            out_fd, pipe = self.log_fd, None
        else:
            pipe, out_fd = os.pipe2(os.O_CLOEXEC)
        try:
            proc = self.runtime.launch(name, argv, env, out_fd)
        finally:
            if pipe is not None:
                os.close(out_fd)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = -1
        child = Child(name, proc, pidfd, prefix or b"", pipe)
        if pipe is not None:
            os.set_blocking(pipe, False)
            self.selector.register(pipe, selectors.EVENT_READ, child)
        self.children.append(child)
        self.process_groups = sorted({*self.process_groups, proc.pid})
        return child

    def signal_group(self, child: Child, sig: int) -> None:
        self.runtime.signal(child.proc, sig)

    def terminate(self, child: Child, grace: float) -> None:
        """SIGTERM to the child's process group, SIGKILL after `grace` seconds."""
        if child.exit_code is None:
            self.signal_group(child, signal.SIGTERM)
            self.wait(grace, [child], interruptible=False)
        self.signal_group(child, signal.SIGKILL)
        if child.exit_code is None:
            self.wait(5.0, [child], interruptible=False)
        if child.pipe is not None:
            self.drain(child, 0.5)


class ForkExec:
    """The process runtime's steps: each in its own session, in the attempt's cgroup, as the workload user.

    Started with vfork while the supervisor wears the attempt's identity (ADR 0072); where it cannot (a
    thread runs, the way back to its own cgroup is shut), the child joins them in a `preexec_fn`, which
    costs a full fork.
    """

    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        self.identity: AttemptIdentity | None = None
        self.identity_of: Cgroup | None = None
        """The cgroup `identity` was made for (the supervisor replaces its cgroup once, in its prepare)."""

    def take_identity(self) -> None:
        """Finds out now whether steps can start with vfork (AttemptIdentity.of, whose proof of the way back
        is the supervisor's first cgroup move): the supervisor calls it before it waits at its start gate."""
        if self.identity_of is not self.procs.cgroup:
            self.identity_of = self.procs.cgroup
            self.identity = AttemptIdentity.of(self.procs.cgroup, self.procs.user)

    def launch(self, name: str, argv: list[str], env: dict[str, str], stdout: int) -> StepProcess:
        self.take_identity()
        if self.identity is None or threading.active_count() != 1:  # a thread since: setresuid would change it too
            return self._launch_forked(argv, env, stdout)
        with self.identity.worn():
            return subprocess.Popen(argv, env=env, cwd=self.procs.cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def _launch_forked(self, argv: list[str], env: dict[str, str], stdout: int) -> StepProcess:
        cgroup = self.procs.cgroup
        user = self.procs.user

        def child_setup() -> None:
            """In the child, before exec: cgroup, OOM score, then the workload user (in that order:
            only root may write cgroup.procs)."""
            if cgroup.usable:
                try:
                    cgroup.attach()
                except OSError:
                    pass  # run without rather than fail; the supervisor logged what is missing
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("0")  # the supervisor is protected from the OOM killer; its workload is not
            except OSError:
                pass
            if user:
                os.setgroups(user.get("groups") or [])
                os.setgid(user["gid"])
                os.setuid(user["uid"])  # real, effective and saved: the kernel's uid rules now apply
                clear_ambient()

        return subprocess.Popen(argv, env=env, cwd=self.procs.cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                preexec_fn=child_setup)

    def signal(self, proc: StepProcess, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # its session's process group: what it started goes with it
        except (ProcessLookupError, PermissionError):
            pass

    def oom_kills(self, proc: StepProcess | None) -> int:
        return self.procs.cgroup.oom_kills()  # every step is in the attempt's cgroup

    def close(self) -> None:
        """Nothing: the supervisor's cgroup sweep (kill_all) ends what a step left."""
