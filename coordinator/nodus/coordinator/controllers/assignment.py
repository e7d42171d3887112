"""An Attempt and its Job compiled into the wire Assignment: everything resolved, so the agent never
reads the store (agent.proto). Secret values come from the vault at their pinned versions and travel
only in this message.

The environment contract of DESIGN.md, the coordinator's half: NODUS_INDEX, JOB_COMPLETION_INDEX,
NODUS_PROJECT, NODUS_JOB, NODUS_ATTEMPT (the attempt id), NODUS_ATTEMPT_NUMBER, plus the Job's
literal `env` (identity variables win over a Job variable of the same name). The agent adds the
directory variables and NODUS_PROGRESS.
"""
from __future__ import annotations

import base64
import binascii
import logging
from typing import Any, Awaitable, Callable

from google.protobuf import duration_pb2

from nodus.v1 import agent_pb2, common_pb2

from ..api.job_folding import effective_image
from ..clock import seconds
from ..errors import NodusError
from ..images import ImageRefused, RegistryCredentials, ResolvedImage, registry_of
from ..operator_registry import OperatorRegistry
from ..scheduler import Request
from ..sources import repo_url
from ..vault import Vault

log = logging.getLogger("nodus.assignment")

BLOB_URI = "blob://sha256/"
SECRETS_DIR = "/nodus/secrets"
"""Where a mounted Secret's keys become files: /nodus/secrets/<secret>/<key>."""
OUTPUTS_DIR = "/nodus/outputs"
VOLUMES_DIR = "/nodus/volumes"
"""Where the agent keeps an attempt's volumes (NODUS_VOLUME_<NAME>; in a container, bound at the mountPath)."""
VOLUME_OUTPUT = "nodus.volume."
"""A writable volume mount comes back as this output (+ the volume's name) when the index succeeds, and
becomes the Volume's next revision (volume_commits.py); admission keeps `nodus.` names from customers."""
BucketLocator = Callable[[str, str, str], Awaitable[agent_pb2.Location]]
"""(connection, s3://bucket/key, the field naming the connection) → the object's Location with that S3
Connection's keys (the agent stream reads them, checkpoints/buckets.py); raises NodusError."""
_EGRESS = {"Deny": agent_pb2.EGRESS_POLICY_DENY, "AllowList": agent_pb2.EGRESS_POLICY_ALLOW_LIST,
           "Open": agent_pb2.EGRESS_POLICY_OPEN}


def identity_env(attempt: dict[str, Any]) -> dict[str, str]:
    """The identity variables, and a gang member's variables known from its creation (spec.env)."""
    spec = attempt["spec"]
    return {"NODUS_INDEX": str(spec["index"]), "JOB_COMPLETION_INDEX": str(spec["index"]),
            "NODUS_PROJECT": attempt["metadata"]["namespace"], "NODUS_JOB": spec["job"],
            "NODUS_ATTEMPT": spec["id"], "NODUS_ATTEMPT_NUMBER": str(spec["number"]),
            **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}


def _duration(text: Any) -> duration_pb2.Duration | None:
    secs = seconds(text)
    if secs is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(secs * 1e9)))
    return d


