"""Where an attempt's files live, shared by the agent and the attempt's supervisor.

    <work>/attempts/<attempt>/
        state/ inputs/ outputs/      NODUS_STATE_DIR, NODUS_INPUTS_DIR, NODUS_OUTPUTS_DIR
        logs/attempt.log             stdout+stderr of the main command; init and sidecars prefixed
        run/spec.json                what the supervisor runs (written by the agent; no secret values)
        run/status.json              what the supervisor observed (written by the supervisor)
        run/cancel.json              a stop request (written by the agent)
        run/launch.json              a gang member's launch, opening its gate (written by the agent)
        run/supervisor.lock          flock held by the supervisor for its whole life
        run/progress.jsonl           NODUS_PROGRESS
        run/ready/<name>             NODUS_READY_FILE of the main command and of each sidecar
        run/secrets/<name>/<key>     secret mounts, 0400, removed when the attempt ends
        run/collected/<output>       outputs as uploaded (directories as tar.zst)

Under an attempt's own uid (ADR 0040, `own`): the attempt directory is root's with the attempt's
group, 01770 (no other uid enters it; the program adds files but cannot move what Nodus put there);
state/, outputs/, run/tmp, run/ready, run/checkpoint and run/progress.jsonl are the attempt's, 0700
(0600); run/ is 0711 (the program reaches its own entries, lists nothing); run/secrets is the
attempt's, 0500 with 0400 files; the agent, as root, reads and writes all of it.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

# Phases as the supervisor writes them; the agent maps them onto nodus.v1.AttemptPhase.
SPAWNED = "SPAWNED"  # the supervisor runs and has started nothing yet (the agent keeps the phase it had)
INITIALIZING = "INITIALIZING"
STARTING_SIDECARS = "STARTING_SIDECARS"
RUNNING = "RUNNING"
STOPPING = "STOPPING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
LOST = "LOST"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, LOST})

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def safe_name(attempt_id: str) -> str:
    """A directory and cgroup name for an attempt id: the id itself when it is tame, else a digest."""
    if _SAFE.match(attempt_id):
        return attempt_id
    return "a-" + hashlib.sha256(attempt_id.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class AttemptLayout:
    root: Path

    @classmethod
    def of(cls, work_dir: Path, attempt_id: str) -> "AttemptLayout":
        return cls(work_dir / "attempts" / safe_name(attempt_id))

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def log(self) -> Path:
        return self.logs / "attempt.log"

    @property
    def spec(self) -> Path:
        return self.run / "spec.json"

    @property
    def status(self) -> Path:
        return self.run / "status.json"

    @property
    def cancel(self) -> Path:
        return self.run / "cancel.json"

    @property
    def launch(self) -> Path:
        """A gang member's serialized Launch and rendezvous; the supervisor waits at the gate for it."""
        return self.run / "launch.json"

    @property
    def lock(self) -> Path:
        return self.run / "supervisor.lock"

    @property
    def progress(self) -> Path:
        return self.run / "progress.jsonl"

    @property
    def ready(self) -> Path:
        return self.run / "ready"

    @property
    def secrets(self) -> Path:
        return self.run / "secrets"

    @property
    def collected(self) -> Path:
        return self.run / "collected"

    @property
    def tmp(self) -> Path:
        return self.run / "tmp"

    def make(self) -> None:
        # run/collected is made by the output collection that needs it: most attempts collect nothing.
        for d in (self.state, self.inputs, self.outputs, self.run, self.logs, self.ready, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.run.chmod(0o700)

    @property
    def handshake(self) -> Path:
        """The checkpoint handshake's request and answer files (checkpointing.handshake_dir)."""
        return self.run / "checkpoint"

    def own(self, uid: int, gid: int) -> None:
        """Gives the attempt's directories to the user its programs run as (the module docstring's modes).

        The attempt directory stays root's: an owner could rename run/ and have the root supervisor
        write its status through a link of the program's choosing."""
        os.chown(self.root, 0, gid)
        self.root.chmod(0o1770)
        self.run.chmod(0o711)
        self.handshake.mkdir(exist_ok=True)
        for d in (self.state, self.outputs, self.tmp, self.ready, self.handshake):
            os.chown(d, uid, gid)
            d.chmod(0o700)
        self.progress.touch()
        os.chown(self.progress, uid, gid)
        self.progress.chmod(0o600)

    @staticmethod
    def own_tree(path: Path, uid: int, gid: int) -> None:
        """`path` and everything under it (links themselves, never their targets) to uid:gid."""
        os.lchown(path, uid, gid)
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), uid, gid)

    def translate(self, path: str) -> Path:
        """Maps the container paths of the contract (/nodus/state, …) onto this attempt's directories."""
        for prefix, real in (("/nodus/state", self.state), ("/nodus/inputs", self.inputs),
                             ("/nodus/outputs", self.outputs), ("/nodus/volumes", self.volumes)):
            if path == prefix or path.startswith(prefix + "/"):
                return real / path[len(prefix):].lstrip("/")
        p = Path(path)
        return p if p.is_absolute() else self.root / p
