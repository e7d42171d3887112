"""Per-kind behaviour of the resource service on create, update and delete, as Kubernetes' registry
has a strategy per kind: the service does what every kind shares (identity, admission, the store's
compare-and-swap) and calls these hooks where a kind differs. Only the Secret differs today: its
values live in the vault, versioned, and never in the stored object.
"""
from __future__ import annotations

import uuid
from typing import Any

import orjson

from .vault import Vault

Values = dict[str, str]
"""A Secret's values (base64, as `data` holds them), on their way to the vault."""


class KindStrategy:
    """The default: nothing beyond the shared rules; a changed spec moves metadata.generation."""

    def on_create(self, obj: dict[str, Any], now: str) -> Values | None:
        """Shapes an admitted new object; returns values the store must not hold (None: none)."""
        return None

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


def strategies(vault: Vault) -> dict[str, KindStrategy]:
    """The strategy of each kind that has its own (by kind name); every other kind takes the default."""
    return {"Secret": SecretStrategy(vault)}


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
