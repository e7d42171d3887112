"""Compare-and-swap writes of what only the coordinator writes: Attempts, node records and leases.

Why not through the resource service: an Attempt's binding changes its spec (node, GPUs) and its
status (Provisioning) at once, and the resource service writes spec and status separately (as the
Kubernetes API does), which would double every write on the path from create to Running. Attempts
are read-only to everyone else (the resource service refuses their writes), so the controllers
write them whole, here, under the same keys and encoding the resource service reads. Jobs are not
written here: their status goes through the resource service (its shape is checked there).

Every write is guarded by the revision it was computed from; on a conflict the mutation runs again
on the fresh value, so concurrent writers (an agent report and a stop request, say) never lose each
other's changes. Each durable result goes into the cache at once (read-your-writes).
"""
from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable

import orjson

from ..api.jsondoc import copy_json
from ..errors import NodusError
from ..store.base import Store
from .cache import Cache, decode

Mutation = Callable[[dict[str, Any]], "dict[str, Any] | None"]
"""Gets a private copy of the current value; returns the new value, or None to write nothing."""
_RETRIES = 32
BeforeDelete = Callable[[str, dict[str, Any]], Awaitable[None]]
"""(key, current value) → awaited before that value is deleted, so what it must outlive is stored first."""


def encode(obj: dict[str, Any]) -> bytes:
    if isinstance(obj.get("metadata"), dict) and "resourceVersion" in obj["metadata"]:
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
    return orjson.dumps(obj)


class Objects:
    def __init__(self, store: Store, cache: Cache) -> None:
        self.store = store
        self.cache = cache
        self._before_delete: list[tuple[str, BeforeDelete]] = []

    def before_delete(self, prefix: str, hook: BeforeDelete) -> None:
        """Runs `hook` before every delete under `prefix` (again on a retried one: it must be idempotent)."""
        self._before_delete.append((prefix, hook))

    async def read(self, key: str) -> tuple[dict[str, Any], int] | None:
        """The current value from the store (not the cache) and its revision."""
        rec = await self.store.get(key)
        return None if rec is None else (decode(key, rec.value, rec.revision), rec.revision)

    async def create(self, key: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Creates `key`; None if it exists already (a retried create is not an error)."""
        try:
            rec = await self.store.create(key, encode(obj))
        except NodusError as e:
            if e.reason == "AlreadyExists":
                return None
            raise
        stored = decode(key, rec.value, rec.revision)
        self.cache.apply(key, stored, rec.revision)
        return stored

    async def mutate(self, key: str, mutation: Mutation) -> dict[str, Any] | None:
        """Applies `mutation` to the current value until the write wins; None if missing or unchanged.

        The first try starts from the cache (usually current, and a read saved); a conflict
        re-reads the store."""
        cached = self.cache.get(key)
        revision = self.cache.revision(key)
        # The cache's value is only read here (the mutation gets its own copy), so one copy per try.
        current = (cached, revision) if cached is not None and revision is not None else None
        for _ in range(_RETRIES):
            if current is None:
                current = await self.read(key)
                if current is None:
                    return None
            value, revision = current
            new = mutation(copy_json(value))
            if new is None or new == value:
                return None
            try:
                rec = await self.store.update(key, encode(new), revision)
            except NodusError as e:
                if e.reason in ("Conflict", "NotFound"):
                    current = None
                    continue
                raise
            stored = decode(key, rec.value, rec.revision)
            self.cache.apply(key, stored, rec.revision)
            return stored
        raise NodusError("Conflict", f"{key} kept changing under {_RETRIES} tries", fix="retry")

    async def upsert(self, key: str, mutation: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Creates or updates `key` from its current value (None when absent).

        As `mutate`, the first try starts from the cache when it holds the key (a node's lease, written by
        its heartbeats: a store read saved each time, ADR 0091); the write is a compare-and-swap on that
        revision, so a stale copy only costs a retry from the store."""
        cached, revision = self.cache.get(key), self.cache.revision(key)
        first = (cached, revision) if cached is not None and revision is not None else None
        for _ in range(_RETRIES):
            current = first if first is not None else await self.read(key)
            first = None
            new = mutation(copy_json(current[0]) if current else None)
            try:
                if current is None:
                    rec = await self.store.create(key, encode(new))
                else:
                    rec = await self.store.update(key, encode(new), current[1])
            except NodusError as e:
                if e.reason in ("Conflict", "AlreadyExists", "NotFound"):
                    continue
                raise
            stored = decode(key, rec.value, rec.revision)
            self.cache.apply(key, stored, rec.revision)
            return stored
        raise NodusError("Conflict", f"{key} kept changing under {_RETRIES} tries", fix="retry")

    async def delete(self, key: str, check: Callable[[dict[str, Any]], bool] = lambda _: True) -> bool:
        """Deletes `key` if `check` holds for its current value (checked and deleted atomically)."""
        for _ in range(_RETRIES):
            current = await self.read(key)
            if current is None or not check(current[0]):
                return False
            for prefix, hook in self._before_delete:
                if key.startswith(prefix):
                    await hook(key, current[0])
            try:
                rec = await self.store.delete(key, current[1])
            except NodusError as e:
                if e.reason == "Conflict":
                    continue
                if e.reason == "NotFound":
                    return False
                raise
            self.cache.apply(key, None, rec.revision)
            return True
        return False


def new_uid() -> str:
    return str(uuid.uuid4())
