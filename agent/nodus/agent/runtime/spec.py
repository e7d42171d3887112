"""What the agent writes for an attempt's supervisor: the main command's environment, run/spec.json and
the secret mounts, and the account the attempt's programs run as (split from process.py, which had
reached 500 lines)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from nodus.v1 import agent_pb2

from ..checkpointing import handshake_env
from ..inputs import working_dir
from ..layout import AttemptLayout, safe_name

# What a workload inherits from the agent's environment; everything else is the Assignment's.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR", "LD_LIBRARY_PATH")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOKEN_MOUNT = "nodus.serviceaccount"  # the ServiceAccount token's SecretMount (ADR 0055, coordinator: workload_tokens)


def _seconds(d: Any) -> float:
    return float(d.seconds + d.nanos / 1e9)


def _env_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).upper()


def attempt_env(a: agent_pb2.Assignment, layout: AttemptLayout, base: Mapping[str, str],
                host_gpus: int = 0) -> dict[str, str]:
    """The main command's environment, without secret values (those travel to the supervisor apart)."""
    env = {k: base[k] for k in PASSED_ENV if k in base}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(layout.root)
    env["TMPDIR"] = str(layout.tmp)
    env.update(a.env)
    identity = {"NODUS_INDEX": str(a.index), "JOB_COMPLETION_INDEX": str(a.index), "NODUS_PROJECT": a.job.project,
                "NODUS_JOB": a.job.name, "NODUS_ATTEMPT": a.attempt_id,
                "NODUS_ATTEMPT_NUMBER": str(a.attempt_number)}
    for k, v in identity.items():
        env.setdefault(k, v)
    env.update({"NODUS_STATE_DIR": str(layout.state), "NODUS_INPUTS_DIR": str(layout.inputs),
                "NODUS_OUTPUTS_DIR": str(layout.outputs), "NODUS_PROGRESS": str(layout.progress),
                "NODUS_READY_FILE": str(layout.ready / "main")})
    env.update(handshake_env(layout))  # the checkpoint handshake's request and answer files (recovery)
    if a.secrets:
        env["NODUS_SECRETS_DIR"] = str(layout.secrets)
    token: Mapping[str, bytes] = next((m.data for m in a.secrets if m.name == TOKEN_MOUNT), {})
    for key, var in (("token", "NODUS_TOKEN_FILE"), ("ca.crt", "NODUS_CA_FILE")):  # a container sees them at /nodus/
        if key in token:
            env[var] = str(layout.secrets / TOKEN_MOUNT / key)
    for vol in a.volumes:
        env[f"NODUS_VOLUME_{_env_name(vol.volume)}"] = str(layout.volumes / vol.volume)
    if a.gpu_indexes:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in a.gpu_indexes)
    elif host_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU was reserved for this attempt
    return env


@dataclass(frozen=True, slots=True)
class WorkloadUser:
    """The account an attempt runs as: --workload-user's for every attempt, or the attempt's own uid."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, name: str) -> "WorkloadUser":
        import pwd

        try:
            pw = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
        except KeyError:
            raise ValueError(f"workload user {name!r} does not exist on this host") from None
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))

    @classmethod
    def of_attempt(cls, uid: int) -> "WorkloadUser":
        """An attempt's own uid (ADR 0040): no passwd entry, its gid the same number, no other groups."""
        return cls(f"nodus-attempt-{uid}", uid, uid, ())

    def as_spec(self) -> dict[str, Any]:
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups)}


def supervisor_spec(a: agent_pb2.Assignment, layout: AttemptLayout, env: dict[str, str], *,
                    cgroup_root: str, cgroups: bool, stop_grace: float, cgroup_name: str = "",
                    user: WorkloadUser | None = None) -> dict[str, Any]:
    """run/spec.json: what the supervisor runs. Secret values are never in it."""
    secret_names = {s.name for s in a.secret_env}
    init = None
    if a.HasField("init_command") and a.init_command.command:
        init = {"command": list(a.init_command.command),
                "timeout": _seconds(a.init_command.timeout) if a.init_command.HasField("timeout") else 1800}
    sidecars = []
    for sc in a.sidecars:
        sidecars.append({"name": sc.name, "command": list(sc.command), "env": dict(sc.env),
                         "startup_timeout": _seconds(sc.startup_timeout) if sc.HasField("startup_timeout") else 60})
    return {
        "attempt_id": a.attempt_id,
        "command": [*a.command, *a.args],
        "env": {k: v for k, v in env.items() if k not in secret_names},
        "working_dir": str(working_dir(a, layout)),
        "init": init,
        "sidecars": sidecars,
        # fromRanks Zero (the default) is collected on rank 0 only; All on every rank, as rank-N.
        "outputs": [{"name": o.name, "path": o.path} for o in a.outputs
                    if not a.HasField("gang") or a.gang.rank == 0 or o.all_ranks],
        "resources": {"memory_bytes": a.resources.memory_bytes, "cpu_millis": a.resources.cpu_millis},
        "cgroup_root": cgroup_root,
        "cgroup_name": cgroup_name or layout.root.name,
        "cgroups": cgroups,
        "stop_grace": stop_grace,
        "secret_env_names": sorted(secret_names),
        "user": user.as_spec() if user else None,
        "checkpoint": {"paths": list(a.checkpoint.paths), "max_size_bytes": a.checkpoint.max_size_bytes,
                       "integration": a.checkpoint.integration,
                       "format": a.checkpoint.format} if a.HasField("checkpoint") else None,
        # A gang member waits at its gate after the init command and sidecars until the agent writes
        # run/launch.json (the launcher's steps, once the gang assembled).
        "gang": {"epoch": a.gang.epoch, "rank": a.gang.rank} if a.HasField("gang") else None,
    }


def write_secret_mounts(a: agent_pb2.Assignment, layout: AttemptLayout, user: WorkloadUser | None = None) -> None:
    """Each SecretMount becomes run/secrets/<name>/<key>, mode 0400, in a 0500 directory (the workload's)."""
    for mount in a.secrets:
        if not mount.data:
            continue
        name = safe_name(mount.name)
        d = layout.secrets / name
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for key, value in mount.data.items():
            if not key or "/" in key or key in (".", ".."):
                continue
            path = d / key
            path.unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
            try:
                os.write(fd, value)
                if user:
                    os.fchown(fd, user.uid, user.gid)
            finally:
                os.close(fd)
        d.chmod(0o500)
        if user:
            os.chown(d, user.uid, user.gid)
    if layout.secrets.exists():
        layout.secrets.chmod(0o500)
        if user:
            os.chown(layout.secrets, user.uid, user.gid)


def code_entries(a: agent_pb2.Assignment, layout: AttemptLayout) -> list[Path]:
    """What the Job's source (spec.source) put in the attempt: its target directory, or, where that is the
    attempt directory itself (the default), its entries other than Nodus's own."""
    if not a.HasField("source") or not a.source.WhichOneof("source"):
        return []
    target = layout.translate(a.source.path) if a.source.path else working_dir(a, layout)
    root = layout.root.resolve()
    if not target.exists() or not target.resolve().is_relative_to(root):
        return []  # outside the attempt (an absolute path of the host): not the attempt's to own
    if target.resolve() != root:
        return [target]
    own = {p.name for p in (layout.state, layout.inputs, layout.outputs, layout.volumes, layout.run, layout.logs)}
    return [entry for entry in target.iterdir() if entry.name not in own]
