"""Discovery and OpenAPI documents: what kubectl reads before it does anything."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from ..api.openapi import openapi_v3
from ..api.core import CORE_KINDS
from ..api.kinds import KINDS, KindInfo

GROUP = "nodus.dev"
VERSIONS = tuple(dict.fromkeys(k.version for k in KINDS))
PREFERRED = "v1"
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
SERVER_VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0+nodus.0.1.0", "platform": "linux/amd64",
                  "goVersion": "", "compiler": "nodus", "gitCommit": "", "gitTreeState": "clean",
                  "buildDate": "2026-11-29T00:00:00Z"}


def api_versions() -> dict[str, Any]:
    # The core group serves Events alone (api/core.py), so `secrets` still resolves to secrets.nodus.dev.
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def core_resource_list() -> dict[str, Any]:
    return {"kind": "APIResourceList", "groupVersion": "v1",
            "resources": [{"name": info.plural, "singularName": info.singular, "namespaced": info.namespaced,
                           "kind": info.kind, "verbs": ["get", "list", "watch"], "shortNames": list(info.short_names),
                           "storageVersionHash": ""} for info in CORE_KINDS]}


def _gv(version: str) -> dict[str, str]:
    return {"groupVersion": f"{GROUP}/{version}", "version": version}


def api_group() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
            "versions": [_gv(v) for v in VERSIONS], "preferredVersion": _gv(PREFERRED)}


def api_group_list() -> dict[str, Any]:
    group = api_group()
    group.pop("kind")
    group.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def _resource(info: KindInfo) -> dict[str, Any]:
    return {"name": info.plural, "singularName": info.singular, "namespaced": info.namespaced,
            "kind": info.kind, "verbs": VERBS, "shortNames": list(info.short_names),
            "categories": list(info.categories), "storageVersionHash": ""}


def api_resource_list(version: str) -> dict[str, Any] | None:
    kinds = [k for k in KINDS if k.version == version]
    if not kinds:
        return None
    resources: list[dict[str, Any]] = []
    for info in kinds:
        resources.append(_resource(info))
        if info.has_status:
            resources.append({"name": f"{info.plural}/status", "singularName": "", "namespaced": info.namespaced,
                              "kind": info.kind, "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": resources}


@dataclass(frozen=True, slots=True)
class OpenApiDoc:
    body: bytes
    etag: str


def build_openapi() -> dict[str, OpenApiDoc]:
    """Built once at start: the documents are a pure function of the schema source."""
    docs: dict[str, OpenApiDoc] = {}
    for version in VERSIONS:
        body = orjson.dumps(openapi_v3(f"{GROUP}/{version}"), option=orjson.OPT_SORT_KEYS)
        docs[version] = OpenApiDoc(body, hashlib.sha256(body).hexdigest()[:32].upper())
    return docs


def openapi_index(docs: dict[str, OpenApiDoc]) -> dict[str, Any]:
    return {"paths": {f"apis/{GROUP}/{v}": {"serverRelativeURL": f"/openapi/v3/apis/{GROUP}/{v}?hash={d.etag}"}
                      for v, d in docs.items()}}
