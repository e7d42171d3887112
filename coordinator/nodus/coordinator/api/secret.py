"""Secret (nodus.dev/v1): keys and values that Jobs receive, versioned, never returned by the API.

On write a Secret carries `data` (key → base64) and/or `stringData` (key → text); admission folds
stringData into data (stringData wins on a shared key, as in Kubernetes). The resource service
encrypts the values, makes each write a new version and writes `status` (version, versionID, keys,
versions[]); Job admission pins those versions.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

from .. import errors
from ..errors import Cause
from .limits import AdmissionLimits
from .schema import Int, KindSchema, List, Map, Obj, Str

KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
MAX_VALUE_BYTES = 1024 * 1024
_KEY_MESSAGE = "a Secret key must consist of alphanumeric characters, '-', '_' or '.' (regex used for validation is " \
               f"'{KEY_PATTERN}')"


def _base64_value(value: str, path: str) -> list[Cause]:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return [errors.invalid_value(path, "<secret value>", "must be base64-encoded (standard alphabet, padded)")]
    return [errors.too_long(path, MAX_VALUE_BYTES)] if len(raw) > MAX_VALUE_BYTES else []


def _string_value(value: str, path: str) -> list[Cause]:
    return [errors.too_long(path, MAX_VALUE_BYTES)] if len(value.encode()) > MAX_VALUE_BYTES else []


def _keys(description: str, value: Str) -> Map:
    return Map(description=description, values=value, key_pattern=KEY_PATTERN, key_message=_KEY_MESSAGE)


SECRET_BODY = Obj(fields={
    "type": Str(description="Type is the Secret's type (default Opaque).", default="Opaque", max_length=253),
    "data": _keys("Data maps each key to its base64-encoded value (at most 1 MiB each). Write-only: the API never "
                  "returns values.", Str(checks=(_base64_value,))),
    "stringData": _keys("StringData maps keys to plain-text values; on write it is folded into data (it wins over a "
                        "key in data).", Str(checks=(_string_value,))),
})

SECRET_STATUS = Obj(description="SecretStatus describes the stored versions (never the values).", fields={
    "version": Int(description="Version is the latest version, from 1."),
    "versionID": Str(description="VersionID identifies the latest version; a Secret deleted and recreated under the "
                                 "same name has new ids."),
    "keys": List(description="Keys are the keys of the latest version.", items=Str()),
    "versions": List(description="Versions are the stored versions, oldest first.", items=Obj(
        description="SecretVersion is one stored version.", fields={
            "version": Int(description="Version is the version number."),
            "versionID": Str(description="VersionID identifies the version."),
            "keys": List(description="Keys are its keys.", items=Str()),
            "createTime": Str(description="CreateTime is when it was written (RFC 3339)."),
        })),
})


_AT_LEAST_ONE = "a Secret needs at least one key in data or stringData"


def body_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    """Values that are sent must hold at least one key (`data: {}` would store an empty version)."""
    if ("data" in body or "stringData" in body) and not body.get("data") and not body.get("stringData"):
        return [errors.required("data", _AT_LEAST_ONE)]
    return []


def create_rules(body: dict[str, Any]) -> list[Cause]:
    return [] if body.get("data") or body.get("stringData") else [errors.required("data", _AT_LEAST_ONE)]


def inherit(old: dict[str, Any], new: dict[str, Any]) -> None:
    """An update without values (a label change, say) keeps the stored values: no new version.

    The resource service keeps values in its vault, so `old` usually has no data and the new
    object simply has none either; the service then writes no new version."""
    if "data" not in new and "stringData" not in new and old.get("data"):
        new["data"] = dict(old["data"])


def finish(body: dict[str, Any]) -> None:
    """stringData folded into data as base64."""
    strings = body.pop("stringData", None) or {}
    if strings:
        data = dict(body.get("data") or {})
        data.update({k: base64.b64encode(v.encode()).decode("ascii") for k, v in strings.items()})
        body["data"] = data


SECRET = KindSchema(
    kind="Secret",
    description="Secret holds keys and values that Jobs receive as environment variables or mounted files. Values "
                "are encrypted at rest, versioned on every write and never returned by the API.",
    body=SECRET_BODY,
    status=SECRET_STATUS,
    rules=body_rules,
    create_rules=create_rules,
    inherit=inherit,
    finish=finish,
    mutable=("data", "stringData"),
)
