"""The per-attempt supervisor: `python -m nodus.agent.supervisor ATTEMPT_DIR --lock-fd N`.

The agent spawns one supervisor per attempt, in its own session, and the supervisor does the whole
local life of the attempt: cgroup → init command → sidecars (in order, each ready) → main command
→ sidecars stopped (in reverse) → outputs collected. It records what it sees in `run/status.json`
(atomically), pokes the agent over a datagram socket after every write, and exits. It holds an
flock on `run/supervisor.lock` for its whole life (inherited from the agent, which took it before
the spawn), so "is the supervisor alive?" is a lock probe that pid reuse cannot fool.

Because the supervisor, not the agent, is the workload's parent, killing the agent (even kill -9)
neither kills nor orphans the work; a restarted agent re-reads status.json and watches the lock.
The supervisor never talks to the coordinator: uploads, logs and progress are the agent's.

A gang member (spec.json has `gang`) stops at a gate after its sidecars: it writes `"gate":
"waiting"` and runs nothing more until the agent writes `run/launch.json` (a serialized
`launchers.model.Launch` with rank 0's endpoint and a wait budget). Then it writes `"gate": "open"`
and runs the launch: files → wait for the head → setup steps → the main step → teardown steps.

It is single-threaded (init and sidecar output is pumped through one select loop), so moving each
child into the attempt's cgroup (and then to the workload user) in `preexec_fn` before exec is safe.
"""
from __future__ import annotations

import argparse
import collections
import errno
import fcntl
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .cgroups import Cgroup
from .launch import GangLaunch, split_endpoint
from .layout import (CANCELLED, FAILED, INITIALIZING, LOST, RUNNING, SPAWNED, STARTING_SIDECARS, STOPPING,
                     SUCCEEDED, AttemptLayout)
from .outputs import collect_outputs
from .statefile import read_json, write_json

PREFIX_INIT = b"[init] "
PREFIX_SETUP = b"[setup] "
PREFIX_TEARDOWN = b"[teardown] "
GATE_POLL = 0.02
"""Seconds between looks for launch.json at the gate (a stop is noticed as often)."""
TEARDOWN_TIMEOUT = 60.0
"""Seconds one teardown step may run before it is killed."""
MESSAGE_LINES = 3
LINE_LIMIT = 400


class Stop(Exception):
    """The agent (or someone) asked the attempt to stop."""

    def __init__(self, phase: str, reason: str, grace: float) -> None:
        super().__init__(reason)
        self.phase, self.reason, self.grace = phase, reason, grace


@dataclass(slots=True)
class Child:
    """One process the supervisor started (init, a sidecar or the main command)."""

    name: str
    proc: subprocess.Popen[bytes]
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