def _text(value: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return value


def _raw(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


class Secrets:
    """The pinned versions of a Job's Secrets, read from the vault once per assignment."""

    def __init__(self, vault: Vault, project: str, job_status: dict[str, Any]) -> None:
        self._vault, self._project = vault, project
        self._versions = job_status.get("secretVersions") or {}
        self._ids = job_status.get("secretVersionIDs") or {}
        self._values: dict[str, dict[str, str]] = {}

    async def values(self, name: str) -> dict[str, str]:
        if name not in self._values:
            version = self._versions.get(name)
            self._values[name] = await self._vault.get(self._project, name, int(version)) if version else {}
        return self._values[name]

    async def env(self, env: list[dict[str, Any]]) -> tuple[dict[str, str], list[agent_pb2.SecretEnvVar]]:
        literal: dict[str, str] = {}
        secret: list[agent_pb2.SecretEnvVar] = []
        for var in env:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                value = (await self.values(ref["name"])).get(ref["key"])
                if value is not None:
                    secret.append(agent_pb2.SecretEnvVar(name=var["name"], value=_text(value)))
            elif "value" in var:
                literal[var["name"]] = str(var["value"])
        return literal, secret

    async def mount(self, name: str) -> agent_pb2.SecretMount:
        values = await self.values(name)
        return agent_pb2.SecretMount(name=name, version=int(self._versions.get(name) or 0),
                                     version_id=str(self._ids.get(name) or ""),
                                     data={k: _raw(v) for k, v in values.items()}, mount_path=f"{SECRETS_DIR}/{name}")


def pinned(image: str, pin: dict[str, Any] | None) -> str:
    """What the agent pulls: registry/repository@digest from the admission's pin (status.image), never
    the tag, so every attempt runs the digest admitted even after the tag moved. A Job admitted
    without a resolver (no pin) is sent as written; the agent refuses a tag."""
    if not image or not pin or not pin.get("digest"):
        return image
    return ResolvedImage(str(pin.get("reference") or image), str(pin["digest"]), "").pinned  # parsed when pinned


async def _pull_credentials(spec: dict[str, Any], secrets: Secrets) -> list[agent_pb2.RegistryCredential]:
    """The imagePullSecrets at their pinned versions as per-registry logins (a username/password pair
    logs in to the Job's image's registry)."""
    image = spec.get("image") or next((s["image"] for s in spec.get("sidecars") or [] if s.get("image")), "")
    if not image:
        return []
    try:
        registry = registry_of(image)
    except ImageRefused:
        return []  # admitted without a resolver, so never checked: the agent refuses the reference itself
    out: list[agent_pb2.RegistryCredential] = []
    for name in spec.get("imagePullSecrets") or []:
        values = await secrets.values(name)
        if not values:
            continue
        try:
            credentials = RegistryCredentials.from_secret(name, {k: _raw(v) for k, v in values.items()})
        except ImageRefused as e:  # admission refused it; a Secret changed since is skipped, not sent
            log.warning("imagePullSecret %s: %s", name, e)
            continue
        for host, username, password in credentials.logins(registry):
            login = agent_pb2.RegistryCredential(registry=host, username=username, password=password)
            if login not in out:
                out.append(login)
    return out


def _location(sha256: str) -> agent_pb2.Location:
    return agent_pb2.Location(uri=BLOB_URI + sha256)


async def _inputs(spec: dict[str, Any], status: dict[str, Any], outputs_of: Any,
                  buckets: BucketLocator | None) -> list[agent_pb2.Input]:
    """Every input as the agent fetches it. One that cannot be provided raises NodusError, which fails
    the attempt naming it: an attempt never starts without an input (docs/adr/0037)."""
    pinned = {p.get("name"): p for p in status.get("inputs") or [] if isinstance(p, dict)}
    out = []
    for i, item in enumerate(spec.get("inputs") or []):
        name, at = item["name"], f"spec.inputs[{i}]"
        if item.get("url"):
            out.append(agent_pb2.Input(name=name, source=agent_pb2.Location(uri=item["url"]["url"]),
                                       sha256=item["url"].get("sha256", "")))
        elif item.get("volume"):
            sha = (pinned.get(name) or {}).get("sha256")
            if not sha:
                raise NodusError("NotFound", f"input {name}: Volume {item['volume'].get('name')} ({at}.volume) has no "
                                 "pinned revision with content in status.inputs", name=name, kind="jobs",
                                 fix="create the Job again once the Volume has a Ready revision "
                                     "(nodus volume push NAME DIR)")
            out.append(agent_pb2.Input(name=name, source=_location(sha), sha256=sha, archive=True))
        elif item.get("bucket"):
            bucket = item["bucket"]
            if buckets is None or not bucket.get("connection"):
                raise NodusError("BadRequest", f"input {name}: {at}.bucket names no S3 Connection to read "
                                 f"{bucket.get('uri')} with", name=name, kind="jobs",
                                 fix=f"set {at}.bucket.connection and create the Job again")
            source = await buckets(bucket["connection"], bucket["uri"], f"{at}.bucket.connection")
            out.append(agent_pb2.Input(name=name, source=source, sha256=bucket.get("sha256", "")))
        elif item.get("output"):
            ref = item["output"]
            found = outputs_of(ref["job"], ref["name"], int(ref.get("index") or 0))
            if found is None:
                raise NodusError("NotFound", f"input {name}: output {ref['name']} of Job {ref['job']} ({at}.output) is "
                                 "not committed", name=name, kind="jobs",
                                 fix=f"the Job waits for Job {ref['job']} to commit it before it creates an attempt; "
                                     "this one was made before the output went away")
            out.append(agent_pb2.Input(name=name, source=_location(found["sha256"]), sha256=found["sha256"],
                                       size_bytes=int(found.get("size") or 0), archive=bool(found.get("directory"))))
        else:
            kind = next((k for k in item if k != "name"), "?")
            raise NodusError("BadRequest", f"input {name}: {kind} inputs ({at}.{kind}) cannot be provided by this "
                             "release", name=name, kind="jobs",
                             fix="use a url, bucket, output or volume input, and create the Job again")
    return out


def operator_logins(spec: dict[str, Any], project: str,
                    registry: OperatorRegistry | None) -> list[agent_pb2.RegistryCredential]:
    """The operator registry's login when the Job's image (or a sidecar's) is in the project's own namespace
    there (admission refused any other project's), sent as imagePullSecrets' logins are."""
    images = [spec.get("image") or "", *(s.get("image") or "" for s in spec.get("sidecars") or [])]
    if registry is None or not any(i and registry.project_of(i) == project for i in images):
        return []
    return [agent_pb2.RegistryCredential(registry=h, username=u, password=p) for h, u, p in registry.logins()]


async def build(attempt: dict[str, Any], job: dict[str, Any], vault: Vault, outputs_of: Any,
                image_registry: OperatorRegistry | None = None,
                buckets: BucketLocator | None = None) -> agent_pb2.Assignment:
    """The Assignment for `attempt`. `outputs_of(job, output, index)` finds another Job's committed output,
    `buckets` a bucket input's object with its Connection's keys.
    It takes the stored objects, not views: it compiles the whole spec (and its pinned status) into the wire
    message field by field, which a view would only copy."""
    project = attempt["metadata"]["namespace"]
    spec, status, a = job.get("spec") or {}, job.get("status") or {}, attempt["spec"]
    if spec.get("imageRef") and not spec.get("image"):  # the project's own image, as admission resolved it
        spec = {**spec, "image": effective_image(spec, status)}
    secrets = Secrets(vault, project, status)
    literal, secret_env = await secrets.env(spec.get("env") or [])
    env = {**literal, **identity_env(attempt)}
    request = Request.of(a.get("resources"), a.get("image"))
    image = pinned(spec.get("image", ""), status.get("image"))
    sidecar_pins = {p.get("name"): p for p in status.get("sidecarImages") or [] if isinstance(p, dict)}
    out = agent_pb2.Assignment(
        attempt_id=a["id"], job=common_pb2.JobRef(project=project, name=a["job"], uid=a["jobUID"]),
        index=int(a["index"]), attempt_number=int(a["number"]), env=env, secret_env=secret_env,
        command=spec.get("command") or [], args=spec.get("args") or [], image=image,
        working_dir=spec.get("workingDir", ""),
        resources=common_pb2.Resources(cpu_millis=request.cpu_millis, memory_bytes=request.memory_bytes,
                                       disk_bytes=request.disk_bytes, gpus=len(a.get("gpuIndexes") or [])),
        gpu_indexes=a.get("gpuIndexes") or [],
        secrets=[await secrets.mount(m["name"]) for m in spec.get("secrets") or []],
        inputs=await _inputs(spec, status, outputs_of, buckets),
        outputs=[agent_pb2.Output(name=o["name"], path=o["path"], all_ranks=o.get("fromRanks") == "All")
                 for o in spec.get("outputs") or []] + [agent_pb2.Output(name="outputs", path=OUTPUTS_DIR)]
        + [agent_pb2.Output(name=VOLUME_OUTPUT + m["volume"], path=f"{VOLUMES_DIR}/{m['volume']}")
           for m in spec.get("volumes") or [] if not m.get("readOnly")],
        image_pull_credentials=await _pull_credentials(spec, secrets)
        + operator_logins(spec, project, image_registry),  # last: the agent keeps the last login per registry
    )
    init = spec.get("initCommand")
    if init:
        out.init_command.CopyFrom(agent_pb2.InitCommand(command=init["command"],
                                                        timeout=_duration(init.get("timeout"))))
    for sidecar in spec.get("sidecars") or []:
        s_literal, s_secret = await secrets.env(sidecar.get("env") or [])
        out.sidecars.append(agent_pb2.Sidecar(name=sidecar["name"],
                                              image=pinned(sidecar.get("image", ""), sidecar_pins.get(sidecar["name"])),
                                              command=sidecar.get("command") or [], env=s_literal,
                                              secret_env=s_secret,
                                              startup_timeout=_duration(sidecar.get("startupTimeout"))))
    pinned_volumes = {(v.get("volume"), v.get("mountPath")): v for v in status.get("volumes") or []}
    for mount in spec.get("volumes") or []:
        pin = pinned_volumes.get((mount["volume"], mount["mountPath"])) or {}
        out.volumes.append(agent_pb2.VolumeMount(volume=mount["volume"], revision=int(pin.get("revision") or 0),
                                                 mount_path=mount["mountPath"], read_only=bool(mount.get("readOnly")),
                                                 source=_location(pin["sha256"]) if pin.get("sha256") else None))
    source = spec.get("source") or {}
    if source.get("git"):
        git = source["git"]
        repo = repo_url(git["repo"])
        commit = (status.get("source") or {}).get("commit") or git.get("ref", "")
        out.source.CopyFrom(agent_pb2.Source(git=agent_pb2.GitSource(repo=agent_pb2.Location(uri=repo), commit=commit),
                                             path=git.get("path", "")))
    elif source.get("blob"):
        sha = source["blob"].removeprefix("sha256:")
        out.source.CopyFrom(agent_pb2.Source(blob=agent_pb2.BlobSource(location=_location(sha), sha256=sha)))
    egress = ((spec.get("network") or {}).get("egress")) or {}
    if egress.get("policy"):
        out.egress.CopyFrom(agent_pb2.Egress(policy=_EGRESS[egress["policy"]], allow=egress.get("allow") or [],
                                             presets=egress.get("presets") or []))  # the agent expands presets
    return out
