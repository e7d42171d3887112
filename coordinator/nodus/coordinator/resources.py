"""The resource service: every verb on every kind, with identity, admission and the store.

REST (`gateway/`) and gRPC (`grpc_api.py`) are thin transports over this one class, so both answer
the same rules with the same errors. Objects are plain JSON dicts; the store holds them without
`metadata.resourceVersion`, which is the store revision of their last write and is added on read.
"""
from __future__ import annotations

import asyncio
import secrets as pysecrets
import uuid
from typing import Any, Callable, Protocol, Sequence

import jsonpatch
import orjson

from .api.admission import Admitted, admit_create, admit_many, admit_status, admit_update, check_body
from .api.jsondoc import copy_json
from .api.jsondoc import merge_patch as merge_patch  # the API's RFC 7386, imported from here by tests
from .api.kinds import KindInfo, resolve
from .api.limits import BETA, AdmissionLimits
from .continue_tokens import decode_continue, encode_continue
from .controllers.fleet import Fleet
from .controllers.job_controller import FirstDecision
from .controllers.objects import encode as encode_object
from .errors import NodusError
from .identity import SYSTEM, Caller, Identity, Role
from .images import ImageResolver
from .selectors import FieldSelector, LabelSelector
from .status_write import admitted_status, write_status
from .store.base import Record, Store
from .store.lease import FENCE, Fence
from .stored import ListPage, decode as _decode, encode as _encode, key as _key, parse_rv as _parse_rv, \
    prefix as _prefix, utc_now as utc_now
from .strategies import KindStrategy, strategies
from .sweep_cells import SweepCellService, SweepSettings
from .vault import Vault
from .watches import EventCache, WatchStream

_MAX_PATCH_RETRIES, _MAX_PAGE, _DEFAULT = 8, 1 << 31, KindStrategy()
_JOBS = resolve("jobs")


class _Lookup:
    """Admission's read access to other objects (internal: no identity checks)."""

    def __init__(self, service: "ResourceService") -> None:
        self._service = service

    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return _decode(await self._service.store.get(f"{plural}/{project}/{name}"))


class FirstDecider(Protocol):
    """What a Job create asks the Job controller (controllers/job_controller.py, ADR 0108; on a follower ADR 0122)."""
    @property
    def fence(self) -> Fence | None:
        """The lease epoch the Job and its attempts are written under (a follower's: its last claim's, ADR 0122)."""

    def decide_first(self, project: str, job: dict[str, Any]) -> FirstDecision | None:
        """The Job's first decision before it is stored; None: left to the controller's reconcile."""

    def first_written(self, records: Sequence[Record], first: FirstDecision, job: dict[str, Any]) -> None:
        """The Job and its attempts as stored by one commit; `job`, `first.attempts`: the documents (ADR 0114)."""


