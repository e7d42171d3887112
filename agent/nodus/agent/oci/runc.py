"""A thin typed wrapper over the runc CLI, with its own `--root` under the agent's state dir.

Containers are run detached (`runc run --detach`, or `runc create` then `runc start`): the container's init is then
a child of the caller only if the caller is a child subreaper (`become_subreaper`), which is how
the supervisor waits for a container's exit code like any child's. The container's stdio is
runc's own, so `create` hands it the attempt's log; runc's own errors go to a JSON log file
beside the bundle and come back as a `RuncError` (a missing or existing container typed apart).
"""
from __future__ import annotations

import ctypes
import enum
import json
import os
import select
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cgroups import Cgroup

PR_SET_CHILD_SUBREAPER = 36
RUNC_TIMEOUT = 60.0
"""Seconds one runc command may take (create includes mounting and the namespaces' setup)."""


class RuncError(Exception):
    """runc refused or failed an operation; `message` is runc's own last error line."""

    def __init__(self, op: str, container_id: str, message: str) -> None:
        super().__init__(f"runc {op} {container_id}: {message}")
        self.op, self.container_id, self.message = op, container_id, message


class ContainerNotFound(RuncError):
    """No container of that id under this root."""


class ContainerExists(RuncError):
    """A container of that id already exists under this root (delete it first)."""


class RuncMissing(RuncError):
    """The runc binary is not installed or not on the PATH."""


class ContainerStatus(enum.StrEnum):
    CREATING = "creating"
    """runc create is still setting it up."""
    CREATED = "created"
    """Set up, its process waiting for `runc start`."""
    RUNNING = "running"
    """Its process runs."""
    PAUSED = "paused"
    """Frozen (runc pause, or the cgroup freezer)."""
    STOPPED = "stopped"
    """Its process exited; the container waits for `runc delete`."""


@dataclass(frozen=True, slots=True)
class ContainerState:
    """`runc state`: what runc knows of one container."""

    id: str
    pid: int
    status: ContainerStatus
    bundle: str
    created: str

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ContainerState:
        return cls(str(raw["id"]), int(raw.get("pid") or 0), ContainerStatus(raw["status"]), str(raw.get("bundle") or ""),
                   str(raw.get("created") or ""))


def become_subreaper() -> None:
    """Makes the calling process the reaper of its orphaned descendants (a detached container's init)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Runc:
    def __init__(self, root: Path, binary: str = "runc") -> None:
        self.root = root
        """runc's state directory for this agent (never the host's default /run/runc)."""
        self.binary = binary

    def _argv(self, *args: str, log: Path | None = None) -> list[str]:
        logging = ["--log", str(log)] if log is not None else []
        return [self.binary, "--root", str(self.root), *logging, "--log-format", "json", *args]

    def _call(self, op: str, container_id: str, *args: str) -> str:
        try:
            done = subprocess.run(self._argv(*args), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=RUNC_TIMEOUT)
        except FileNotFoundError as e:
            raise RuncMissing(op, container_id, f"{self.binary} is not installed ({e.strerror})") from e
        if done.returncode != 0:
            raise _error(op, container_id, _last_error(done.stderr) or f"exit code {done.returncode}")
        return done.stdout

    def create(self, container_id: str, bundle: Path, stdout: int) -> int:
        """Creates the container (its process waits for `start`) with `stdout` as its stdout and
        stderr; returns its init's host pid."""
        return self._detached("create", container_id, bundle, stdout)

    def run(self, container_id: str, bundle: Path, stdout: int) -> int:
        """Creates and starts the container in one runc call (`run --detach`: one runc process fewer than
        create + start, the container running when it returns); returns its init's host pid."""
        return self._detached("run", container_id, bundle, stdout, "--detach")

    def _detached(self, op: str, container_id: str, bundle: Path, stdout: int, *flags: str) -> int:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        log, pid_file = bundle / "runc.log", bundle / "init.pid"
        log.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        argv = self._argv(op, *flags, "--bundle", str(bundle), "--pid-file", str(pid_file), container_id, log=log)
        try:
            # runc's stdio becomes the container's, so it must not be a pipe this call reads to its end.
            runc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stdout)
        except FileNotFoundError as e:
            raise RuncMissing(op, container_id, f"{self.binary} is not installed ({e.strerror})") from e
        code = wait_exit(runc, RUNC_TIMEOUT)
        if code != 0:
            text = log.read_text() if log.exists() else ""
            raise _error(op, container_id, _last_error(text) or f"exit code {code}")
        return int(pid_file.read_text())

    def start(self, container_id: str) -> None:
        self._call("start", container_id, "start", container_id)

    def state(self, container_id: str) -> ContainerState:
        return ContainerState.parse(json.loads(self._call("state", container_id, "state", container_id)))

    def list(self) -> list[ContainerState]:
        """Every container under this root (none when the root does not exist yet)."""
        raw = json.loads(self._call("list", "", "list", "--format", "json") or "null")
        return [ContainerState.parse(item) for item in raw or []]

    def kill(self, container_id: str, sig: int = signal.SIGTERM, all_processes: bool = False) -> None:
        """Signals the container's init (`all_processes`: every process in its cgroup)."""
        args = ["kill", *(["--all"] if all_processes else []), container_id, str(int(sig))]
        self._call("kill", container_id, *args)

    def delete(self, container_id: str, force: bool = False) -> None:
        """Removes the container (`force`: killing it first); a container already gone is not an error."""
        try:
            self._call("delete", container_id, "delete", *(["--force"] if force else []), container_id)
        except ContainerNotFound:
            pass

    def stats(self, container_id: str) -> dict[str, Any]:
        """`runc events --stats`: the container's cgroup counters once (memory, cpu, pids)."""
        out = json.loads(self._call("events", container_id, "events", "--stats", container_id))
        return dict(out.get("data") or {})

    def oom_kills(self, container_id: str) -> int:
        """How often the OOM killer struck in the container's cgroup (readable until `delete`)."""
        return container_cgroup(self.state(container_id)).oom_kills()


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """`proc`'s exit code, woken by its pidfd the moment it exits; killed (TimeoutExpired) after `timeout` s.

    Not `Popen.wait(timeout)`: that polls with sleeps doubling up to 50 ms, so a runc run --detach that took
    35 ms returned after 64 ms, on every container's way to running (docs/adr/0076)."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # it exited and was reaped already, or no pidfds (Linux < 5.3)
        return proc.wait(timeout)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(pidfd)
    return proc.wait()


def container_cgroup(state: ContainerState) -> Cgroup:
    """The container's cgroup, from the cgroupsPath its bundle asked for."""
    config = json.loads((Path(state.bundle) / "config.json").read_text())
    path = str(config["linux"]["cgroupsPath"]).strip("/")
    parent, _, name = path.rpartition("/")
    return Cgroup.locate(parent, name)


def _last_error(text: str) -> str:
    """runc's last error message in its JSON log lines (plain lines are taken as they are)."""
    message = ""
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            message = line.strip() or message
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            message = str(entry.get("msg") or message)
    return message


def _error(op: str, container_id: str, message: str) -> RuncError:
    if "does not exist" in message:
        return ContainerNotFound(op, container_id, message)
    if "already exists" in message or "with given ID already" in message:
        return ContainerExists(op, container_id, message)
    return RuncError(op, container_id, message)
