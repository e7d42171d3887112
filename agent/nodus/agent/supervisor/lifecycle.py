"""The supervisor's main loop: cgroup → init command → sidecars → (a gang member's gate and
launch) → main command → wind down (teardown, sidecars, the cgroup) → outputs, and its status file.

It records what it sees in `run/status.json` (atomically, phases of `SupervisorPhase`) and pokes
the agent over a datagram socket after every write.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from ..cgroups import Cgroup
from ..clock import Clock
from ..launch import GangLaunch
from ..layout import AttemptLayout
from ..outputs import collect_outputs
from ..reasons import Reason
from ..statefile import read_json, write_json
from .member import GATE_POLL, await_head, write_launch_files
from .phase import Gate, SupervisorPhase as P
from .processes import MESSAGE_LINES, LINE_LIMIT, ForkExec, Processes
from .start_gate import await_gate
from .sidecars import Sidecars, Teardown

PREFIX_INIT = b"[init] "
PREFIX_SETUP = b"[setup] "
OWN_PREFIXES = ("[init] ", "[setup] ", "[teardown] ", "[sidecar ", "[nodus] ")
"""Log lines that are not the main command's."""


class Stop(Exception):
    """The agent (or someone) asked the attempt to stop."""

    def __init__(self, phase: P, reason: str, grace: float) -> None:
        super().__init__(reason)
        self.phase, self.reason, self.grace = phase, reason, grace


