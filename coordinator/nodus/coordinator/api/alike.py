"""Objects admitted once for a batch: bodies that differ only in the values of their literal env entries.

A Sweep's pass creates its cells with one `ResourceService.create_many`, and its cells are one template
with a name, labels and `NODUS_PARAM_<NAME>` values of their own (and, per GPU × region, their own
`resources.gpu` and `placement.regions`). Decoding, defaulting and validating the same body once per
cell was a fifth of the coordinator's loop on bench/sweep.py (ADR 0070). Admission reads a body's env
values nowhere but in their own decoding, which only checks that each is a string: so two objects whose
`alike_key` is the same admit to the same body except for those values, and the second is admitted by
copying the first's admitted body and status and putting its own values back (`admission.admit_alike`);
its metadata is decoded and checked in full, as on any create.
"""
from __future__ import annotations

from typing import Any

import orjson

_ENVELOPE = ("metadata", "status")


def alike_key(obj: Any) -> bytes | None:
    """The object without its metadata, its status and the values of `spec.env`'s literal entries (each
    marked as present), as canonical JSON: objects with the same key admit to the same body but for those
    values. None for an object that cannot share an admission (not an object, no spec, an env that is not
    a list of objects with distinct string names and string values): it is admitted on its own."""
    if not isinstance(obj, dict) or not isinstance(obj.get("spec"), dict):
        return None
    spec = obj["spec"]
    env = spec.get("env")
    rest = {k: v for k, v in obj.items() if k not in _ENVELOPE}
    if env is not None:
        if not isinstance(env, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                and isinstance(e.get("value", ""), str) for e in env):
            return None
        if len({e["name"] for e in env}) != len(env):
            return None
        rest["spec"] = {**spec, "env": [{**e, "value": True} if "value" in e else e for e in env]}
    try:
        return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None


def env_values(obj: dict[str, Any]) -> dict[str, str]:
    """Name → value of the literal entries of `spec.env` (of an object `alike_key` accepted)."""
    return {e["name"]: e["value"] for e in (obj.get("spec") or {}).get("env") or [] if "value" in e}


def put_env_values(body: dict[str, Any], values: dict[str, str]) -> None:
    """Sets the value of each entry of the admitted `body`'s `spec.env` that `values` names."""
    for entry in (body.get("spec") or {}).get("env") or []:
        if isinstance(entry, dict) and entry.get("name") in values:
            entry["value"] = values[entry["name"]]
