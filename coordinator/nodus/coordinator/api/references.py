"""References from a spec to other objects, checked and pinned at admission: the Secrets it mounts or
reads keys of, the Volumes it takes as inputs or mounts, and the ServiceAccount it runs as (Job and Sweep specs
share these rules)."""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from .schema import Resolution, get
from .volume import find_revision, latest_ready


def not_found(path: str, value: Any) -> Cause:
    """A reference to an object that does not exist (Kubernetes' field.NotFound)."""
    return Cause(path, "FieldValueNotFound", f"Not found: {errors.render_value(value)}")


def secret_version(secret: dict[str, Any], version: int | None) -> dict[str, Any] | None:
    """`{version, versionID, keys}` of a stored Secret's version (None: the latest), or None if absent."""
    status = secret.get("status") or {}
    versions = [v for v in status.get("versions") or [] if isinstance(v, dict)]
    if version is None:
        if status.get("version") is not None:
            return {"version": status["version"], "versionID": status.get("versionID"), "keys": status.get("keys")}
        return max(versions, key=lambda v: v.get("version", 0), default=None)
    for v in versions:
        if v.get("version") == version:
            return v
    if status.get("version") == version:
        return {"version": version, "versionID": status.get("versionID"), "keys": status.get("keys")}
    return None


def secret_references(spec: dict[str, Any], at: str) -> tuple[dict[str, tuple[str, int | None]], list[tuple[str, str, str]]]:
    """Mounted secrets {name: (path, version)} and key references [(path, secret, key)]."""
    mounts: dict[str, tuple[str, int | None]] = {}
    for i, mount in enumerate(spec.get("secrets") or []):
        if isinstance(mount.get("name"), str):  # a missing name is reported by decoding
            mounts.setdefault(mount["name"], (f"{at}.secrets[{i}]", mount.get("version")))
    keys: list[tuple[str, str, str]] = []
    envs = [(f"{at}.env", spec.get("env") or [])]
    envs += [(f"{at}.sidecars[{j}].env", s.get("env") or []) for j, s in enumerate(spec.get("sidecars") or [])]
    for env_path, env in envs:
        for i, var in enumerate(env):
            ref = get(var, "valueFrom.secretKeyRef")
            if isinstance(ref, dict) and "name" in ref and "key" in ref:
                keys.append((f"{env_path}[{i}].valueFrom.secretKeyRef", ref["name"], ref["key"]))
    return mounts, keys


async def resolve_secrets(spec: dict[str, Any], lookup: Any, project: str, at: str = "spec") -> Resolution:
    """Every referenced Secret exists, pinned versions exist, keys exist; pins {name: version}."""
    out = Resolution()
    mounts, keys = secret_references(spec, at)
    names: dict[str, str] = {name: f"{path}.name" for name, (path, _) in mounts.items()}
    for path, name, _ in keys:
        names.setdefault(name, f"{path}.name")
    pinned: dict[str, dict[str, Any] | None] = {}
    for name, path in names.items():
        secret = await lookup.get("secrets", project, name)
        if secret is None:
            out.causes.append(not_found(path, name))
            continue
        mount_path, version = mounts.get(name, ("", None))
        chosen = secret_version(secret, version)
        if chosen is None and version is not None:
            out.causes.append(not_found(f"{mount_path}.version", version))
            continue
        pinned[name] = chosen
        if chosen is not None and chosen.get("version") is not None:
            out.status.setdefault("secretVersions", {})[name] = chosen["version"]
            if chosen.get("versionID") is not None:
                out.status.setdefault("secretVersionIDs", {})[name] = chosen["versionID"]
    for path, name, key in keys:
        chosen = pinned.get(name)
        if chosen is None or chosen.get("keys") is None:
            continue  # a missing Secret is reported above; a Secret without recorded keys cannot be checked
        if key not in chosen["keys"]:
            have = ", ".join(sorted(chosen["keys"])) or "none"
            out.causes.append(errors.invalid_value(
                f"{path}.key", key, f'not a key of Secret "{name}" version {chosen.get("version")} (keys: {have})'))
    return out


