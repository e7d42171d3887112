"""Per-kind behaviour of the resource service on create, update and delete, as Kubernetes' registry
has a strategy per kind: the service does what every kind shares (identity, admission, the store's
compare-and-swap) and calls these hooks where a kind differs. A Secret's values live in the vault,
versioned, and never in the stored object; a Job's images are resolved to digests on create.
"""
from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

import orjson

from . import errors
from .api.admission import Lookup
from .api.references import not_found, secret_version
from .images import ImageRefused, ImageResolver, RegistryCredentials, ResolvedImage, refusal, registry_of
from .vault import Vault

Values = dict[str, str]
"""A Secret's values (base64, as `data` holds them), on their way to the vault."""


class KindStrategy:
    """The default: nothing beyond the shared rules; a changed spec moves metadata.generation."""

    def on_create(self, obj: dict[str, Any], now: str) -> Values | None:
        """Shapes an admitted new object; returns values the store must not hold (None: none)."""
        return None

    async def prepare(self, project: str, obj: dict[str, Any]) -> None:
        """After `on_create`, before anything is written (a dry run too): what needs I/O to admit."""

    async def readable(self, project: str, name: str, old: dict[str, Any], base: dict[str, Any]) -> None:
        """Adds to `base` (a copy of the stored object) what a patch applies to but the store lacks."""

    async def on_update(self, project: str, name: str, old: dict[str, Any], result: dict[str, Any],
                        now: str) -> Values | None:
        """Shapes an admitted update of the spec; returns values the store must not hold (None: none)."""
        if result.get("spec") != old.get("spec"):
            result["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        return None

    async def keep(self, project: str, name: str, obj: dict[str, Any], values: Values) -> None:
        """Stores `values` elsewhere, before the object that names them is written."""

    async def on_delete(self, project: str, name: str) -> None:
        """After the object is deleted."""


class SecretStrategy(KindStrategy):
    """A Secret's data goes to the vault, one version per change of values; the object keeps the
    status (version, keys, versions) and no values, not even in kubectl's last-applied annotation."""

    def __init__(self, vault: Vault) -> None:
        self.vault = vault

    def on_create(self, obj: dict[str, Any], now: str) -> Values | None:
        values: Values = obj.pop("data", {}) or {}
        obj.pop("stringData", None)
        _scrub_last_applied(obj)
        obj["status"] = _secret_status(None, 1, values, now)
        return values

    async def readable(self, project: str, name: str, old: dict[str, Any], base: dict[str, Any]) -> None:
        base["data"] = await self.vault.get(project, name, old["status"]["version"])

    async def on_update(self, project: str, name: str, old: dict[str, Any], result: dict[str, Any],
                        now: str) -> Values | None:
        values: Values | None = result.pop("data", None)
        result.pop("stringData", None)
        _scrub_last_applied(result)
        if values is not None and values == await self.vault.get(project, name, old["status"]["version"]):
            values = None  # same values: no new version
        if values is not None:
            version = old["status"]["version"] + 1
            result["status"] = _secret_status(old["status"], version, values, now)
            result["metadata"]["generation"] = old["metadata"]["generation"] + 1
        return values

    async def keep(self, project: str, name: str, obj: dict[str, Any], values: Values) -> None:
        await self.vault.put(project, name, obj["status"]["version"], values)

    async def on_delete(self, project: str, name: str) -> None:
        await self.vault.drop(project, name)


class JobStrategy(KindStrategy):
    """A Job's `image` and its sidecars' own images are resolved on create, with the Job's
    imagePullSecrets, to the digests every attempt runs: `status.image` {reference, digest, user} and
    `status.sidecarImages[]` (the same and the sidecar's name). The pull secrets are pinned in
    status.secretVersions as mounted Secrets are, so every attempt pulls with the same credentials.
    spec.image is immutable (JobSpec), so an update never needs resolving again."""

    def __init__(self, vault: Vault, images: ImageResolver, lookup: Lookup) -> None:
        self.vault, self.images, self.lookup = vault, images, lookup

    async def prepare(self, project: str, obj: dict[str, Any]) -> None:
        spec, name = obj.get("spec") or {}, obj["metadata"]["name"]
        sidecars = [(i, s) for i, s in enumerate(spec.get("sidecars") or []) if s.get("image")]
        if not spec.get("image") and not sidecars:
            return
        status = obj.setdefault("status", {})
        credentials = await self._pull_secrets(project, name, spec.get("imagePullSecrets") or [], status)
        resolved: dict[str, ResolvedImage] = {}

        async def resolve(image: str, path: str) -> ResolvedImage:
            if image not in resolved:
                try:
                    resolved[image] = await self.images.resolve(image, _login_for(image, credentials))
                except ImageRefused as e:
                    raise refusal(e, "Job", name, path) from None
            return resolved[image]

        if spec.get("image"):
            status["image"] = (await resolve(spec["image"], "spec.image")).as_status()
        pins = []
        for i, sidecar in sidecars:
            got = await resolve(sidecar["image"], f"spec.sidecars[{i}].image")
            pins.append({"name": sidecar["name"], **got.as_status()})
        if pins:
            status["sidecarImages"] = pins

    async def _pull_secrets(self, project: str, name: str, names: list[str],
                            status: dict[str, Any]) -> list[RegistryCredentials]:
        """Each named Secret's credentials at its latest version, pinned in `status`."""
        out = []
        for i, secret_name in enumerate(names):
            path = f"spec.imagePullSecrets[{i}]"
            secret = await self.lookup.get("secrets", project, secret_name)
            chosen = secret_version(secret, None) if secret is not None else None
            if chosen is None or chosen.get("version") is None:
                raise errors.invalid("Job", name, [not_found(path, secret_name)],
                                     fix=f"create Secret {secret_name} in project {project} with the registry's "
                                         "credentials (.dockerconfigjson, or username and password), or drop it "
                                         "from spec.imagePullSecrets")
            values = await self.vault.get(project, secret_name, int(chosen["version"]))
            try:
                out.append(RegistryCredentials.from_secret(secret_name, {k: _raw(v) for k, v in values.items()}))
            except ImageRefused as e:
                raise refusal(e, "Job", name, path) from None
            status.setdefault("secretVersions", {}).setdefault(secret_name, chosen["version"])
            if chosen.get("versionID") is not None:
                status.setdefault("secretVersionIDs", {}).setdefault(secret_name, chosen["versionID"])
        return out


def _login_for(image: str, credentials: list[RegistryCredentials]) -> RegistryCredentials | None:
    """The first pull secret that logs in to the image's registry (a username/password pair logs in to
    any), as one username/password pair."""
    registry = registry_of(image)
    for creds in credentials:
        for host, username, password in creds.logins(registry):
            if host == registry:
                return RegistryCredentials(username=username, password=password)
    return None


def _raw(value: str) -> bytes:
    """A Secret value as the vault holds it (base64) in bytes."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


def strategies(vault: Vault, images: ImageResolver | None = None,
               lookup: Lookup | None = None) -> dict[str, KindStrategy]:
    """The strategy of each kind that has its own (by kind name); every other kind takes the default.
    Without `images` (a resource service built without a resolver) a Job is admitted as written."""
    own: dict[str, KindStrategy] = {"Secret": SecretStrategy(vault)}
    if images is not None and lookup is not None:
        own["Job"] = JobStrategy(vault, images, lookup)
    return own


def _secret_status(old: dict[str, Any] | None, version: int, values: Values, now: str) -> dict[str, Any]:
    version_id = str(uuid.uuid4())
    keys = sorted(values)
    versions = list((old or {}).get("versions", []))
    versions.append({"version": version, "versionID": version_id, "keys": keys, "createTime": now})
    return {"version": version, "versionID": version_id, "keys": keys, "versions": versions}


def _scrub_last_applied(obj: dict[str, Any]) -> None:
    """kubectl apply copies the whole file into an annotation; never keep secret values there."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    raw = annotations.get("kubectl.kubernetes.io/last-applied-configuration")
    if not raw:
        return
    try:
        applied = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    for field in ("data", "stringData"):
        if isinstance(applied.get(field), dict):
            applied[field] = {k: "" for k in applied[field]}
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = orjson.dumps(applied).decode() + "\n"