class ResourceService:
    def __init__(self, store: Store, identity: Identity, vault: Vault,
                 now: Callable[[], str] = utc_now, bookmark_seconds: float = 30.0,
                 limits: AdmissionLimits = BETA, images: ImageResolver | None = None,
                 fleet: Fleet | None = None, sweeps: SweepSettings = SweepSettings()) -> None:
        self.store, self.identity, self.vault, self._now, self._fleet = store, identity, vault, now, fleet
        self._lookup = _Lookup(self)
        self._strategies = strategies(vault, images, self._lookup, store, fleet, identity)  # Jobs: digests, estimates
        self.bookmark_seconds, self._watch_cache = bookmark_seconds, EventCache()  # one decode per event
        self.limits = limits
        """What admission lets an object ask for (`nodus-coordinator --gang-max-nodes`)."""
        self.sweep_cells = SweepCellService(fleet.cache if fleet is not None else None, sweeps)  # large Sweeps' rows
        self.first_decisions: FirstDecider | None = None
        """The leading Job controller, whose first decision a Job is created with (ADR 0108); None: left to it."""

    def _strategy(self, info: KindInfo) -> KindStrategy:
        return self._strategies.get(info.kind, _DEFAULT)

    # -- authorization --------------------------------------------------------------------------
    async def _authorize(self, caller: Caller, info: KindInfo, project: str, verb: str, needed: Role) -> None:
        if not caller.can(project, needed):
            raise NodusError("Forbidden",
                f'{info.resource} is forbidden: User "{caller.subject}" cannot {verb} resource '
                f'"{info.plural}" in API group "{info.group}" in the namespace "{project}"',
                kind=info.plural, group=info.group,
                fix=f"use a token with the {needed.name.lower()} role in project {project}")

    @staticmethod
    def _refuse_read_only(caller: Caller, info: KindInfo, verb: str) -> None:
        """Attempts are written by the coordinator alone; anyone else may only read them."""
        if info.read_only and caller is not SYSTEM:
            raise NodusError("MethodNotAllowed", f"{info.resource} are read-only: the coordinator "
                             f"{'creates' if verb == 'create' else 'writes'} them; {verb} is not allowed",
                             kind=info.plural, group=info.group,
                             fix=f"change the owning Job instead (for example spec.state or spec.parallelism); "
                                 f"get, list and watch {info.plural} to follow them")

    def _not_found(self, info: KindInfo, name: str) -> NodusError:
        return NodusError("NotFound", f'{info.resource} "{name}" not found',
                          name=name, kind=info.plural, group=info.group)

    # -- reads ------------------------------------------------------------------------------------
    async def get(self, caller: Caller, info: KindInfo, project: str, name: str) -> dict[str, Any]:
        await self._authorize(caller, info, project, "get", Role.VIEWER)
        obj = _decode(await self.store.get(_key(info, project, name)))
        if obj is None:
            raise self._not_found(info, name)
        return self.sweep_cells.served(info, obj)

    async def list(self, caller: Caller, info: KindInfo, project: str | None, *,
                   labels: LabelSelector, fields: FieldSelector, limit: int = 0,
                   continue_token: str = "", resource_version: str = "",
                   resource_version_match: str = "") -> ListPage:
        if project:
            await self._authorize(caller, info, project, "list", Role.VIEWER)
        if limit < 0:
            raise NodusError("BadRequest", f"limit {limit} is negative", fix="pass limit=0 (everything) or a page size")
        limit = min(limit, _MAX_PAGE)  # a page larger than any keyspace here means "everything"
        if resource_version_match not in ("", "Exact", "NotOlderThan"):
            raise NodusError("BadRequest", f"resourceVersionMatch {resource_version_match!r} is not supported",
                             fix="use resourceVersionMatch=NotOlderThan or Exact (with a resourceVersion)")
        snapshot: int | None = None
        start_after: str | None = None
        if continue_token:
            snapshot, start_after = decode_continue(continue_token)
        elif resource_version_match == "Exact":
            snapshot = _parse_rv(resource_version)
        else:
            _parse_rv(resource_version)
        items: list[dict[str, Any]] = []
        prefix = _prefix(info, project)
        name = fields.name()
        if name and project:
            prefix = _key(info, project, name)
        more = False
        last_key = start_after
        revision = snapshot
        while True:
            chunk = max(limit - len(items), 0) * 2 + 16 if limit else 0
            try:
                result = await self.store.list(prefix, limit=chunk, start_after=last_key, revision=snapshot)
            except NodusError as e:
                if e.reason == "Expired" and continue_token:
                    raise NodusError("Expired", "The provided continue parameter is too old to display a "
                                     "consistent list result. You can start a new list without the continue "
                                     "parameter.") from None
                raise
            revision = result.revision
            snapshot = result.revision
            for rec in result.records:
                if name and project and rec.key != prefix:
                    continue
                last_key = rec.key
                obj = _decode(rec)
                assert obj is not None
                if not project and not caller.can(obj["metadata"]["namespace"], Role.VIEWER):
                    continue
                if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj):
                    items.append(self.sweep_cells.served(info, obj))
                    if limit and len(items) >= limit:
                        break
            if limit and len(items) >= limit:
                more = result.more or rec is not result.records[-1]
                break
            if not result.more:
                break
        token = encode_continue(revision or 0, last_key or "") if more else ""
        return ListPage(items, str(revision or self.store.revision), token, None)

    # -- watch ------------------------------------------------------------------------------------
    async def watch(self, caller: Caller, info: KindInfo, project: str | None, *,
                    labels: LabelSelector, fields: FieldSelector, resource_version: str = "",
                    send_initial_events: bool = False, allow_bookmarks: bool = False) -> WatchStream:
        """Events after `resource_version`; with "" or "0" (or send_initial_events) first an ADDED for
        every current object. Raises Expired (410) for a compacted version."""
        if project:
            await self._authorize(caller, info, project, "watch", Role.VIEWER)
        start = _parse_rv(resource_version)
        initial: list[dict[str, Any]] = []
        if send_initial_events or not start:
            page = await self.list(caller, info, project, labels=labels, fields=fields)
            initial = page.items
            start = int(page.resource_version)
        elif start < self.store.compacted_revision:
            raise NodusError("Expired", f"too old resource version: {start} ({self.store.compacted_revision})")
        return WatchStream(self.store, caller, info, project, labels, fields, start, initial,
                           send_initial_events=send_initial_events, allow_bookmarks=allow_bookmarks,
                           bookmark_seconds=self.bookmark_seconds, cache=self._watch_cache)

    # -- writes -----------------------------------------------------------------------------------
    async def create(self, caller: Caller, info: KindInfo, project: str, obj: Any, *, if_match: str = "",
                     dry_run: bool = False, field_validation: str = "Strict",
                     owned: bool = False) -> tuple[dict[str, Any], tuple[str, ...]]:
        """`owned`: `obj` is the caller's own fresh parse that nothing else holds (the REST gateway's body):
        it is admitted in place rather than copied, and the object created is answered as admitted rather
        than decoded back from the bytes just stored (the same JSON document)."""
        await self._authorize(caller, info, project, "create", Role.EDITOR)
        self._refuse_read_only(caller, info, "create")
        obj = check_body(info, project, obj, copy=not owned)
        await self.identity.require_project(project)
        async with Fleet.admitting(self._fleet, info.kind, dry_run):  # placement before admission (ADR 0075)
            return await self._create(info, project, obj, if_match, dry_run, field_validation,
                                      read_back=not owned)

    async def create_many(self, caller: Caller, info: KindInfo, project: str, objs: Sequence[dict[str, Any]],
                          created: Callable[[dict[str, Any]], None] | None = None) -> Sequence[dict[str, Any] | NodusError]:
        """Creates each object as `create` does, with the caller's rights and the project checked once and
        alike objects admitted once (`admit_many`): a controller's creates of one pass (a Sweep's cells), whose
        writes commit in one transaction. One result per object, in order: the object created, or the
        NodusError its create raised; `created` gets each created object at once (a controller's cache takes
        it before the store's watch does). The objects are the caller's to give: admitted in place."""
        await self._authorize(caller, info, project, "create", Role.EDITOR)
        self._refuse_read_only(caller, info, "create")
        await self.identity.require_project(project)

        async def one(admitted: Admitted | NodusError) -> dict[str, Any] | NodusError:
            try:
                made = admitted if isinstance(admitted, NodusError) else \
                    (await self._create(info, project, {}, admitted=admitted))[0]
            except NodusError as e:
                made = e
            if created is not None and not isinstance(made, NodusError):
                created(made)
            return made
        return await asyncio.gather(*(one(a) for a in await admit_many(
            info, objs, self._lookup, project=project, limits=self.limits,
            check=lambda obj: check_body(info, project, obj, copy=False))))

    async def _create(self, info: KindInfo, project: str, obj: dict[str, Any], if_match: str = "",
                      dry_run: bool = False, field_validation: str = "Strict", read_back: bool = True, *,
                      admitted: Admitted | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
        if admitted is None:  # else `obj` was admitted already (create_many)
            obj.pop("status", None)
            admitted = await admit_create(info, obj, self._lookup, project=project, field_validation=field_validation,
                                          limits=self.limits, owned=True)  # create's copy or the gateway's parse
        new = admitted.object
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise NodusError("Invalid", f"{info.kind}.{info.group} is invalid: metadata.name: Required value: "
                                 "name or generateName is required", kind=info.plural, group=info.group,
                                 causes=(), fix="set metadata.name")
            meta["name"] = meta["generateName"] + pysecrets.token_hex(3)[:5]
        for system in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(system, None)
        meta.update(namespace=project, uid=str(uuid.uuid4()), generation=1, creationTimestamp=self._now())
        strategy = self._strategy(info)
        values = strategy.on_create(new, self._now())
        await strategy.prepare(project, new, if_match)  # if_match: the estimate a create is bound to
        if dry_run:
            new["metadata"]["resourceVersion"] = ""
            return new, admitted.warnings
        strategy.refuse(new)
        key = _key(info, project, meta["name"])
        if values is not None:
            if await self.store.get(key) is not None:
                raise self._already_exists(info, meta["name"])
            await strategy.keep(project, meta["name"], new, values)
        rec = await self._create_first(info, project, key, new) if values is None else None
        if rec is None:
            try:
                rec = await self.store.create(key, _encode(new))
            except NodusError as e:
                if e.reason == "AlreadyExists":
                    raise self._already_exists(info, meta["name"]) from None
                raise
        if not read_back:
            meta["resourceVersion"] = str(rec.revision)
            return new, admitted.warnings
        return _decode(rec), admitted.warnings  # type: ignore[return-value]

    async def _create_first(self, info: KindInfo, project: str, key: str, new: dict[str, Any]) -> Record | None:
        """A Job created with its first decision (ADR 0108): the Job with the status the Job controller's first
        reconcile would write and the attempts it would create, in one commit, whole or not at all. None (`new` as
        it was) where no Job controller leads here, the store cannot create keys together, `decide_first` leaves it
        to the controller, or the commit is refused (a key there already, a deposed leader): then the plain create."""
        decider = self.first_decisions
        if (decider is None or not self.store.creates_together or info.plural != _JOBS.plural
                or info.group != _JOBS.group):
            return None
        first = decider.decide_first(project, new)
        if first is None:
            return None
        before = new.get("status")
        new["status"] = admitted_status(_JOBS, before, first.status)
        fence = FENCE.set(decider.fence)  # the controller's writes, under its lease (as its own reconcile's)
        try:
            records = await self.store.create_together(
                [(key, _encode(new)), *((k, encode_object(a)) for k, a in first.attempts.items())])
        except NodusError as e:
            if e.reason not in ("AlreadyExists", "LeaderDeposed"):
                raise
            if before is None:
                new.pop("status", None)
            else:
                new["status"] = before
            return None
        finally:
            FENCE.reset(fence)
        decider.first_written(records, first, new)
        return records[0]

    def _already_exists(self, info: KindInfo, name: str) -> NodusError:
        return NodusError("AlreadyExists", f'{info.resource} "{name}" already exists',
                          name=name, kind=info.plural, group=info.group,
                          fix="choose another name, or change it with `kubectl apply` / `nodus apply`")

    async def replace(self, caller: Caller, info: KindInfo, project: str, name: str, obj: Any, *,
                      subresource: str = "", dry_run: bool = False,
                      field_validation: str = "Strict") -> tuple[dict[str, Any], tuple[str, ...]]:
        await self._authorize(caller, info, project, "update", Role.ADMIN if subresource else Role.EDITOR)
        self._refuse_read_only(caller, info, "update")
        obj = check_body(info, project, obj)
        meta = obj.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise NodusError("BadRequest", f'the name of the object ({meta.get("name")}) does not match the '
                             f"name on the URL ({name})")
        expected = _parse_rv(meta.get("resourceVersion"), "metadata.resourceVersion")
        if expected is None:
            raise NodusError("Invalid", f'{info.kind}.{info.group} "{name}" is invalid: metadata.resourceVersion: '
                             "Invalid value: 0x0: must be specified for an update", name=name,
                             kind=info.plural, group=info.group,
                             fix="send the object as last read (with metadata.resourceVersion), or use PATCH")
        old_rec = await self.store.get(_key(info, project, name))
        old = _decode(old_rec)
        if old is None:
            raise self._not_found(info, name)
        if old_rec is not None and old_rec.revision != expected:
            raise self._conflict(info, name)
        return await self._write_update(caller, info, project, old, obj, expected, subresource, dry_run, field_validation)

    async def patch(self, caller: Caller, info: KindInfo, project: str, name: str, patch_type: str,
                    patch_body: bytes, *, subresource: str = "", dry_run: bool = False,
                    field_validation: str = "Strict") -> tuple[dict[str, Any], tuple[str, ...]]:
        await self._authorize(caller, info, project, "patch", Role.ADMIN if subresource else Role.EDITOR)
        self._refuse_read_only(caller, info, "patch")
        try:
            patch = orjson.loads(patch_body)
        except orjson.JSONDecodeError as e:
            raise NodusError("BadRequest", f"the patch is not valid JSON: {e}") from None
        for _ in range(_MAX_PATCH_RETRIES):
            old_rec = await self.store.get(_key(info, project, name))
            old = _decode(old_rec)
            if old is None or old_rec is None:
                raise self._not_found(info, name)
            base = copy_json(old)
            if not subresource:
                await self._strategy(info).readable(project, name, old, base)
            if patch_type == "merge":
                if not isinstance(patch, dict):
                    raise NodusError("BadRequest", "a merge patch must be a JSON object")
                new = merge_patch(base, patch)
                patch_meta = patch.get("metadata")
                if patch_meta is not None and not isinstance(patch_meta, dict):
                    raise NodusError("BadRequest", "metadata in the patch must be an object",
                                     fix='send {"metadata": {...}} or leave metadata out')
                precondition = _parse_rv((patch_meta or {}).get("resourceVersion"), "metadata.resourceVersion")
            elif patch_type == "json":
                if not isinstance(patch, list):
                    raise NodusError("BadRequest", "a JSON patch must be an array of operations",
                                     fix='send [{"op": "replace", "path": "/spec/...", "value": ...}]')
                try:
                    new = jsonpatch.apply_patch(base, patch)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as e:
                    raise NodusError("BadRequest", f"the JSON patch cannot be applied: {e}",
                                     fix="check each operation's path against the current object") from None
                precondition = None
            else:
                raise NodusError("UnsupportedMediaType", f"patch type {patch_type!r} is not supported")
            if precondition is not None and precondition != old_rec.revision:
                raise self._conflict(info, name)
            if not isinstance(new, dict):
                raise NodusError("BadRequest", "the patched document is not an object")
            new.setdefault("metadata", {})
            if isinstance(new["metadata"], dict):
                new["metadata"]["resourceVersion"] = str(old_rec.revision)
            try:
                return await self._write_update(caller, info, project, old, new, old_rec.revision, subresource,
                                                dry_run, field_validation)
            except NodusError as e:
                if e.reason == "Conflict" and precondition is None:
                    continue  # someone wrote in between: apply the patch to the new state
                raise
        raise self._conflict(info, name)

    def _conflict(self, info: KindInfo, name: str) -> NodusError:
        return NodusError("Conflict", f'Operation cannot be fulfilled on {info.resource} "{name}": '
                          "the object has been modified; please apply your changes to the latest version "
                          "and try again", name=name, kind=info.plural, group=info.group)

    async def _write_update(self, caller: Caller, info: KindInfo, project: str, old: dict[str, Any],
                            new: dict[str, Any], expected: int, subresource: str, dry_run: bool,
                            field_validation: str) -> tuple[dict[str, Any], tuple[str, ...]]:
        name = old["metadata"]["name"]
        new = check_body(info, project, new)
        warnings: tuple[str, ...] = ()
        values: dict[str, str] | None = None
        if subresource == "status":
            admitted = admit_status(info, new, field_validation=field_validation)
            result = copy_json(old)
            result["status"] = admitted.object.get("status", {})
            warnings = admitted.warnings
        elif subresource:
            raise NodusError("NotFound", f'the server could not find the requested resource ({info.plural}/{subresource})')
        else:
            new.pop("status", None)
            old_for_admission = copy_json(old)
            admitted = await admit_update(info, old_for_admission, new, self._lookup, project=project,
                                          field_validation=field_validation, limits=self.limits)
            result = admitted.object
            warnings = admitted.warnings
            meta = result.setdefault("metadata", {})
            for system in ("uid", "creationTimestamp", "generation", "namespace", "deletionTimestamp",
                           "deletionGracePeriodSeconds"):
                if system in old["metadata"]:
                    meta[system] = old["metadata"][system]
                else:
                    meta.pop(system, None)
            meta["name"] = name
            meta.pop("managedFields", None), meta.pop("selfLink", None)
            if "status" in old:
                result["status"] = old["status"]
            else:
                result.pop("status", None)
            values = await self._strategy(info).on_update(project, name, old, result, self._now())
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if result == old:
            return old, warnings  # nothing changed: same object, same resourceVersion
        if dry_run:
            return result, warnings
        key = _key(info, project, name)
        meta = result["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            rec = await self.store.delete(key, expected)
            deleted = _decode(rec)
            assert deleted is not None
            return deleted, warnings
        if values is not None:
            await self._strategy(info).keep(project, name, result, values)
        try:
            rec = await self.store.update(key, _encode(result), expected)
        except NodusError as e:
            if e.reason == "Conflict":
                raise self._conflict(info, name) from None
            if e.reason == "NotFound":
                raise self._not_found(info, name) from None
            raise
        return _decode(rec), warnings  # type: ignore[return-value]

    async def delete(self, caller: Caller, info: KindInfo, project: str, name: str, *,
                     dry_run: bool = False, precondition: str = "") -> dict[str, Any]:
        await self._authorize(caller, info, project, "delete", Role.EDITOR)
        self._refuse_read_only(caller, info, "delete")
        key = _key(info, project, name)
        expected = _parse_rv(precondition)
        # Without a precondition a delete retries when a concurrent write (a controller's status
        # update, say) moved the object between our read and our delete: the caller asked for the
        # object gone, not for this exact version gone.
        for _ in range(_MAX_PATCH_RETRIES):
            rec = await self.store.get(key)
            obj = _decode(rec)
            if obj is None or rec is None:
                raise self._not_found(info, name)
            if expected is not None and expected != rec.revision:
                raise self._conflict(info, name)
            if dry_run:
                return obj
            try:
                if obj["metadata"].get("finalizers"):
                    if obj["metadata"].get("deletionTimestamp"):
                        return obj
                    obj["metadata"]["deletionTimestamp"] = self._now()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    return _decode(await self.store.update(key, _encode(obj), rec.revision))  # type: ignore[return-value]
                deleted = _decode(await self.store.delete(key, rec.revision))
            except NodusError as e:
                if e.reason == "Conflict":
                    if expected is None:
                        continue
                    raise self._conflict(info, name) from None
                if e.reason == "NotFound":
                    raise self._not_found(info, name) from None
                raise
            await self._strategy(info).on_delete(project, name)
            return deleted  # type: ignore[return-value]
        raise self._conflict(info, name)

    # -- the Job controller's writes (controllers/job_controller.py JobWriter) -------------------------
    async def write_job_status(self, project: str, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """A controller's status write of a Job it holds as stored (compare-and-swap, status_write.py)."""
        return await write_status(self.store, _JOBS, project, job, status, self._conflict, self._not_found)

    async def delete_job(self, project: str, name: str) -> None:
        await self.delete(SYSTEM, resolve("jobs"), project, name)
