"""The process runtime: attempts run as plain processes in the node's own environment.

The runtime prepares an attempt's directories, secret files and `run/spec.json`, then spawns the
attempt's supervisor (`nodus.agent.supervisor`) in its own session with the supervisor lock already
held, and hands secret values to it over a pipe, so they never touch the disk except as the secret
mounts the Job asked for. Everything after the spawn is the supervisor's; the runtime only reads
`run/status.json`, probes the lock, writes stop requests and cleans up.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import signal
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from nodus.v1 import agent_pb2, common_pb2

from ..cgroups import DEFAULT_FS, Cgroup
from ..checkpointing import handshake_dir
from ..layout import AttemptLayout
from ..reasons import Reason
from ..spares import SpareDirs
from ..stayers import Stayers
from ..statefile import read_json, write_json
from ..supervisor.stay import IDLE_SECONDS
from ..uids import OFF, AttemptUids, UidRange, UidsExhausted
from ..zygote import Zygote, ZygoteError
from .spec import (DEFAULT_PATH, PASSED_ENV, TOKEN_MOUNT, WorkloadUser, attempt_env, code_entries, supervisor_spec,
                   write_secret_mounts)

__all__ = ["DEFAULT_PATH", "PASSED_ENV", "TOKEN_MOUNT", "ProcessRuntime", "Refused", "Spawned", "WorkloadUser",
           "attempt_env", "code_entries", "supervisor_spec", "sweep_cgroup", "write_secret_mounts"]

log = logging.getLogger("nodus.agent.runtime")


class Refused(Exception):
    """The runtime cannot run this assignment at all (the attempt fails with `reason`)."""

    def __init__(self, reason: str, message: str, phase: str = "FAILED") -> None:
        super().__init__(message)
        self.reason = reason
        self.phase = phase
        """FAILED for what any node would refuse; LOST when it is this node's fault (placed elsewhere)."""


def cgroups_fs() -> str:
    return str(DEFAULT_FS)


@dataclass(slots=True)
class Spawned:
    """A supervisor just started: our child (a cold spawn, to reap) or the zygote's (nothing to reap)."""

    pid: int | None
    proc: subprocess.Popen[bytes] | None = None


