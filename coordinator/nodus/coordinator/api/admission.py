"""Admission: what the resource service calls to decode, default and validate an object.

Every violation in an object is collected and reported at once, in one 422 Invalid whose causes name
the fields the way Kubernetes does (`spec.completions: Invalid value: 0: must be between 1 and 10000`).
The order is always: type and kind, metadata, alias folding, strict decoding with defaults and the
per-field rules of the kind's schema tree, cross-field rules, then references to other objects.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Protocol, Sequence

from .. import errors
from ..errors import Cause, NodusError
from .attempt import ATTEMPT
from . import alike, job_annotations
from .jsondoc import copy_json
from .connection import CONNECTION
from .job import DNS_LABEL, DNS_LABEL_MESSAGE, JOB
from .kinds import KindInfo
from .labels import labels_map, qualified_name_problem
from .limits import BETA, AdmissionLimits
from .schema import FIELD_VALIDATION, Any_, Bool, Decoding, KindSchema, List, Map, Node, Obj, Str, decode, get, join
from .secret import SECRET
from .serviceaccount import SERVICE_ACCOUNT
from .sweep import SWEEP
from .trainingjob import TRAINING_JOB
from .trainingruntime import TRAINING_RUNTIME
from .volume import VOLUME

__all__ = ["Lookup", "Admitted", "AdmissionLimits", "admit_create", "admit_alike", "admit_many", "admit_update",
           "admit_status", "check_body", "schema_for"]


class Lookup(Protocol):
    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        """The stored object as the API returns it (internal: no authorization), or None."""
        ...


@dataclass(frozen=True, slots=True)
class Admitted:
    object: dict[str, Any]
    """The object to store: aliases folded, defaults written, admission pins in status."""
    warnings: tuple[str, ...]
    """Warning header texts (`unknown field "spec.foo"` under fieldValidation=Warn)."""


_SCHEMAS: dict[str, KindSchema] = {s.kind: s for s in (JOB, SWEEP, TRAINING_JOB, TRAINING_RUNTIME, SECRET,
                                                           VOLUME, CONNECTION, SERVICE_ACCOUNT, ATTEMPT)}


def schema_for(info: KindInfo) -> KindSchema:
    return _SCHEMAS[info.kind]


# -- metadata ----------------------------------------------------------------------------------------

_MAX_ANNOTATIONS = 256 * 1024
_qualified_name_problem = qualified_name_problem


def _annotations(annotations: dict[str, Any], path: str) -> list[Cause]:
    causes = [errors.invalid_value(path, key, problem) for key in annotations
              if (problem := _qualified_name_problem(key.lower())) is not None]
    if sum(len(k) + len(v) for k, v in annotations.items() if isinstance(v, str)) > _MAX_ANNOTATIONS:
        causes.append(errors.too_long(path, _MAX_ANNOTATIONS))
    return causes


def _name(name: str, path: str) -> list[Cause]:
    if len(name) > 63:
        return [errors.invalid_value(path, name, "must be no more than 63 characters")]
    if re.match(DNS_LABEL, name) is None:
        return [errors.invalid_value(path, name, DNS_LABEL_MESSAGE)]
    return []


def _generate_name(prefix: str, path: str) -> list[Cause]:
    # Five random characters are appended, so the prefix may end in '-' and has at most 58.
    if re.match(r"^[a-z0-9][-a-z0-9]{0,57}$", prefix) is None:
        return [errors.invalid_value(path, prefix, "must be a lowercase RFC 1123 label prefix of at most 58 "
                                                   "characters (lowercase letters, digits and '-')")]
    return []


def _finalizer(value: str, path: str) -> list[Cause]:
    problem = _qualified_name_problem(value)
    return [errors.invalid_value(path, value, problem)] if problem else []


_SYSTEM = Any_(description="Set by the resource service; passed through untouched.")
METADATA = Obj(fields={
    "name": Str(checks=(_name,)),
    "generateName": Str(checks=(_generate_name,)),
    "namespace": Str(checks=(_name,)),
    "labels": labels_map(),
    "annotations": Map(values=Str(), checks=(_annotations,)),
    "finalizers": List(items=Str(checks=(_finalizer,)), unique=True),
    "ownerReferences": List(items=Obj(required=("apiVersion", "kind", "name", "uid"), fields={
        "apiVersion": Str(), "kind": Str(), "name": Str(), "uid": Str(),
        "controller": Bool(), "blockOwnerDeletion": Bool()})),
    **{key: _SYSTEM for key in ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                                "deletionGracePeriodSeconds", "managedFields", "selfLink")},
})

_ENVELOPE = ("apiVersion", "kind", "metadata", "status")


# -- the shared pass ---------------------------------------------------------------------------------

def _mode(field_validation: str) -> str:
    if field_validation not in FIELD_VALIDATION:
        raise NodusError("BadRequest", f'invalid fieldValidation "{field_validation}": supported values are '
                                       + ", ".join(FIELD_VALIDATION),
                         fix="send fieldValidation=Strict, Warn or Ignore (or leave it out: Strict)")
    return field_validation


def _as_object(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise NodusError("BadRequest", "the request body must be a JSON object", fix="send the object as JSON")
    return obj


def check_body(info: KindInfo, project: str, obj: Any, copy: bool = True) -> dict[str, Any]:
    """A request's body as an object of the request's project (BadRequest otherwise), copied unless not `copy`."""
    if not isinstance(obj, dict):
        raise NodusError("BadRequest", f"the body must be a {info.kind} object",
                         fix="send a JSON object with apiVersion, kind, metadata and spec")
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise NodusError("BadRequest", "metadata must be an object")
    ns = (meta or {}).get("namespace")
    if ns not in (None, "", project):
        raise NodusError("BadRequest", f"the namespace of the provided object ({ns}) does not match "
                         f"the namespace sent on the request ({project})",
                         fix="drop metadata.namespace from the object or send it to that project")
    return copy_json(obj) if copy else obj


@dataclass(slots=True)
class _Pass:
    ctx: Decoding
    metadata: dict[str, Any]
    body: dict[str, Any]


def _decode_object(info: KindInfo, obj: dict[str, Any], mode: str, *, project: str | None, limits: AdmissionLimits,
                   old_body: dict[str, Any] | None = None, owned: bool = False) -> _Pass:
    ks = schema_for(info)
    ctx = Decoding(mode=mode, limits=limits)
    for key, want in (("apiVersion", info.api_version), ("kind", info.kind)):
        value = obj.get(key)
        if value is None or value == "":
            ctx.causes.append(errors.required(key))
        elif value != want:
            ctx.causes.append(errors.invalid_value(key, value, f'must be "{want}"'))
    metadata = _decode_metadata(obj, ctx, project)
    raw = {k: v for k, v in obj.items() if k not in _ENVELOPE}
    raw = raw if owned else copy_json(raw)  # folding changes it in place; decoding makes new containers
    fold_causes = ks.fold(raw)
    body = decode(ks.body, raw, "", ctx)
    if not isinstance(body, dict):  # pragma: no cover - raw is always a dict
        body = {}
    if ks.complete is not None:
        ks.complete(body)
    if old_body is not None and ks.inherit is not None:
        ks.inherit(old_body, body)
    ctx.causes[:0] = fold_causes
    _add_unique(ctx.causes, ks.rules(body, limits))
    if info.kind == "Job":  # annotations the Job controller acts on
        _add_unique(ctx.causes, job_annotations.causes(metadata, body))
    return _Pass(ctx, metadata, body)


def _decode_metadata(obj: dict[str, Any], ctx: Decoding, project: str | None) -> dict[str, Any]:
    raw_meta = obj.get("metadata")
    metadata = decode(METADATA, {} if raw_meta is None else raw_meta, "metadata", ctx)
    if not isinstance(metadata, dict):
        metadata = {}
    elif not metadata.get("name") and not metadata.get("generateName"):
        ctx.causes.append(errors.required("metadata.name", "name or generateName is required"))
    namespace = metadata.get("namespace")
    if project is not None and namespace is not None and namespace != project:
        ctx.causes.append(errors.invalid_value("metadata.namespace", namespace,
                                               f'does not match the project of the request ("{project}")'))
    return metadata


def _add_unique(causes: list[Cause], more: list[Cause]) -> None:
    """Cross-field causes, except where a field already has a cause (one problem, one line)."""
    seen = {c.field for c in causes}
    for cause in more:
        if cause.field not in seen:
            causes.append(cause)
            seen.add(cause.field)


def _raise_if_invalid(info: KindInfo, obj: dict[str, Any], causes: list[Cause]) -> None:
    if not causes:
        return
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or meta.get("generateName") or ""
    raise errors.invalid(info.kind, str(name), causes, group=info.group)


def _assemble(info: KindInfo, metadata: dict[str, Any], body: dict[str, Any], status: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": info.api_version, "kind": info.kind, "metadata": metadata}
    out.update(body)
    if status is not None:
        out["status"] = status
    return out


def _body_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in _ENVELOPE}


# -- entry points ------------------------------------------------------------------------------------

async def admit_create(info: KindInfo, obj: dict[str, Any], lookup: Lookup, *, project: str,
                       field_validation: str = "Strict", limits: AdmissionLimits = BETA,
                       owned: bool = False) -> Admitted:
    """Decode, fold, default and validate a new object under the operator's `limits`; look up what it
    references; pin secrets. `owned`: `obj` is the caller's private copy, which alias folding may change
    (a copy of its body saved, ADR 0106)."""
    mode = _mode(field_validation)
    obj = _as_object(obj)
    ks = schema_for(info)
    p = _decode_object(info, obj, mode, project=project, limits=limits, owned=owned)
    if ks.create_rules is not None:
        _add_unique(p.ctx.causes, ks.create_rules(p.body))
    status = copy_json(obj.get("status"))  # passed through: the resource service decides
    if ks.resolve is not None:
        resolution = await ks.resolve(p.body, lookup, project)
        _add_unique(p.ctx.causes, resolution.causes)
        if resolution.status:
            status = dict(status) if isinstance(status, dict) else {}
            status.update(resolution.status)
    _raise_if_invalid(info, obj, p.ctx.causes)
    if ks.finish is not None:
        ks.finish(p.body)
    return Admitted(_assemble(info, p.metadata, p.body, status), tuple(p.ctx.warnings))


def admit_alike(info: KindInfo, like: Admitted, obj: dict[str, Any], *, project: str) -> Admitted:
    """Admits `obj`, whose `alike.alike_key` is that of the object `like` admitted (under Strict field
    validation): its metadata decoded and checked as admit_create does, its body and status `like`'s with
    its own env values (alike.py says why that is what admit_create would give)."""
    obj = _as_object(obj)
    ctx = Decoding(mode="Strict")
    metadata = _decode_metadata(obj, ctx, project)
    body = copy_json(_body_of(like.object))
    alike.put_env_values(body, alike.env_values(obj))
    if info.kind == "Job":
        _add_unique(ctx.causes, job_annotations.causes(metadata, body))
    _raise_if_invalid(info, obj, ctx.causes)
    return Admitted(_assemble(info, metadata, body, copy_json(like.object.get("status"))), like.warnings)


async def admit_many(info: KindInfo, objs: Sequence[Any], lookup: Lookup, *, project: str,
                     limits: AdmissionLimits = BETA,
                     check: Callable[[Any], dict[str, Any]] = _as_object) -> list[Admitted | NodusError]:
    """admit_create (Strict) of each object, in order, after `check` (the caller's own, raising NodusError),
    a refusal in its place; the objects after the first admitted one with the same `alike_key` are
    admitted from it (`admit_alike`): a Sweep pass's cells decode their template once (ADR 0070)."""
    out: list[Admitted | NodusError] = []
    first: dict[bytes, Admitted] = {}
    for obj in objs:
        key = alike.alike_key(obj)
        like = first.get(key) if key is not None else None
        try:
            obj = check(obj)
            obj.pop("status", None)
            admitted = admit_alike(info, like, obj, project=project) if like is not None else \
                await admit_create(info, obj, lookup, project=project, limits=limits)
        except NodusError as e:
            out.append(e)
            continue
        if key is not None and like is None:
            first[key] = Admitted(copy_json(admitted.object), admitted.warnings)  # the caller changes its own
        out.append(admitted)
    return out


async def admit_update(info: KindInfo, old: dict[str, Any], new: dict[str, Any], lookup: Lookup, *, project: str,
                       field_validation: str = "Strict", limits: AdmissionLimits = BETA) -> Admitted:
    """Validate `new` as on create (under `limits`), then the update rules against `old` (the stored object).

    References are not looked up again: every field that references another object is immutable
    on the kinds that have them, and pins (status.secretVersions) are carried over from `old`.
    """
    mode = _mode(field_validation)
    new = _as_object(new)
    old = _as_object(old)
    ks = schema_for(info)
    old_body = _body_of(old)
    p = _decode_object(info, new, mode, project=project, limits=limits, old_body=old_body)
    _add_unique(p.ctx.causes, _immutable(ks.body, old_body, p.body, "", ks.mutable))
    for path in ks.raise_only:
        _add_unique(p.ctx.causes, _raise_only(path, get(old_body, path), get(p.body, path)))
    _raise_if_invalid(info, new, p.ctx.causes)
    status = copy_json(new.get("status"))
    old_status = old.get("status")
    if not isinstance(old_status, dict):
        old_status = {}
    for key in ("secretVersions", "secretVersionIDs"):
        if key in old_status:
            status = dict(status) if isinstance(status, dict) else {}
            status[key] = copy_json(old_status[key])
    if ks.finish is not None:
        ks.finish(p.body)
    return Admitted(_assemble(info, p.metadata, p.body, status), tuple(p.ctx.warnings))


def admit_status(info: KindInfo, obj: dict[str, Any], *, field_validation: str = "Strict") -> Admitted:
    """Check the shape of `.status` written through the status subresource: types and unknown fields."""
    mode = _mode(field_validation)
    obj = _as_object(obj)
    ks = schema_for(info)
    ctx = Decoding(mode=mode, defaults=False, checks=False)
    out = dict(obj)
    if obj.get("status") is not None:
        status = decode(ks.status, obj["status"], "status", ctx)
        _raise_if_invalid(info, obj, ctx.causes)
        out["status"] = status
    return Admitted(out, tuple(ctx.warnings))


def _immutable(node: Node, old: Any, new: Any, path: str, mutable: tuple[str, ...]) -> list[Cause]:
    """One cause per changed field outside `mutable`, at the deepest object field that changed."""
    if path in mutable or old == new:
        return []
    if isinstance(node, Obj) and isinstance(old, dict) and isinstance(new, dict):
        causes: list[Cause] = []
        for key in list(old) + [k for k in new if k not in old]:
            sub = node.fields.get(key)
            if sub is not None:
                causes += _immutable(sub, old.get(key), new.get(key), join(path, key), mutable)
        return causes
    return [errors.invalid_value(path, new, "field is immutable")]


def _raise_only(path: str, old: Any, new: Any) -> list[Cause]:
    if old is None:
        return []  # adding a cap where there was none is allowed
    try:
        was = Decimal(old)
    except (ArithmeticError, TypeError, ValueError):
        return []
    if new is None:
        return [errors.invalid_value(path, None, f"may only be raised (was {errors.render_value(old)}); "
                                                 "it cannot be removed")]
    try:
        lower = Decimal(new) < was
    except (ArithmeticError, TypeError, ValueError):
        return []  # its format is reported by decoding
    return [errors.invalid_value(path, new, f"may only be raised (was {errors.render_value(old)})")] if lower else []
