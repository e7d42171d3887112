"""Label and field selectors, with the Kubernetes syntax.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, joined by commas.
Field selectors: `path=value`, `path==value`, `path!=value` over the fields in FIELDS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from .errors import NodusError

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\)|(==|!=|=)\s*([A-Za-z0-9._-]*))?\s*$")


def _split_top(text: str) -> list[str]:
    """Splits on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Callable[[dict[str, str]], bool], ...]
    text: tuple[str, ...] = ()
    """The requirements as written, one per part: selectors with the same text select the same objects
    (a watch event's translation is shared by the watchers whose selectors are the same, watches.py)."""

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(req(labels) for req in self.requirements)


def parse_label_selector(text: str | None) -> LabelSelector:
    reqs: list[Callable[[dict[str, str]], bool]] = []
    parts = _split_top(text or "")
    for part in parts:
        m = _SET_RE.match(part)
        if not m:
            raise NodusError("BadRequest", f"unable to parse requirement {part!r} in labelSelector",
                             fix="use key=value, key!=value, key in (a,b), key notin (a), key or !key")
        neg, key, setop, values, op, value = m.groups()
        if neg and (setop or op):
            raise NodusError("BadRequest", f"unable to parse requirement {part!r} in labelSelector")
        if neg:
            reqs.append(partial(_absent, key))
        elif setop:
            vals = frozenset(v.strip() for v in values.split(",") if v.strip())
            reqs.append(partial(_in if setop == "in" else _not_in, key, vals))
        elif op in ("=", "=="):
            reqs.append(partial(_equal, key, value))
        elif op == "!=":
            reqs.append(partial(_not_equal, key, value))
        else:
            reqs.append(partial(_present, key))
    return LabelSelector(tuple(reqs), tuple(parts))


# One requirement each, bound to its key (and values) with partial.
def _absent(key: str, labels: dict[str, str]) -> bool:
    return key not in labels


def _present(key: str, labels: dict[str, str]) -> bool:
    return key in labels


def _in(key: str, values: frozenset[str], labels: dict[str, str]) -> bool:
    return labels.get(key) in values


def _not_in(key: str, values: frozenset[str], labels: dict[str, str]) -> bool:
    return labels.get(key) not in values


def _equal(key: str, value: str, labels: dict[str, str]) -> bool:
    return labels.get(key) == value


def _not_equal(key: str, value: str, labels: dict[str, str]) -> bool:
    return labels.get(key) != value


def _get(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


FIELDS = ("metadata.name", "metadata.namespace", "status.phase", "spec.state")
"""Fields every kind may be selected by."""


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[tuple[str, bool, str], ...]
    """(path, equal, value)"""

    def matches(self, obj: dict[str, Any]) -> bool:
        for path, equal, value in self.requirements:
            actual = _get(obj, path)
            actual_s = "" if actual is None else str(actual)
            if (actual_s == value) != equal:
                return False
        return True

    def name(self) -> str | None:
        """The single metadata.name this selector pins, if any (lets a watch skip other keys)."""
        for path, equal, value in self.requirements:
            if path == "metadata.name" and equal:
                return value
        return None


def parse_field_selector(text: str | None, extra: tuple[str, ...] = ()) -> FieldSelector:
    """`fieldSelector` over FIELDS and the kind's own `extra` fields (an Event's involvedObject.name …)."""
    allowed = FIELDS + extra
    reqs: list[tuple[str, bool, str]] = []
    for part in _split_top(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise NodusError("BadRequest", f"invalid fieldSelector requirement {part!r}",
                             fix="use path=value or path!=value")
        path, op, value = m.groups()
        if path not in allowed:
            raise NodusError("BadRequest", f'field label not supported: "{path}"',
                             fix="select by one of " + ", ".join(allowed))
        reqs.append((path, op != "!=", value))
    return FieldSelector(tuple(reqs))
