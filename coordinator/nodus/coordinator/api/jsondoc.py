"""Deep copies of JSON documents (the stored objects and request bodies), the fast way; and RFC 7386
merge patches of them.

`copy.deepcopy` walks a 2 KB Job in ~170 µs on this machine; a round trip through orjson takes ~20 µs,
and a create copies its object four or five times on its way to the store (bench/api.py's profile).
The copy is the document as the store would give it back: a JSON document round-trips exactly,
tuples come back as lists and enums as their values (what storing them does too); anything orjson
cannot write (a non-string key, an integer past 64 bits, another type) falls back to `copy.deepcopy`.
"""
from __future__ import annotations

import copy
from typing import Any, TypeVar

import orjson

T = TypeVar("T")

_SCALARS = (str, int, float, bool, type(None))


def copy_json(doc: T) -> T:
    """A deep copy of `doc`; the containers are new, the scalars equal."""
    if isinstance(doc, _SCALARS):
        return doc
    try:
        out: T = orjson.loads(orjson.dumps(doc))
    except TypeError:
        return copy.deepcopy(doc)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result