async def resolve_volumes(spec: dict[str, Any], lookup: Any, project: str, at: str = "spec") -> Resolution:
    """Every referenced Volume exists and has the named (or a Ready) revision; pins each reference.

    Pins go to status, as Secret versions do, so the spec stays as written (a re-apply of the same
    file changes nothing): `status.inputs[]` {name, volumeRevision, sha256} for each volume input and
    `status.volumes[]` {volume, mountPath, revision, sha256} for each mount. A writable mount is
    pinned too: it starts from that revision. `inputs[].output` is not checked here: the producing
    Job may legitimately not exist yet, and its output is resolved when the attempt's inputs are."""
    out = Resolution()
    volumes: dict[str, dict[str, Any] | None] = {}

    async def pin(name: Any, revision: Any, name_path: str, revision_path: str) -> dict[str, Any] | None:
        if not isinstance(name, str):
            return None  # a missing or mistyped name is reported by decoding
        if name not in volumes:
            volumes[name] = await lookup.get("volumes", project, name)
        volume = volumes[name]
        if volume is None:
            out.causes.append(not_found(name_path, name))
            return None
        if isinstance(revision, int) and revision > 0:
            chosen = find_revision(volume, revision)
            if chosen is None or chosen.get("phase", "Ready") != "Ready":
                latest = (volume.get("status") or {}).get("latestRevision")
                out.causes.append(errors.invalid_value(
                    revision_path, revision, f'Volume "{name}" has no Ready revision {revision} '
                                             f'(latest: {latest or "none"})'))
                return None
            return chosen
        chosen = latest_ready(volume)
        if chosen is None:
            out.causes.append(errors.invalid_value(
                name_path, name, f'Volume "{name}" has no revision yet; push one with `nodus volume push {name} DIR`'))
        return chosen

    for i, item in enumerate(spec.get("inputs") or []):
        if not isinstance(item, dict):
            continue
        ref = item.get("volume")
        if isinstance(ref, dict):
            at_i = f"{at}.inputs[{i}].volume"
            chosen = await pin(ref.get("name"), ref.get("revision"), f"{at_i}.name", f"{at_i}.revision")
            if chosen is not None:
                out.status.setdefault("inputs", []).append(
                    {"name": item.get("name"), "volumeRevision": chosen["revision"], "sha256": chosen.get("sha256")})
    for i, mount in enumerate(spec.get("volumes") or []):
        if isinstance(mount, dict):
            revision = mount.get("revision") if mount.get("readOnly") else None
            chosen = await pin(mount.get("volume"), revision, f"{at}.volumes[{i}].volume",
                               f"{at}.volumes[{i}].revision")
            if chosen is not None:
                out.status.setdefault("volumes", []).append(
                    {"volume": mount["volume"], "mountPath": mount.get("mountPath"), "revision": chosen["revision"],
                     "sha256": chosen.get("sha256")})
    return out


async def resolve_service_account(spec: dict[str, Any], lookup: Any, project: str, at: str = "spec") -> list[Cause]:
    """The ServiceAccount a spec runs as exists in its project: without it no attempt could get the token
    its program expects (ADR 0055). Checked once, at admission, as Kubernetes' ServiceAccount admission
    does: deleting the account later revokes its tokens, and the attempts after that run without one."""
    name = spec.get("serviceAccountName")
    if not isinstance(name, str) or not name or await lookup.get("serviceaccounts", project, name) is not None:
        return []
    return [errors.not_found(
        f"{at}.serviceAccountName", name,
        f'no ServiceAccount "{name}" in project "{project}": create it first (kubectl apply -f a nodus.dev/v1 '
        f"ServiceAccount named {name} with spec.role viewer or editor), or remove {at}.serviceAccountName")]


async def resolve_references(body: dict[str, Any], lookup: Any, project: str) -> Resolution:
    """A Job body's Secrets, Volumes and ServiceAccount, checked; Secrets and Volumes pinned."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return Resolution()
    out = await resolve_secrets(spec, lookup, project)
    out.causes += await resolve_service_account(spec, lookup, project)
    volumes = await resolve_volumes(spec, lookup, project)
    out.causes += volumes.causes
    out.status.update(volumes.status)
    return out