class Supervisor:
    def __init__(self, layout: AttemptLayout, spec: dict[str, Any], secrets: dict[str, Any],
                 notify_path: str | None) -> None:
        self.layout = layout
        self.spec = spec
        self.secret_env: dict[str, str] = dict(secrets.get("env") or {})
        self.sidecar_secret_env: dict[str, dict[str, str]] = dict(secrets.get("sidecars") or {})
        self.secret_values = sorted({v for v in self.secret_env.values() if len(v) >= 4} |
                                    {v for m in self.sidecar_secret_env.values() for v in m.values() if len(v) >= 4},
                                    key=len, reverse=True)
        self.notify_path = notify_path
        self.status: dict[str, Any] = {"attempt_id": spec["attempt_id"], "supervisor_pid": os.getpid(),
                                       "phase": SPAWNED, "reason": "", "message": "", "exit_code": None,
                                       "oom_killed": False, "start_time": None, "finish_time": None,
                                       "outputs": [], "process_groups": [], "cgroup": []}
        self.selector = selectors.DefaultSelector()
        self.children: list[Child] = []
        self.sidecars: list[Child] = []
        self.teardown: list[tuple[tuple[str, ...], dict[str, str]]] = []
        """A gang member's teardown steps and their env, armed once its first launch step starts."""
        self.stop_signalled = False
        self.log_fd = os.open(layout.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.cgroup = Cgroup(0)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_r = wake_r
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(wake_r, selectors.EVENT_READ, None)

    # -- status ------------------------------------------------------------------------------------
    def set(self, durable: bool = False, **changes: Any) -> None:
        self.status.update(changes)
        self.status["time"] = time.time()
        write_json(self.layout.status, self.status, mode=0o644, durable=durable)
        self._notify()

    def _notify(self) -> None:
        if not self.notify_path:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.setblocking(False)
                s.sendto(self.spec["attempt_id"].encode(), self.notify_path)
        except OSError:
            pass  # the agent is away; it reads status.json when it comes back

    def scrub(self, text: str) -> str:
        for value in self.secret_values:
            text = text.replace(value, "***")
        return text

    def note(self, text: str) -> None:
        """A line from Nodus itself in the attempt log."""
        os.write(self.log_fd, b"[nodus] " + self.scrub(text).encode() + b"\n")

    # -- signals and waiting -----------------------------------------------------------------------
    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True

    def stop_request(self) -> Stop | None:
        request = read_json(self.layout.cancel)
        if request is None and not self.stop_signalled:
            return None
        request = request or {}
        default_phase = CANCELLED if request else LOST
        phase = request.get("phase") or default_phase
        reason = request.get("reason") or ("Cancelled" if request else "Terminated")
        grace = float(request.get("grace_seconds", self.spec.get("stop_grace", 10)))
        return Stop(phase, reason, grace)

    def check_stop(self) -> None:
        stop = self.stop_request()
        if stop is not None:
            raise stop

    def wait(self, timeout: float, children: Sequence[Child] = (), interruptible: bool = True) -> None:
        """Waits up to `timeout` for one of `children` to exit, pumping output meanwhile."""
        deadline = time.monotonic() + timeout
        checked = 0.0
        watched = {c.pidfd: c for c in children if c.pidfd >= 0}
        for fd in watched:
            self.selector.register(fd, selectors.EVENT_READ, "exit")
        try:
            while True:
                if interruptible and (self.stop_signalled or time.monotonic() - checked >= 0.5):
                    checked = time.monotonic()
                    self.check_stop()
                if any(c.exit_code is not None for c in children):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for key, _ in self.selector.select(min(left, 1.0)):
                    if key.fd == self.wake_r:
                        try:
                            os.read(self.wake_r, 512)
                        except BlockingIOError:
                            pass
                    elif isinstance(key.data, Child):
                        self._pump(key.data)
        finally:
            for fd in watched:
                self.selector.unregister(fd)

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
        deadline = time.monotonic() + timeout
        while child.pipe is not None and time.monotonic() < deadline:
            ready = self.selector.select(max(0.0, deadline - time.monotonic()))
            for key, _ in ready:
                if isinstance(key.data, Child):
                    self._pump(key.data)
                elif key.fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 512)
                    except BlockingIOError:
                        pass
        if child.pipe is not None:
            self._close_pipe(child)

    # -- processes ---------------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str], env: dict[str, str], prefix: bytes | None) -> Child:
        cgroup = self.cgroup
        user = self.spec.get("user")  # {"uid", "gid", "groups"} or None: run as the supervisor's user

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
                os.setuid(user["uid"])

        if prefix is None:
            out_fd, pipe = self.log_fd, None
        else:
            pipe, out_fd = os.pipe2(os.O_CLOEXEC)
        try:
            proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=out_fd,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    preexec_fn=child_setup)
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
        self.status["process_groups"] = sorted({*self.status["process_groups"], proc.pid})
        return child

    def signal_group(self, child: Child, sig: int) -> None:
        try:
            os.killpg(child.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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

    def stop_sidecars(self) -> None:
        grace = float(self.spec.get("stop_grace", 10))
        for sidecar in reversed(self.sidecars):
            self.terminate(sidecar, grace)

    # -- the attempt -------------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None, secret: dict[str, str] | None = None,
            base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (the spec's env unless given), then the secret env, `extra` and `secret` on top."""
        env = dict((self.spec.get("env") or {}) if base is None else base)
        env.update(self.secret_env)
        env.update(extra or {})
        env.update(secret or {})
        return env

    @property
    def cwd(self) -> str:
        return self.spec.get("working_dir") or str(self.layout.root)

    def run(self) -> None:
        self.set(phase=SPAWNED)
        try:
            self._prepare()
            self._run()
        except Stop as stop:
            self._stop_everything(stop.grace)
            self.finish(stop.phase, stop.reason, f"stopped: {stop.reason}")
        except Exception as e:  # noqa: BLE001 - a supervisor fault must still end in a status
            traceback.print_exc()
            self._stop_everything(0)
            self.finish(LOST, "AgentFault", f"attempt supervisor failed: {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(self.layout.secrets, ignore_errors=True)
            self.cgroup.remove()

    def _prepare(self) -> None:
        limits = self.spec.get("resources") or {}
        if self.spec.get("cgroups", True):
            self.cgroup = Cgroup.create(self.spec.get("cgroup_root", "nodus"),
                                        self.spec.get("cgroup_name") or self.layout.root.name,
                                        int(limits.get("memory_bytes") or 0), int(limits.get("cpu_millis") or 0))
            if self.cgroup.missing:
                print(f"cgroups: running without {', '.join(self.cgroup.missing)}", file=sys.stderr, flush=True)
            self.status["cgroup"] = [str(p) for p in self.cgroup.paths.values()]
        cwd = Path(self.cwd)
        if not cwd.exists():
            cwd.mkdir(parents=True, exist_ok=True)
            user = self.spec.get("user")
            if user and cwd.resolve().is_relative_to(self.layout.root.resolve()):
                os.chown(cwd, user["uid"], user["gid"])

    def _run(self) -> None:
        self.check_stop()  # a stop asked for before the spawn
        init = self.spec.get("init")
        if init and init.get("command"):
            self.set(phase=INITIALIZING)
            if not self._run_init(init):
                return
        sidecars = self.spec.get("sidecars") or []
        if sidecars:
            self.set(phase=STARTING_SIDECARS)
            for sc in sidecars:
                if not self._start_sidecar(sc):
                    return
        if self.spec.get("gang"):
            self._run_launch(self._await_launch())
        else:
            self._run_main()

    def _run_init(self, init: dict[str, Any]) -> bool:
        timeout = float(init.get("timeout") or 1800)
        try:
            child = self.spawn("init", list(init["command"]), self.env(), PREFIX_INIT)
        except OSError as e:
            self.finish(FAILED, "InitFailed", f"init command could not start: {e.strerror or e}")
            return False
        self.wait(timeout, [child])
        if child.exit_code is None:
            self.note(f"init command timed out after {timeout:g}s")
            self.terminate(child, 0)
            self.finish(FAILED, "InitFailed", "\n".join([*child.tail, f"init command timed out after {timeout:g}s"][-3:]))
            return False
        self.drain(child)
        self.signal_group(child, signal.SIGKILL)  # what the init command left behind ends with it
        if child.exit_code != 0:
            lines = list(child.tail) or [f"init command exited with code {child.exit_code}"]
            self.finish(FAILED, "InitFailed", "\n".join(lines[-MESSAGE_LINES:]))
            return False
        return True

    def _start_sidecar(self, sc: dict[str, Any]) -> bool:
        name = sc["name"]
        ready_file = self.layout.ready / name
        ready_file.unlink(missing_ok=True)
        env = self.env({**(sc.get("env") or {}), "NODUS_READY_FILE": str(ready_file), "NODUS_SIDECAR": name},
                       self.sidecar_secret_env.get(name))
        timeout = float(sc.get("startup_timeout") or 60)
        try:
            child = self.spawn(f"sidecar {name}", list(sc["command"]), env, f"[sidecar {name}] ".encode())
        except OSError as e:
            self._fail_sidecars(f"sidecar {name} could not start: {e.strerror or e}")
            return False
        self.sidecars.append(child)
        deadline = time.monotonic() + timeout
        while True:
            if ready_file.exists() or _listening(child.proc.pid):
                self.note(f"sidecar {name} is ready")
                return True
            if child.exit_code is not None:
                self.drain(child)
                lines = list(child.tail)[-2:]
                self._fail_sidecars("\n".join([f"sidecar {name} exited with code {child.exit_code} before it "
                                               f"was ready", *lines]))
                return False
            if time.monotonic() >= deadline:
                self._fail_sidecars(f"sidecar {name} was not ready within {timeout:g}s (no listening TCP "
                                    f"port and no $NODUS_READY_FILE)")
                return False
            self.wait(0.05, [child])

    def _fail_sidecars(self, message: str) -> None:
        self.note(message.splitlines()[0])
        self._wind_down()
        self.finish(FAILED, "SidecarFailed", message)

    def _run_main(self) -> None:
        argv = list(self.spec.get("command") or [])
        self._main_step(argv, self.env({"NODUS_READY_FILE": str(self.layout.ready / "main")}))

    def _main_step(self, argv: list[str], env: dict[str, str], service: bool = False) -> None:
        """Runs the main command (or a gang member's main step) to its end and finishes the attempt.

        A `service` (a Ray worker) is only ever meant to end by a stop: exiting on its own loses the member.
        """
        oom_before = self.cgroup.oom_kills()
        try:
            main = self.spawn("main", argv, env, None)
        except OSError as e:
            code = 126 if e.errno in (errno.EACCES, errno.ENOEXEC) else 127
            self.note(f"command could not start: {argv[:1]}: {e.strerror or e}")
            self._wind_down()
            self.finish(FAILED, "Error", f"command could not start: {argv[0] if argv else ''}: {e.strerror or e}",
                        exit_code=code)
            return
        self.set(phase=RUNNING, start_time=time.time(), main_pid=main.proc.pid)
        try:
            while main.exit_code is None:
                self.wait(3600, [main])
        except Stop as stop:
            self.set(phase=STOPPING)
            self.terminate(main, stop.grace)
            self.status["exit_code"] = main.exit_code
            raise  # run() stops the rest (teardown included) and finishes with the stop's phase
        code = main.exit_code
        assert code is not None
        self.set(phase=STOPPING, exit_code=code)
        self.signal_group(main, signal.SIGKILL)  # what the command left behind in its group
        oom = code != 0 and self.cgroup.oom_kills() > oom_before
        self._wind_down()
        if service:
            lines = [f"the {argv[0]} service of this gang member exited on its own with code {code}",
                     *self.main_tail()[-(MESSAGE_LINES - 1):]]
            self.finish(LOST, "GangMemberExited", "\n".join(lines), exit_code=code, oom_killed=oom)
        elif oom:
            self.finish(FAILED, "OOMKilled", "the command was killed by the kernel's OOM killer (memory limit "
                        f"{(self.spec.get('resources') or {}).get('memory_bytes', 0)} bytes)", exit_code=code,
                        oom_killed=True)
        elif code != 0:
            lines = self.main_tail() or [f"the command exited with code {code}"]
            self.finish(FAILED, "Error", "\n".join(lines), exit_code=code)
        else:
            gang = self.spec.get("gang") or {}
            outputs, problem = collect_outputs(self.layout, self.spec.get("outputs") or [],
                                               default=int(gang.get("rank") or 0) == 0)
            if problem:
                self.finish(FAILED, "OutputMissing", problem, exit_code=code)
            else:
                self.finish(SUCCEEDED, "Completed", "", exit_code=code, outputs=outputs)

    # -- a gang member -----------------------------------------------------------------------------
    def _await_launch(self) -> GangLaunch:
        """Waits at the gate (interruptibly, pumping sidecar output) until the agent writes launch.json."""
        gang = self.spec["gang"]
        self.set(gate="waiting")
        self.note(f"gang member rank {gang.get('rank')} (epoch {gang.get('epoch')}): waiting at the gate")
        while (raw := read_json(self.layout.launch)) is None:
            self.wait(GATE_POLL)
        self.check_stop()  # a stop that came with the launch wins: nothing of the launch starts
        launch = GangLaunch.parse(raw)  # a bad launch.json is the agent's fault: run() ends LOST AgentFault
        if launch.launch.rank != gang.get("rank"):
            raise ValueError(f"launch.json is for rank {launch.launch.rank}, this member is rank {gang.get('rank')}")
        self.set(gate="open")
        self.note(f"the gate is open: {launch.launch.launcher} {launch.launch.role}")
        return launch

    def _run_launch(self, gl: GangLaunch) -> None:
        launch = gl.launch
        env = self.env({"NODUS_READY_FILE": str(self.layout.ready / "main")}, base=launch.env)
        self._write_launch_files(launch.files)
        if launch.waits_for_head and not self._await_head(gl.head, gl.head_timeout_s):
            return
        self.teardown = [(step, env) for step in launch.teardown]
        for number, step in enumerate(launch.setup, 1):
            if not self._run_setup(number, list(step), env):
                return
        self._main_step(list(launch.argv), env, service=not launch.runs_command)

    def _write_launch_files(self, files: dict[str, str]) -> None:
        user = self.spec.get("user")
        for name, text in files.items():
            path = Path(name)
            missing = [p for p in path.parents if not p.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: the supervisor may be root, and the path may be in a directory the workload writes.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                data = memoryview(text.encode())
                while data:
                    data = data[os.write(fd, data):]
                if user:
                    os.fchown(fd, user["uid"], user["gid"])
            finally:
                os.close(fd)
            if user:
                for d in missing:
                    os.chown(d, user["uid"], user["gid"])

    def _await_head(self, head: str, timeout: float) -> bool:
        """Polls rank 0's endpoint until it accepts a TCP connection; False (and LOST) after `timeout`."""
        host, port = split_endpoint(head)
        self.note(f"waiting up to {timeout:g}s for the gang's head at {head}")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if _accepts(host, port, max(0.05, min(1.0, left))):
                self.note(f"the gang's head at {head} accepts connections")
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                message = (f"rank 0's rendezvous endpoint {head} did not accept connections within "
                           f"{timeout:g}s")
                self.note(message)
                self._wind_down()
                self.finish(LOST, "RendezvousTimeout", message)
                return False
            self.wait(min(0.2, left))

    def _run_setup(self, number: int, argv: list[str], env: dict[str, str]) -> bool:
        """One setup step to its end; False (and FAILED LaunchFailed) when it fails.

        What a step leaves running (`ray start --head`'s daemons) stays: the main step needs it.
        """
        try:
            child = self.spawn("setup", argv, env, PREFIX_SETUP)
        except OSError as e:
            self._fail_launch(f"setup step {number} ({argv[0] if argv else ''}) could not start: {e.strerror or e}")
            return False
        while child.exit_code is None:
            self.wait(3600, [child])
        self.drain(child)
        if child.exit_code != 0:
            lines = list(child.tail)[-(MESSAGE_LINES - 1):]
            self._fail_launch("\n".join([f"setup step {number} ({argv[0]}) exited with code {child.exit_code}",
                                         *lines]))
            return False
        return True

    def _fail_launch(self, message: str) -> None:
        self.note(message.splitlines()[0])
        self._wind_down()
        self.finish(FAILED, "LaunchFailed", message)

    def run_teardown(self) -> None:
        """The armed teardown steps, once, each bounded; their failures are logged, never the result."""
        steps, self.teardown = self.teardown, []
        for number, (argv, env) in enumerate(steps, 1):
            name = f"teardown step {number} ({argv[0] if argv else ''})"
            try:
                child = self.spawn("teardown", list(argv), env, PREFIX_TEARDOWN)
            except OSError as e:
                self.note(f"{name} could not start: {e.strerror or e}")
                continue
            self.wait(TEARDOWN_TIMEOUT, [child], interruptible=False)
            if child.exit_code is None:
                self.note(f"{name} did not end within {TEARDOWN_TIMEOUT:g}s; killed")
                self.terminate(child, 0)
            else:
                self.drain(child)
                self.signal_group(child, signal.SIGKILL)
                if child.exit_code != 0:
                    self.note(f"{name} exited with code {child.exit_code}")

    def main_tail(self) -> list[str]:
        """The last lines the main command wrote (init, setup, teardown, sidecar and Nodus lines left out)."""
        try:
            with open(self.layout.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
                data = f.read()
        except OSError:
            return []
        lines = [ln.decode(errors="replace").rstrip() for ln in data.split(b"\n")]
        own = [ln[:LINE_LIMIT] for ln in lines
               if ln.strip() and not ln.startswith(("[init] ", "[setup] ", "[teardown] ", "[sidecar ", "[nodus] "))]
        return own[-MESSAGE_LINES:]

    def _stop_everything(self, grace: float) -> None:
        for child in self.children:
            if child.name in ("main", "init", "setup"):
                if child.exit_code is None:
                    self.terminate(child, grace)
                self.signal_group(child, signal.SIGKILL)
        self._wind_down()

    def _wind_down(self) -> None:
        """What is left once the command ended or failed to start: the armed teardown steps (once), what
        a setup step left running (a Ray head's daemons), the sidecars, then anything else in the cgroup."""
        self.run_teardown()
        for child in self.children:
            if child.name == "setup":
                self.signal_group(child, signal.SIGKILL)
        self.stop_sidecars()
        self.cgroup.kill_all()

    def finish(self, phase: str, reason: str, message: str, **extra: Any) -> None:
        self.set(durable=True, phase=phase, reason=reason, message=self.scrub(message), finish_time=time.time(),
                 **extra)


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
    return False


def _accepts(host: str, port: int, timeout: float) -> bool:
    """Whether host:port accepts a TCP connection within `timeout` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _notify_address(text: str | None) -> str | None:
    if text and text.startswith("@"):
        return "\0" + text[1:]  # an abstract unix socket
    return text


def _from_zygote(request: dict[str, Any], lock_fd: int) -> None:
    """In a child the zygote forked: become the supervisor of request["attempt_dir"]."""
    layout = AttemptLayout(Path(request["attempt_dir"]))
    log = os.open(layout.run / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.set_inheritable(lock_fd, False)
    spec = read_json(layout.spec)
    if spec is None:
        print(f"no spec at {layout.spec}", file=sys.stderr)
        return
    Supervisor(layout, spec, request.get("secrets") or {}, _notify_address(request.get("notify"))).run()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="nodus-supervisor")
    p.add_argument("attempt_dir", nargs="?")
    p.add_argument("--lock-fd", type=int, default=-1)
    p.add_argument("--notify", default=None)
    p.add_argument("--zygote", action="store_true", help="fork supervisors on request (fd 0: the agent's socket)")
    args = p.parse_args(argv)
    if args.zygote:
        import importlib

        from .zygote import serve
        for module in ("tarfile", "psutil", "zstandard"):  # warm what supervisors need, once
            importlib.import_module(module)
        serve(_from_zygote)
        return
    if not args.attempt_dir:
        p.error("ATTEMPT_DIR is required")
    layout = AttemptLayout(Path(args.attempt_dir))
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
    Supervisor(layout, spec, secrets, _notify_address(args.notify)).run()


if __name__ == "__main__":
    main()