class Supervisor:
    def __init__(self, layout: AttemptLayout, spec: dict[str, Any], secrets: dict[str, Any],
                 notify_path: str | None, clock: Clock, gate_fd: int = -1) -> None:
        self.layout = layout
        self.gate_fd = gate_fd
        """The start gate's read end (start_gate.py), or -1: the agent had its state on disk before the fork."""
        self.clock = clock
        """Its deadlines (grace, init and sidecar timeouts, the gate's polls) and status.json's times."""
        self.spec = spec
        self.secret_env: dict[str, str] = dict(secrets.get("env") or {})
        self.sidecar_secret_env: dict[str, dict[str, str]] = dict(secrets.get("sidecars") or {})
        self.secret_values = sorted({v for v in self.secret_env.values() if len(v) >= 4} |
                                    {v for m in self.sidecar_secret_env.values() for v in m.values() if len(v) >= 4},
                                    key=len, reverse=True)
        self.notify_path = notify_path
        self.status: dict[str, Any] = {"attempt_id": spec["attempt_id"], "supervisor_pid": os.getpid(),
                                       "phase": P.SPAWNED, "reason": "", "message": "", "exit_code": None,
                                       "oom_killed": False, "start_time": None, "finish_time": None,
                                       "outputs": [], "process_groups": [], "cgroup": []}
        self.log_fd = os.open(layout.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.procs = Processes(self.log_fd, self.cwd, spec.get("user"), self.check_stop, clock)
        if spec.get("oci"):  # an image: the steps are runc containers of the attempt's pod
            from .containers import containers_for
            self.procs.runtime = containers_for(layout, spec) or self.procs.runtime
        self.sidecars = Sidecars(self.procs, self.note, float(spec.get("stop_grace", 10)), clock)
        self.teardown = Teardown(self.procs, self.note)

    def close(self) -> None:
        """After `run`: the attempt log and the steps' descriptors, for a supervisor that stays (stay.py)."""
        self.procs.close()
        os.close(self.log_fd)
        if self.gate_fd >= 0:  # it ended before its gate (a failed prepare)
            os.close(self.gate_fd)
            self.gate_fd = -1

    @property
    def cgroup(self) -> Cgroup:
        return self.procs.cgroup

    # -- status ------------------------------------------------------------------------------------
    def set(self, durable: bool = False, notify: bool = True, **changes: Any) -> None:
        self.status.update(changes)
        self.status["process_groups"] = list(self.procs.process_groups)
        self.status["time"] = self.clock.now()
        write_json(self.layout.status, self.status, mode=0o644, durable=durable)
        if notify:
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

    def finish(self, phase: P, reason: str, message: str, **extra: Any) -> None:
        assert phase.terminal
        self.set(durable=True, phase=phase, reason=reason, message=self.scrub(message), finish_time=self.clock.now(),
                 **extra)

    # -- stops -------------------------------------------------------------------------------------
    def stop_request(self) -> Stop | None:
        request = read_json(self.layout.cancel)
        if request is None and not self.procs.stop_signalled:
            return None
        request = request or {}
        default_phase = P.CANCELLED if request else P.LOST
        phase = P(request["phase"]) if request.get("phase") else default_phase
        reason = request.get("reason") or (Reason.CANCELLED if request else Reason.TERMINATED)
        grace = float(request.get("grace_seconds", self.spec.get("stop_grace", 10)))
        return Stop(phase, reason, grace)

    def check_stop(self) -> None:
        stop = self.stop_request()
        if stop is not None:
            raise stop

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
        return str(self.spec.get("working_dir") or self.layout.root)

    def run(self) -> None:
        # Not poked: a live supervisor's SPAWNED is no news to the agent (attempts.observe), and its wake
        # would take a CPU from this supervisor on its way to the main command.
        self.set(phase=P.SPAWNED, notify=False)
        try:
            self._prepare()
            self._run()
        except Stop as stop:
            self._stop_everything(stop.grace)
            self.finish(stop.phase, stop.reason, f"stopped: {stop.reason}")
        except Exception as e:  # noqa: BLE001 - a supervisor fault must still end in a status
            traceback.print_exc()
            self._stop_everything(0)
            self.finish(P.LOST, Reason.AGENT_FAULT, f"attempt supervisor failed: {type(e).__name__}: {e}")
        finally:
            try:
                self.procs.runtime.close()
            except Exception:  # noqa: BLE001 - what is left must not keep the status from being final
                traceback.print_exc()
            shutil.rmtree(self.layout.secrets, ignore_errors=True)
            # Every way out sweeps the cgroup (a failed init command may have left a process that quit
            # its session) and removes it, waiting up to 3 s per directory for killed tasks to leave a
            # loaded host: nobody comes back for a directory left now.
            self.cgroup.kill_all()
            for left in self.cgroup.remove(tries=300):
                print(f"cgroups: {left} still has tasks; left behind", file=sys.stderr, flush=True)

    def _prepare(self) -> None:
        limits = self.spec.get("resources") or {}
        if self.spec.get("cgroups", True):
            self.procs.cgroup = Cgroup.create(self.spec.get("cgroup_root", "nodus"),
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
        if isinstance(self.procs.runtime, ForkExec):
            self.procs.runtime.take_identity()  # its first cgroup move (and the kernel's wait) while the gate is shut
        if self.gate_fd >= 0:
            gate, self.gate_fd = self.gate_fd, -1
            if not await_gate(gate, self.procs.wake_r, self.check_stop):
                self.finish(P.LOST, Reason.AGENT_FAULT, "the agent went away before its state held this attempt; "
                            "nothing of it ran")
                return
        self.check_stop()  # a stop asked for before the spawn
        init = self.spec.get("init")
        if init and init.get("command"):
            self.set(phase=P.INITIALIZING)
            if not self._run_init(init):
                return
        sidecars = self.spec.get("sidecars") or []
        if sidecars:
            self.set(phase=P.STARTING_SIDECARS)
            for sc in sidecars:
                if not self._start_sidecar(sc):
                    return
        if self.spec.get("gang"):
            self._run_launch(self._await_launch())
        else:
            self._main_step(list(self.spec.get("command") or []),
                            self.env({"NODUS_READY_FILE": str(self.layout.ready / "main")}))

    def _run_init(self, init: dict[str, Any]) -> bool:
        timeout = float(init.get("timeout") or 1800)
        try:
            child = self.procs.spawn("init", list(init["command"]), self.env(), PREFIX_INIT)
        except OSError as e:
            self.finish(P.FAILED, Reason.INIT_FAILED, f"init command could not start: {e.strerror or e}")
            return False
        self.procs.wait(timeout, [child])
        if child.exit_code is None:
            self.note(f"init command timed out after {timeout:g}s")
            self.procs.terminate(child, 0)
            self.finish(P.FAILED, Reason.INIT_FAILED,
                        "\n".join([*child.tail, f"init command timed out after {timeout:g}s"][-3:]))
            return False
        self.procs.drain(child)
        self.procs.signal_group(child, signal.SIGKILL)  # what the init command left behind ends with it
        if child.exit_code != 0:
            lines = list(child.tail) or [f"init command exited with code {child.exit_code}"]
            self.finish(P.FAILED, Reason.INIT_FAILED, "\n".join(lines[-MESSAGE_LINES:]))
            return False
        return True

    def _start_sidecar(self, sc: dict[str, Any]) -> bool:
        name = sc["name"]
        ready_file = self.layout.ready / name
        ready_file.unlink(missing_ok=True)
        env = self.env({**(sc.get("env") or {}), "NODUS_READY_FILE": str(ready_file), "NODUS_SIDECAR": name},
                       self.sidecar_secret_env.get(name))
        problem = self.sidecars.start(sc, env, ready_file)
        if problem is None:
            return True
        self._fail(P.FAILED, Reason.SIDECAR_FAILED, problem)
        return False

    def _fail(self, phase: P, reason: str, message: str) -> None:
        """Ends the attempt before its main command ran to its end: noted, wound down, finished."""
        self.note(message.splitlines()[0])
        self._wind_down()
        self.finish(phase, reason, message)

    def _main_step(self, argv: list[str], env: dict[str, str], service: bool = False) -> None:
        """Runs the main command (or a gang member's main step) to its end and finishes the attempt.

        A `service` (a Ray worker) is only ever meant to end by a stop: exiting on its own loses the member.
        """
        oom_before = self.procs.runtime.oom_kills(None)
        try:
            main = self.procs.spawn("main", argv, env, None)
        except OSError as e:
            code = 126 if e.errno in (errno.EACCES, errno.ENOEXEC) else 127
            why = f"{e.strerror or e}{self.denied_hint(e)}"
            self.note(f"command could not start: {argv[:1]}: {why}")
            self._wind_down()
            self.finish(P.FAILED, Reason.ERROR, f"command could not start: {argv[0] if argv else ''}: {why}",
                        exit_code=code)
            return
        self.set(phase=P.RUNNING, start_time=self.clock.now(), main_pid=main.proc.pid)
        try:
            while main.exit_code is None:
                self.procs.wait(3600, [main])
        except Stop as stop:
            self.set(phase=P.STOPPING)
            self.procs.terminate(main, stop.grace)
            self.status["exit_code"] = main.exit_code
            raise  # run() stops the rest (teardown included) and finishes with the stop's phase
        code = main.exit_code
        assert code is not None
        if self._winds_down_at_once():
            self.status.update(phase=P.STOPPING, exit_code=code)  # the end follows at once: one write (ADR 0094)
        else:
            self.set(phase=P.STOPPING, exit_code=code)
        self.procs.signal_group(main, signal.SIGKILL)  # what the command left behind in its group
        oom = code != 0 and self.procs.runtime.oom_kills(main.proc) > oom_before
        self._wind_down()
        if service:
            lines = [f"the {argv[0]} service of this gang member exited on its own with code {code}",
                     *self.main_tail()[-(MESSAGE_LINES - 1):]]
            self.finish(P.LOST, Reason.GANG_MEMBER_EXITED, "\n".join(lines), exit_code=code, oom_killed=oom)
        elif oom:
            self.finish(P.FAILED, Reason.OOM_KILLED, "the command was killed by the kernel's OOM killer (memory limit "
                        f"{(self.spec.get('resources') or {}).get('memory_bytes', 0)} bytes)", exit_code=code,
                        oom_killed=True)
        elif code != 0:
            lines = self.main_tail() or [f"the command exited with code {code}"]
            self.finish(P.FAILED, Reason.ERROR, "\n".join(lines), exit_code=code)
        else:
            gang = self.spec.get("gang") or {}
            outputs, problem = collect_outputs(self.layout, self.spec.get("outputs") or [],
                                               default=int(gang.get("rank") or 0) == 0)
            if problem:
                self.finish(P.FAILED, Reason.OUTPUT_MISSING, problem, exit_code=code)
            else:
                self.finish(P.SUCCEEDED, Reason.COMPLETED, "", exit_code=code, outputs=outputs)

    def _winds_down_at_once(self) -> bool:
        """Nothing after the main command takes time: no teardown steps, sidecars or gang, no declared
        outputs and nothing in the outputs directory. Then STOPPING is not written on its own: the final
        status comes right after it, and each write is a file, a rename and a wake-up of the agent. The
        outputs directory, which every Assignment declares, counts only when something is in it (ADR 0112)."""
        if self.teardown.steps or self.spec.get("sidecars") or self.spec.get("gang"):
            return False
        if any(self.layout.translate(str(o.get("path"))) != self.layout.outputs for o in self.spec.get("outputs") or []):
            return False
        try:
            with os.scandir(self.layout.outputs) as entries:
                return next(entries, None) is None
        except OSError:
            return True  # no outputs directory: nothing to collect

    def denied_hint(self, e: OSError) -> str:
        """Why a program under an attempt's uid may be refused what root reached (ADR 0040)."""
        user = self.spec.get("user")
        if e.errno != errno.EACCES or not user:
            return ""
        return (f" (the attempt runs as uid {user['uid']}, which must be able to pass through every directory on "
                f"the way to the program and its working directory; a directory such as /root lets only its owner "
                f"through)")

    # -- a gang member -----------------------------------------------------------------------------
    def _await_launch(self) -> GangLaunch:
        """Waits at the gate (interruptibly, pumping sidecar output) until the agent writes launch.json."""
        gang = self.spec["gang"]
        self.set(gate=Gate.WAITING)
        self.note(f"gang member rank {gang.get('rank')} (epoch {gang.get('epoch')}): waiting at the gate")
        while (raw := read_json(self.layout.launch)) is None:
            self.procs.wait(GATE_POLL)
        self.check_stop()  # a stop that came with the launch wins: nothing of the launch starts
        launch = GangLaunch.parse(raw)  # a bad launch.json is the agent's fault: run() ends LOST AgentFault
        if launch.launch.rank != gang.get("rank"):
            raise ValueError(f"launch.json is for rank {launch.launch.rank}, this member is rank {gang.get('rank')}")
        self.set(gate=Gate.OPEN)
        self.note(f"the gate is open: {launch.launch.launcher} {launch.launch.role}")
        return launch

    def _run_launch(self, gl: GangLaunch) -> None:
        """Files → wait for the head → setup steps → the main step (teardown steps armed before setup)."""
        launch = gl.launch
        env = self.env({"NODUS_READY_FILE": str(self.layout.ready / "main")}, base=launch.env)
        write_launch_files(launch.files, self.spec.get("user"))
        if launch.waits_for_head:
            problem = await_head(gl.head, gl.head_timeout_s, self.procs.wait, self.note, self.clock)
            if problem is not None:
                self._fail(P.LOST, Reason.RENDEZVOUS_TIMEOUT, problem)
                return
        self.teardown.arm(list(launch.teardown), env)
        for number, step in enumerate(launch.setup, 1):
            if not self._run_setup(number, list(step), env):
                return
        self._main_step(list(launch.argv), env, service=not launch.runs_command)

    def _run_setup(self, number: int, argv: list[str], env: dict[str, str]) -> bool:
        """One setup step to its end; False (and FAILED LaunchFailed) when it fails.

        What a step leaves running (`ray start --head`'s daemons) stays: the main step needs it.
        """
        try:
            child = self.procs.spawn("setup", argv, env, PREFIX_SETUP)
        except OSError as e:
            self._fail(P.FAILED, Reason.LAUNCH_FAILED,
                       f"setup step {number} ({argv[0] if argv else ''}) could not start: {e.strerror or e}")
            return False
        while child.exit_code is None:
            self.procs.wait(3600, [child])
        self.procs.drain(child)
        if child.exit_code != 0:
            lines = list(child.tail)[-(MESSAGE_LINES - 1):]
            self._fail(P.FAILED, Reason.LAUNCH_FAILED,
                       "\n".join([f"setup step {number} ({argv[0]}) exited with code {child.exit_code}", *lines]))
            return False
        return True

    # -- the end -----------------------------------------------------------------------------------
    def main_tail(self) -> list[str]:
        """The last lines the main command wrote (init, setup, teardown, sidecar and Nodus lines left out)."""
        try:
            with open(self.layout.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
                data = f.read()
        except OSError:
            return []
        lines = [ln.decode(errors="replace").rstrip() for ln in data.split(b"\n")]
        own = [ln[:LINE_LIMIT] for ln in lines if ln.strip() and not ln.startswith(OWN_PREFIXES)]
        return own[-MESSAGE_LINES:]

    def _stop_everything(self, grace: float) -> None:
        for child in self.procs.children:
            if child.name in ("main", "init", "setup"):
                if child.exit_code is None:
                    self.procs.terminate(child, grace)
                self.procs.signal_group(child, signal.SIGKILL)
        self._wind_down()

    def _wind_down(self) -> None:
        """What is left once the command ended or failed to start: the armed teardown steps (once), what
        a setup step left running (a Ray head's daemons), the sidecars, then anything else in the cgroup."""
        self.teardown.run()
        for child in self.procs.children:
            if child.name == "setup":
                self.procs.signal_group(child, signal.SIGKILL)
        self.sidecars.stop()
        self.cgroup.kill_all()