class ProcessRuntime:
    """Runs attempts without images, each under its own supervisor process."""

    runtime = common_pb2.RUNTIME_PROCESS
    runtimes: tuple[common_pb2.Runtime, ...] = (common_pb2.RUNTIME_PROCESS,)
    """What the node reports in its inventory."""

    def __init__(self, work_dir: Path, *, notify_address: str | None = None, cgroup_root: str = "nodus",
                 cgroups: bool = True, stop_grace: float = 10.0, python: str = sys.executable,
                 host_gpus: int = 0, base_env: Mapping[str, str] | None = None, workload_user: str = "",
                 attempt_uids: str = OFF, zygote: bool = True, stay_seconds: float = IDLE_SECONDS) -> None:
        self.work_dir = work_dir
        self.notify_address = notify_address
        self.cgroup_root = cgroup_root
        self.cgroups = cgroups
        self.stop_grace = stop_grace
        self.python = python
        self.host_gpus = host_gpus
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.user = WorkloadUser.lookup(workload_user) if workload_user else None
        """--workload-user: every attempt runs as it (the uid range is then not used)."""
        self.uids = self._attempt_uids(attempt_uids) if self.user is None else None
        """Each image-less attempt's own uid (ADR 0040); None: attempts run as the agent's own user."""
        # Attempt ids are unique in a cluster, not on a host that runs agents of several clusters
        # (tests, development): the work dir's digest keeps their cgroups apart.
        self.scope = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:8]
        self.zygote = Zygote(python, self._supervisor_env(), work_dir / "zygote.log") if zygote else None
        self.stay_seconds = stay_seconds
        """How long a supervisor waits for the next attempt of its Job (ADR 0124); 0: each attempt forks its own."""
        self.stayers = Stayers()
        self.spares = SpareDirs(work_dir / "spare")
        """Ended attempts' emptied trees, renamed into place for new attempts (ADR 0095)."""

    def _attempt_uids(self, text: str) -> AttemptUids | None:
        if text == OFF:
            return None
        rng = UidRange.parse(text)
        if os.geteuid() != 0:
            log.error("attempts run as the agent's own user (uid %d), all under one uid: only root can give each "
                      "attempt its own uid from --attempt-uids %s, so attempts on this node can read and signal "
                      "each other", os.geteuid(), rng)
            return None
        attempts = self.work_dir / "attempts"
        attempts.mkdir(parents=True, exist_ok=True)
        attempts.chmod(0o711)  # each uid passes through to its own directory; none lists the others' ids
        return AttemptUids(rng, self.work_dir / "uids.json", attempts)

    def layout(self, attempt_id: str) -> AttemptLayout:
        return AttemptLayout.of(self.work_dir, attempt_id)

    def user_of(self, layout: AttemptLayout) -> WorkloadUser | None:
        """Who the attempt's programs run as: --workload-user, its own uid, or None (the agent's user)."""
        if self.user is not None:
            return self.user
        uid = self.uids.uid_of(layout.root.name) if self.uids is not None else None
        return WorkloadUser.of_attempt(uid) if uid is not None else None

    def check(self, a: agent_pb2.Assignment) -> None:
        """Raises Refused for what the process runtime cannot run."""
        if a.image:
            raise Refused(Reason.IMAGE_UNSUPPORTED, f"this node runs the process runtime, which cannot run images "
                                              f"(the Job names image {a.image}); place it on a node with the "
                                              f"oci runtime or drop spec.image")
        for sc in a.sidecars:
            if sc.image:
                raise Refused(Reason.IMAGE_UNSUPPORTED, f"sidecar {sc.name} names image {sc.image}, which the process "
                                                  f"runtime cannot run")
            if not sc.command:
                raise Refused(Reason.SIDECAR_FAILED, f"sidecar {sc.name} has no command (the process runtime has no "
                                               f"image entrypoint to fall back on)")
        if not a.command and not a.args:
            raise Refused(Reason.ERROR, "the Job has no command (the process runtime has no image entrypoint to fall "
                                   "back on)")

    def pull(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> None:
        """Images are the oci runtime's; `check` refused any here."""

    def pull_progress(self, attempt_id: str) -> tuple[int, int] | None:
        return None

    def prepare(self, a: agent_pb2.Assignment) -> AttemptLayout:
        layout = self.layout(a.attempt_id)
        if not layout.root.exists():
            self.spares.take(layout.root)  # else make() makes every directory
        layout.make()
        layout.progress.touch()
        handshake_dir(layout).mkdir(exist_ok=True)
        user = self.user
        if user is None and self.uids is not None and not a.image:  # an image's pod has its user namespace
            try:
                user = WorkloadUser.of_attempt(self.uids.allocate(layout.root.name))
            except UidsExhausted as e:
                raise Refused(Reason.AGENT_FAULT, str(e), "LOST") from e
        if user is not None:
            layout.own(user.uid, user.gid)
        return layout

    def write_spec(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> None:
        user = self.user_of(layout)
        write_secret_mounts(a, layout, user)
        if user is not None:
            # What the agent materialized as root, read-only where it must be: the attempt's own copies, so its
            # uid reads them whatever modes the producer's archive carried (a 0700 outputs dir, 0600 files).
            for top in (layout.inputs, layout.volumes):
                for entry in top.iterdir() if top.is_dir() else ():
                    layout.own_tree(entry, user.uid, user.gid)
            for entry in code_entries(a, layout):  # the Job's code, unpacked or checked out as root
                layout.own_tree(entry, user.uid, user.gid)
        env = attempt_env(a, layout, self.base_env, self.host_gpus)
        spec = supervisor_spec(a, layout, env, cgroup_root=self.cgroup_root, cgroup_name=self.cgroup_name(layout),
                               cgroups=self.cgroups, stop_grace=self.stop_grace, user=user)
        # Not fsynced: the supervisor reads it at once, and a host crash ends the attempt anyway.
        write_json(layout.spec, spec, mode=0o600, durable=False)

    @property
    def notify_arg(self) -> str | None:
        """The notify address as it travels on a command line (an abstract socket's NUL as "@")."""
        addr = self.notify_address
        if addr and addr.startswith("\0"):
            return "@" + addr[1:]
        return addr

    def start_zygote(self) -> None:
        if self.zygote is not None:
            try:
                self.zygote.start()
            except OSError as e:
                log.warning("supervisor zygote unavailable (%s): attempts start cold", e)

    def close(self) -> None:
        self.stayers.close()
        if self.zygote is not None:
            self.zygote.close()
        if self.uids is not None:
            self.uids.close()

    def cgroup_name(self, layout: AttemptLayout) -> str:
        return f"{self.scope}-{layout.root.name}"

    def probe_cgroups(self) -> None:
        """Says once, at start, whether attempts will get cgroups (each supervisor's log says it again)."""
        if not self.cgroups:
            log.info("cgroups disabled (--cgroups false): attempts run without memory limits or OOM detection")
            return
        probe = Cgroup.create(self.cgroup_root, f"probe-{os.getpid()}")
        try:
            if probe.missing:
                log.warning("attempts run without some cgroup controllers: %s", ", ".join(probe.missing))
            else:
                log.info("attempts run in cgroup v%d under %s/%s (%s)", probe.version, cgroups_fs(),
                         self.cgroup_root, ", ".join(sorted(probe.paths)))
        finally:
            probe.remove()

    def _lock(self, layout: AttemptLayout) -> int:
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        return fd

    def spawn(self, a: agent_pb2.Assignment, layout: AttemptLayout, gate_fd: int = -1) -> Spawned:
        """Starts the attempt's supervisor with the lock held from before the fork; blocking (use a thread).

        Through the zygote when it works, else cold. Never twice: when the zygote fails after it may
        have forked, the lock tells whether a supervisor got it. With `gate_fd` (the read end of a pipe,
        supervisor/start_gate.py) the supervisor starts no step before the caller opens the gate.
        """
        secrets = {"env": {s.name: s.value for s in a.secret_env},
                   "sidecars": {sc.name: {s.name: s.value for s in sc.secret_env} for sc in a.sidecars if sc.secret_env}}
        if self.zygote is not None:
            lock_fd = self._lock(layout)
            try:
                return Spawned(self._spawn_warm(a, layout, secrets, lock_fd, gate_fd))
            except ZygoteError as e:
                log.warning("attempt %s: %s; starting its supervisor cold", a.attempt_id, e)
            finally:
                os.close(lock_fd)
            if self.supervisor_alive(layout):
                return Spawned(None)  # the zygote forked it before it failed: it runs
        return self._spawn_cold(layout, secrets, gate_fd)

    def _spawn_warm(self, a: agent_pb2.Assignment, layout: AttemptLayout, secrets: dict[str, Any], lock_fd: int,
                    gate_fd: int) -> int:
        """An idle supervisor of the attempt's Job runs it, or the zygote forks one that stays after it
        (ADR 0124)."""
        assert self.zygote is not None
        # A hand-off needs the start gate: a supervisor that took an attempt without saying so is killed
        # before the gate opens (stayers.py). Images (their pods) and gang members start afresh.
        stays = self.stay_seconds > 0 and gate_fd >= 0 and not a.image and not a.HasField("gang")
        job = a.job.uid if stays else ""
        fds = [lock_fd] if gate_fd < 0 else [lock_fd, gate_fd]
        request = {"attempt_dir": str(layout.root), "notify": self.notify_arg, "secrets": secrets}
        if job and (pid := self.stayers.hand(job, request, fds)) is not None:
            return pid
        pair = self.stayers.pair() if job else None
        if pair is None:
            return self.zygote.spawn(str(layout.root), self.notify_arg, secrets, lock_fd, gate_fd)
        ours, theirs = pair
        try:
            pid = self.zygote.spawn(str(layout.root), self.notify_arg, secrets, lock_fd, gate_fd,
                                    channel_fd=theirs.fileno(), stay_seconds=self.stay_seconds)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the supervisor holds its own copy
        self.stayers.add(job, pid, ours)
        return pid

    def _spawn_cold(self, layout: AttemptLayout, secrets: dict[str, Any], gate_fd: int = -1) -> Spawned:
        lock_fd = self._lock(layout)
        try:
            argv = [self.python, "-m", "nodus.agent.supervisor", str(layout.root), "--lock-fd", str(lock_fd)]
            if self.notify_arg:
                argv += ["--notify", self.notify_arg]
            if gate_fd >= 0:
                argv += ["--gate-fd", str(gate_fd)]
            passed = (lock_fd, gate_fd) if gate_fd >= 0 else (lock_fd,)
            with open(layout.run / "supervisor.log", "ab") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, pass_fds=passed, close_fds=True,
                                        env=self._supervisor_env())
        finally:
            os.close(lock_fd)  # the supervisor's copy keeps the lock
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(secrets).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; its missing status says so
        return Spawned(proc.pid, proc)

    def _supervisor_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.base_env.items() if k in PASSED_ENV or k.startswith("PYTHON")}
        env.setdefault("PATH", DEFAULT_PATH)
        if "NODUS_CGROUP_FS" in self.base_env:
            env["NODUS_CGROUP_FS"] = self.base_env["NODUS_CGROUP_FS"]
        return env

    # -- observing ---------------------------------------------------------------------------------
    @staticmethod
    def supervisor_alive(layout: AttemptLayout) -> bool:
        """Whether a supervisor holds the attempt's lock (pid reuse cannot fool a lock)."""
        try:
            fd = os.open(layout.lock, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    @staticmethod
    def read_status(layout: AttemptLayout) -> dict[str, Any] | None:
        return read_json(layout.status)

    def request_stop(self, layout: AttemptLayout, reason: str, grace: float, phase: str = "CANCELLED") -> None:
        """Writes the stop request, then wakes the supervisor with SIGTERM."""
        write_json(layout.cancel, {"reason": reason, "grace_seconds": grace, "phase": phase}, mode=0o600)
        status = read_json(layout.status) or {}
        pid = status.get("supervisor_pid")
        with self.stayers.guard:  # a supervisor that stays is not handed its next attempt in between (stayers.py)
            if pid and self.supervisor_alive(layout):
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def kill_leftovers(self, layout: AttemptLayout) -> None:
        """After a supervisor died abnormally: kill whatever of the attempt still runs."""
        status = read_json(layout.status) or {}
        for pgid in status.get("process_groups") or []:
            try:
                os.killpg(int(pgid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        cg = Cgroup.locate(self.cgroup_root, self.cgroup_name(layout))
        cg.kill_all()
        cg.remove()

    def remove(self, layout: AttemptLayout) -> None:
        """Forgets an ended attempt: what still runs in its cgroup, the cgroup, its directory, then its uid."""
        sweep_cgroup(layout)

        def onerror(func: Any, path: str, exc: Any) -> None:
            try:
                os.chmod(os.path.dirname(path), 0o700)
                func(path)
            except OSError:
                pass

        for p in [layout.secrets, *layout.secrets.glob("*")] if layout.secrets.exists() else []:
            try:
                p.chmod(0o700)
            except OSError:
                pass
        if not self.spares.give(layout.root):
            shutil.rmtree(layout.root, onerror=onerror)
        if self.uids is not None:
            if layout.root.exists():
                log.warning("attempt %s: its directory could not be removed; its uid stays held", layout.root.name)
            else:
                self.uids.release(layout.root.name)


def sweep_cgroup(layout: AttemptLayout) -> None:
    """The supervisor removes its cgroup after writing its final status; one killed in between leaves
    it (with whatever it had not killed yet). spec.json names the cgroup it was given (cgroup_name)."""
    spec = read_json(layout.spec) or {}
    if not spec.get("cgroups", False):
        return
    cg = Cgroup.locate(str(spec.get("cgroup_root") or "nodus"), str(spec.get("cgroup_name") or layout.root.name))
    if not cg.usable:
        return
    cg.kill_all()
    for left in cg.remove():
        log.warning("attempt %s: its cgroup %s could not be removed", layout.root.name, left)
