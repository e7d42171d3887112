"""One schema source per kind: a small declarative field tree.

Each kind module builds a tree of these nodes; from the one tree come strict decoding (unknown fields
and wrong types reported by full path), defaulting, the per-field rule checks, and the OpenAPI v3
schema that `kubectl explain` reads (rendered by openapi.py). Deriving all four from one tree is what
stops the documented rules and the enforced rules from drifting apart.

Rules that involve more than one field (exactly-one-of aside) live in the kind modules as functions
over the decoded object; `KindSchema` bundles a kind's tree with those functions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import orjson

from .. import errors
from ..errors import Cause
from . import units
from .jsondoc import copy_json
from .limits import BETA, AdmissionLimits

if TYPE_CHECKING:
    from .admission import Lookup

Check = Callable[[Any, str], "list[Cause]"]
"""An extra per-field rule: (decoded value, path) -> causes."""
LimitCheck = Callable[[Any, str, AdmissionLimits], "list[Cause]"]
"""A per-field rule under the operator's limits: (decoded value, path, limits) -> causes."""


# -- nodes -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    description: str = ""
    default: Any = None
    """Written into the object when the field is absent (None: no default)."""
    checks: tuple[Check, ...] = ()
    limit_checks: tuple[LimitCheck, ...] = ()
    """Rules that read the decoding's `AdmissionLimits` (a gang's node cap)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Str(Node):
    enum: tuple[str, ...] = ()
    pattern: str | None = None
    pattern_message: str | None = None
    """Replaces `must match the regex …` when the regex alone would not say what is wanted."""
    min_length: int | None = None
    max_length: int | None = None
    format: str | None = None
    """duration | quantity | money | time | decimal: parsed and range-checked, never as float."""
    minimum: str | None = None
    """In the format's own terms: "1m" for a duration, "0" for money, "2Ti" for a quantity."""
    maximum: str | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    literals: tuple[str, ...] = ()
    """Words accepted besides the format, such as `auto` for a checkpoint interval."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Int(Node):
    minimum: int | None = None
    maximum: int | None = None
    enum: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Bool(Node):
    enum: tuple[bool, ...] = ()
    enum_message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Scalar(Node):
    """A string, number or boolean (a Sweep parameter value)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Any_(Node):
    """Anything, passed through untouched (system metadata the resource service owns)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Free(Node):
    """A free-form JSON object (`x-kubernetes-preserve-unknown-fields`)."""

    max_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class List(Node):
    items: Node
    min_items: int | None = None
    max_items: int | None = None
    unique_key: str | None = None
    """Items are objects whose `unique_key` field must be unique."""
    unique: bool = False
    """Items are scalars that must be unique."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Map(Node):
    values: Node
    key_pattern: str | None = None
    key_message: str | None = None
    key_enum: tuple[str, ...] = ()
    max_entries: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Obj(Node):
    fields: dict[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = ()
    """Groups of fields of which exactly one must be set."""
    materialize: bool = False
    """Create the object when absent, so that its defaults are written (placement, recovery …)."""
    defaults: tuple[tuple[str, Any], ...] = field(default=(), init=False, repr=False, compare=False)
    """What absent fields become: a field's `default` or a materialized object's defaults (worked out once)."""

    def __post_init__(self) -> None:
        pairs = ((k, s.default) if s.default is not None else (k, dict(s.defaults))
                 if isinstance(s, Obj) and s.materialize and s.defaults else None for k, s in self.fields.items())
        object.__setattr__(self, "defaults", tuple(p for p in pairs if p is not None))


# -- decoding ----------------------------------------------------------------------------------------

FIELD_VALIDATION = ("Strict", "Warn", "Ignore")
_INVALID = object()
"""Returned for a value of the wrong type; its parent leaves the key out."""


@dataclass(slots=True)
class Decoding:
    """One decoding pass: its options and what it found."""

    mode: str = "Strict"
    defaults: bool = True
    checks: bool = True
    limits: AdmissionLimits = BETA
    """The operator's limits that `limit_checks` and the kind's cross-field rules read."""
    causes: list[Cause] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def unknown(self, path: str) -> None:
        if self.mode == "Strict":
            self.causes.append(errors.unknown_field(path))
        elif self.mode == "Warn":
            self.warnings.append(f'unknown field "{path}"')


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_error(ctx: Decoding, path: str, value: Any, kind: str) -> Any:
    ctx.causes.append(errors.invalid_value(path, value, f"must be of type {kind}"))
    return _INVALID


def decode(node: Node, value: Any, path: str, ctx: Decoding) -> Any:
    """Decode `value` against `node`; returns the decoded value or _INVALID."""
    if isinstance(node, Obj):
        return _decode_obj(node, value, path, ctx)
    if isinstance(node, List):
        return _decode_list(node, value, path, ctx)
    if isinstance(node, Map):
        return _decode_map(node, value, path, ctx)
    if isinstance(node, Str):
        return _decode_str(node, value, path, ctx)
    if isinstance(node, Int):
        return _decode_int(node, value, path, ctx)
    if isinstance(node, Bool):
        if not isinstance(value, bool):
            return _type_error(ctx, path, value, "boolean")
        if ctx.checks and node.enum and value not in node.enum:
            ctx.causes.append(errors.invalid_value(path, value, node.enum_message or "not allowed"))
        return _run_checks(node, value, path, ctx)
    if isinstance(node, Scalar):
        if isinstance(value, (dict, list)) or value is None:
            return _type_error(ctx, path, value, "string, number or boolean")
        return value
    if isinstance(node, Free):
        if not isinstance(value, dict):
            return _type_error(ctx, path, value, "object")
        if ctx.checks and node.max_bytes is not None and len(orjson.dumps(value)) > node.max_bytes:
            ctx.causes.append(errors.too_long(path, node.max_bytes))
        return _run_checks(node, copy_json(value), path, ctx)
    if isinstance(node, Any_):
        return value
    raise TypeError(f"unknown schema node {node!r}")  # pragma: no cover


def _run_checks(node: Node, value: Any, path: str, ctx: Decoding) -> Any:
    if ctx.checks:
        for check in node.checks:
            ctx.causes.extend(check(value, path))
        for limit_check in node.limit_checks:
            ctx.causes.extend(limit_check(value, path, ctx.limits))
    return value


def _decode_obj(node: Obj, value: Any, path: str, ctx: Decoding) -> Any:
    if not isinstance(value, dict):
        return _type_error(ctx, path, value, "object")
    out: dict[str, Any] = {}
    fields, prefix = node.fields, f"{path}." if path else ""
    for key, raw in value.items():
        sub = fields.get(key)
        if sub is None:
            ctx.unknown(prefix + key)
            continue
        if raw is None:  # null means unset, as for a Kubernetes custom resource
            continue
        decoded = _DECODERS[type(sub)](sub, raw, prefix + key, ctx) if type(sub) in _DECODERS \
            else decode(sub, raw, prefix + key, ctx)
        if decoded is not _INVALID:
            out[key] = decoded
    if ctx.defaults:
        for key, default in node.defaults:
            if key not in out and value.get(key) is None:
                out[key] = copy_json(default)  # JSON values only: scalars as they are, containers new
    if ctx.checks:
        for key in node.required:
            if key not in out and value.get(key) is None:
                ctx.causes.append(errors.required(join(path, key)))
        for group in node.one_of:
            present = [k for k in group if value.get(k) is not None]
            if not present:
                ctx.causes.append(errors.required(path, "exactly one of " + _or(group) + " must be set"))
            elif len(present) > 1:
                ctx.causes.append(errors.forbidden(
                    path, f"exactly one of {_or(group)} may be set, not {' and '.join(present)}"))
    return _run_checks(node, out, path, ctx)


_DECODERS: dict[type, Callable[[Any, Any, str, Decoding], Any]] = {}
"""The decoders of the common node types, by exact type: an object's fields skip `decode`'s chain of
isinstance tests (filled below, once the decoders exist)."""


def _or(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def _decode_list(node: List, value: Any, path: str, ctx: Decoding) -> Any:
    if not isinstance(value, list):
        return _type_error(ctx, path, value, "array")
    out = []
    for i, raw in enumerate(value):
        if raw is None:
            ctx.causes.append(errors.required(f"{path}[{i}]", "null is not an item"))
            continue
        decoded = decode(node.items, raw, f"{path}[{i}]", ctx)
        if decoded is not _INVALID:
            out.append(decoded)
    if ctx.checks:
        if node.max_items is not None and len(value) > node.max_items:
            ctx.causes.append(errors.too_many(path, len(value), node.max_items))
        if node.min_items is not None and len(value) < node.min_items:
            ctx.causes.append(errors.required(path, f"must have at least {node.min_items} item"
                                              + ("s" if node.min_items > 1 else "")))
        if node.unique_key:
            seen: set[Any] = set()
            for i, item in enumerate(value):
                if isinstance(item, dict) and isinstance(item.get(node.unique_key), (str, int)):
                    key = item[node.unique_key]
                    if key in seen:
                        ctx.causes.append(errors.duplicate(f"{path}[{i}].{node.unique_key}", key))
                    seen.add(key)
        if node.unique:
            seen_values: list[Any] = []
            for i, item in enumerate(out):
                if item in seen_values:
                    ctx.causes.append(errors.duplicate(f"{path}[{i}]", item))
                seen_values.append(item)
    return _run_checks(node, out, path, ctx)


def _decode_map(node: Map, value: Any, path: str, ctx: Decoding) -> Any:
    if not isinstance(value, dict):
        return _type_error(ctx, path, value, "object")
    out: dict[str, Any] = {}
    for key, raw in value.items():
        sub_path = f"{path}[{key}]"
        if ctx.checks:
            if node.key_enum and key not in node.key_enum:
                ctx.causes.append(errors.not_supported(sub_path, key, node.key_enum))
            elif node.key_pattern and re.fullmatch(node.key_pattern, key) is None:
                ctx.causes.append(errors.invalid_value(
                    path, key, node.key_message or f"keys must match the regex {node.key_pattern}"))
        if raw is None:
            continue
        decoded = decode(node.values, raw, sub_path, ctx)
        if decoded is not _INVALID:
            out[key] = decoded
    if ctx.checks and node.max_entries is not None and len(value) > node.max_entries:
        ctx.causes.append(errors.too_many(path, len(value), node.max_entries))
    return _run_checks(node, out, path, ctx)


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _decode_int(node: Int, value: Any, path: str, ctx: Decoding) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _type_error(ctx, path, value, "integer")
    if isinstance(value, float):
        if not value.is_integer():
            return _type_error(ctx, path, value, "integer")
        value = int(value)  # YAML and some encoders write 2.0 for 2
    if not _INT64_MIN <= value <= _INT64_MAX:  # a fact of the format, checks or not (a status write too)
        ctx.causes.append(errors.invalid_value(path, value, "must fit in a 64-bit integer"))
        return _INVALID
    if ctx.checks:
        if node.enum and value not in node.enum:
            ctx.causes.append(errors.not_supported(path, value, [str(e) for e in node.enum]))
        elif node.minimum is not None and node.maximum is not None:
            if not node.minimum <= value <= node.maximum:
                ctx.causes.append(errors.invalid_value(
                    path, value, f"must be between {node.minimum} and {node.maximum}"))
        elif node.minimum is not None and value < node.minimum:
            ctx.causes.append(errors.invalid_value(
                path, value, f"must be greater than or equal to {node.minimum}"))
        elif node.maximum is not None and value > node.maximum:
            ctx.causes.append(errors.invalid_value(
                path, value, f"must be less than or equal to {node.maximum}"))
    return _run_checks(node, value, path, ctx)


_PARSERS: dict[str, Callable[[Any], Decimal]] = {
    "duration": units.duration_seconds,
    "quantity": units.parse_quantity,
    "money": units.parse_money,
    "decimal": units.parse_decimal,
}


def _decode_str(node: Str, value: Any, path: str, ctx: Decoding) -> Any:
    if node.format == "quantity" and isinstance(value, (int, float)) and not isinstance(value, bool):
        # Kubernetes quantities are int-or-string; store the string form.
        value = str(value) if isinstance(value, int) or not value.is_integer() else str(int(value))
    if not isinstance(value, str):
        if node.format == "money" and isinstance(value, (int, float)) and not isinstance(value, bool):
            ctx.causes.append(errors.invalid_value(path, value, units.MONEY_HINT + "; a JSON number is not accepted"))
            return _INVALID
        return _type_error(ctx, path, value, "string")
    if not ctx.checks:
        return value
    if node.enum:
        if value not in node.enum:
            ctx.causes.append(errors.not_supported(path, value, node.enum))
        return _run_checks(node, value, path, ctx)
    if node.literals and value in node.literals:
        return _run_checks(node, value, path, ctx)
    if node.min_length is not None and len(value) < node.min_length:
        if node.min_length == 1:
            ctx.causes.append(errors.required(path, "must not be empty"))
        else:
            ctx.causes.append(errors.invalid_value(
                path, value, f"must be at least {node.min_length} characters"))
        return value
    if node.max_length is not None and len(value.encode()) > node.max_length:
        ctx.causes.append(errors.too_long(path, node.max_length))
        return value
    if node.pattern and re.search(node.pattern, value) is None:
        ctx.causes.append(errors.invalid_value(
            path, value, node.pattern_message or f"must match the regex {node.pattern}"))
        return value
    if node.format:
        value = _check_format(node, value, path, ctx)
    return _run_checks(node, value, path, ctx)


def _check_format(node: Str, value: str, path: str, ctx: Decoding) -> str:
    fmt = node.format
    if fmt == "time":
        try:
            return units.format_time(units.parse_time(value))
        except ValueError as exc:
            ctx.causes.append(errors.invalid_value(path, value, str(exc)))
            return value
    parser = _PARSERS[fmt or ""]
    try:
        amount = parser(value)
    except ValueError as exc:
        ctx.causes.append(errors.invalid_value(path, value, str(exc)))
        return value
    lo = parser(node.minimum) if node.minimum is not None else None
    hi = parser(node.maximum) if node.maximum is not None else None
    low_bad = lo is not None and (amount <= lo if node.exclusive_minimum else amount < lo)
    high_bad = hi is not None and (amount >= hi if node.exclusive_maximum else amount > hi)
    if low_bad or high_bad:
        ctx.causes.append(errors.invalid_value(path, value, range_rule(node)))
    if fmt == "duration":
        # Stored in Go's canonical form (as a metav1.Duration round-trips), so "24h" and "1440m" are
        # the same value to the immutability check and to every reader.
        return units.format_duration(units.parse_duration_ns(value))
    return value


_DECODERS.update({Obj: _decode_obj, List: _decode_list, Map: _decode_map, Str: _decode_str, Int: _decode_int})


def range_rule(node: Str) -> str:
    """The rule text for a formatted string's range: `must be between 1m and 6h`."""
    lo, hi = node.minimum, node.maximum
    if lo is not None and hi is not None and not node.exclusive_minimum and not node.exclusive_maximum:
        return f"must be between {lo} and {hi}"
    parts = []
    if lo is not None:
        parts.append(f"greater than {lo}" if node.exclusive_minimum else f"at least {lo}")
    if hi is not None:
        parts.append(f"less than {hi}" if node.exclusive_maximum else f"at most {hi}")
    return "must be " + " and ".join(parts)


# -- shorthands for the kind modules ---------------------------------------------------------------

def duration(description: str, *, minimum: str | None = "0s", maximum: str | None = None,
             positive: bool = False, default: str | None = None, literals: tuple[str, ...] = ()) -> Str:
    """A Go duration field; `positive` means strictly greater than 0s."""
    return Str(description=description, format="duration", default=default, literals=literals,
               minimum="0s" if positive else minimum, exclusive_minimum=positive, maximum=maximum)


def money(description: str, *, positive: bool = True) -> Str:
    return Str(description=description, format="money", minimum="0", exclusive_minimum=positive)


def quantity(description: str, *, maximum: str | None = None, positive: bool = False,
             default: str | None = None) -> Str:
    return Str(description=description, format="quantity", minimum="0", exclusive_minimum=positive,
               maximum=maximum, default=default)


def strings(description: str, **kw: Any) -> List:
    return List(description=description, items=Str(), **kw)


def get(obj: Any, dotted: str) -> Any:
    """`get(spec, "recovery.checkpoint.interval")`, None where any step is missing."""
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


# -- a kind ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Resolution:
    """What looking up references found: causes, and status fields admission pins."""

    causes: list[Cause] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)


def _no_fold(body: dict[str, Any]) -> list[Cause]:
    return []


@dataclass(frozen=True, slots=True)
class KindSchema:
    """A kind's tree plus its cross-field rules; what admission runs for it."""

    kind: str
    description: str
    body: Obj
    """The top-level fields besides apiVersion, kind, metadata and status (spec; or type/data for a Secret)."""
    status: Obj
    rules: Callable[[dict[str, Any], AdmissionLimits], list[Cause]]
    """Cross-field rules over the decoded, defaulted body, under the operator's limits."""
    fold: Callable[[dict[str, Any]], list[Cause]] = _no_fold
    """Alias folding on the raw body, before decoding (mutates it)."""
    complete: Callable[[dict[str, Any]], None] | None = None
    """Defaults that depend on other fields, written after decoding."""
    resolve: Callable[[dict[str, Any], "Lookup", str], Awaitable[Resolution]] | None = None
    """Reference checks against other stored objects (create only)."""
    mutable: tuple[str, ...] = ()
    """Dotted paths within the body that may change on update; the rest is immutable."""
    raise_only: tuple[str, ...] = ()
    """Money paths that may only be raised on update."""
    create_rules: Callable[[dict[str, Any]], list[Cause]] | None = None
    """Rules for a create only (a Secret must bring at least one key; an update may keep the stored ones)."""
    inherit: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    """On update: carry over from the old body what the new one may leave out (Secret data)."""
    finish: Callable[[dict[str, Any]], None] | None = None
    """After a successful validation: the stored form (Secret stringData folded into data)."""
