"""A watch-fed copy of what the controllers read: Jobs, Attempts, nodes and their leases, price books,
Sweeps.

The store stays the only shared memory: this cache is derived from it (a list, then a watch from the
list's revision), rebuilt on every start, and never written to except with the result of a write
that the store has just made durable (`apply`, so that a controller reads its own writes before the
watch delivers them). Revisions order everything: an event older than what the cache holds for a
key is dropped, and a deleted key keeps a tombstone (its delete revision) so that an older value never comes back.

Indexes answer the controllers' questions without scans: the attempts of a Job, the attempts on a
node, an attempt by its wire id. `job_view` and `attempt_views_of` decode each stored revision into
its typed view (views.py) once: a key's revision names one value, so the view is kept until it moves.
Listeners are plain callbacks on the event loop (key, old, new); they only mark work, they never await.
"""
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import orjson

from ..errors import NodusError
from ..store.base import EventType, Record, Store
from .attempt_machine import phase_of
from .views import AttemptView, JobView
from ..stopping import cancel_and_wait

log = logging.getLogger("nodus.cache")

JOBS, ATTEMPTS, NODES, LEASES, BOOKS, SWEEPS = "jobs/", "attempts/", "_nodes/", "_leases/", "_pricebooks/", "sweeps/"
PREFIXES = (JOBS, ATTEMPTS, NODES, LEASES, BOOKS, SWEEPS)
_MAX_TOMBSTONES = 20_000
Listener = Callable[[str, "dict[str, Any] | None", "dict[str, Any] | None"], None]


def decode(key: str, value: bytes, revision: int) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(value)
    if isinstance(obj.get("metadata"), dict):
        obj["metadata"]["resourceVersion"] = str(revision)
    return obj


def job_key(project: str, name: str) -> str:
    return f"{JOBS}{project}/{name}"


def attempt_key(project: str, name: str) -> str:
    return f"{ATTEMPTS}{project}/{name}"


def _top(key: str) -> str:
    """The top prefix of a key ("jobs/" of "jobs/p/name")."""
    return key[:key.find("/") + 1]


def owner_of(attempt: dict[str, Any]) -> tuple[str, str]:
    """(project, job name) of an Attempt."""
    return attempt["metadata"].get("namespace", ""), (attempt.get("spec") or {}).get("job", "")


def _index_of(attempt: dict[str, Any]) -> tuple[str, str, int]:
    """(project, job name, index) of an Attempt."""
    project, job = owner_of(attempt)
    return project, job, int((attempt.get("spec") or {}).get("index", 0))


class Cache:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._objects: dict[str, dict[str, Any]] = {}
        self._kinds: dict[str, dict[str, dict[str, Any]]] = {prefix: {} for prefix in PREFIXES}
        """The same objects by top prefix, so that a read of one kind (the nodes) never walks the others."""
        self._revisions: dict[str, int] = {}
        self._tombstones: dict[str, int] = {}
        self._by_job: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._by_index: dict[tuple[str, str, int], set[str]] = {}
        """(project, job name, index) → its attempts' keys: an index's lineage (its checkpoints, its restore) is
        read per assignment and per cadence tick, and a walk over every attempt of the Job there made a Job of n
        indexes cost O(n²) (ADR 0109)."""
        self._job_order: dict[tuple[str, str], list[str]] = {}
        """A Job's attempt keys sorted, kept until one is added or removed: its reconcile reads them on every change
        of one of them, and a sort per read made a Job of n indexes O(n² log n) (ADR 0109)."""
        self._by_node: dict[str, set[str]] = defaultdict(set)
        self._live_by_node: dict[str, set[str]] = defaultdict(set)
        """The node's attempts whose phase has not ended: what its stream and cadence look at (a node's
        finished attempts only grow)."""
        self._by_id: dict[str, str] = {}
        self._job_views: dict[str, tuple[int, JobView]] = {}
        self._attempt_views: dict[str, tuple[int, AttemptView]] = {}
        """Per key: (the revision it was decoded at, its view)."""
        self._listeners: dict[str, list[Listener]] = defaultdict(list)
        self._tasks: list[asyncio.Task[None]] = []
        self.synced = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        for prefix in PREFIXES:
            revision = await self._load(prefix)
            self._tasks.append(asyncio.create_task(self._follow(prefix, revision), name=f"cache:{prefix}"))
        self.synced.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)

    async def _load(self, prefix: str) -> int:
        result = await self.store.list(prefix)
        for rec in result.records:
            self.apply(rec.key, decode(rec.key, rec.value, rec.revision), rec.revision)
        return result.revision

    async def _follow(self, prefix: str, revision: int) -> None:
        while True:
            try:
                async for ev in self.store.watch(prefix, revision):
                    revision = ev.revision
                    if self.holds(ev.key, ev.revision):
                        continue  # a controller's own write, applied when it was acknowledged: no decode
                    # This task may have been woken by an earlier commit and read this one's events before
                    # the writers it resumed ran (on bench/sweep.py most cell creates and a third of the
                    # Job status writes): they run first, and a write they apply is not decoded again.
                    await asyncio.sleep(0)
                    if self.holds(ev.key, ev.revision):
                        continue
                    if ev.type is EventType.DELETE:
                        self.apply(ev.key, None, ev.revision)
                    else:
                        self.apply(ev.key, decode(ev.key, ev.value, ev.revision), ev.revision)
                return  # the store closed
            except asyncio.CancelledError:
                raise
            except NodusError as e:
                if e.reason != "Expired":
                    raise
                log.warning("cache %s fell behind compaction; listing again", prefix)
                revision = await self._relist(prefix)

    async def _relist(self, prefix: str) -> int:
        result = await self.store.list(prefix)
        present = {rec.key for rec in result.records}
        for key in [k for k in self._objects if k.startswith(prefix) and k not in present]:
            self.apply(key, None, result.revision)
        for rec in result.records:
            self.apply(rec.key, decode(rec.key, rec.value, rec.revision), rec.revision)
        return result.revision

    # -- updates ----------------------------------------------------------------------------------
    def listen(self, prefix: str, listener: Listener) -> None:
        self._listeners[prefix].append(listener)

    def holds(self, key: str, revision: int) -> bool:
        """Whether the cache has `key` at `revision` or later (or deleted at or after it)."""
        known = self._revisions.get(key, self._tombstones.get(key))
        return known is not None and revision <= known

    def apply(self, key: str, obj: dict[str, Any] | None, revision: int) -> bool:
        """Takes a value the store holds at `revision` (None: deleted); False if it is older than ours."""
        known = self._revisions.get(key, self._tombstones.get(key))
        if known is not None and revision <= known:
            return False
        old = self._objects.get(key)
        kind = self._kinds.get(_top(key))
        if obj is None:
            self._objects.pop(key, None)
            if kind is not None:
                kind.pop(key, None)
            self._revisions.pop(key, None)
            self._job_views.pop(key, None)
            self._attempt_views.pop(key, None)
            self._tombstones[key] = revision
            if len(self._tombstones) > _MAX_TOMBSTONES:
                # Writes that old are long settled: forget the oldest half.
                keep = sorted(self._tombstones.items(), key=lambda kv: kv[1])[_MAX_TOMBSTONES // 2:]
                self._tombstones = dict(keep)
            if old is None:
                return False
        else:
            self._objects[key] = obj
            if kind is not None:
                kind[key] = obj
            self._revisions[key] = revision
            self._tombstones.pop(key, None)
        if key.startswith(ATTEMPTS):
            self._index_attempt(key, old, obj)
        for prefix, listeners in self._listeners.items():
            if key.startswith(prefix):
                for listener in listeners:
                    try:
                        listener(key, old, obj)
                    except Exception:  # noqa: BLE001 - one bad listener must not stop the cache
                        log.exception("cache listener failed for %s", key)
        return True

    def apply_written(self, records: Sequence[Record], documents: Iterable[dict[str, Any]]) -> None:
        """Takes what one commit wrote, in its order: each record's document as the caller built it (the bytes the
        record holds encode it), its resourceVersion set, rather than decoding the bytes back into the same object
        (ADR 0114). The documents are the cache's from here, read-only to the caller."""
        for rec, obj in zip(records, documents):
            obj["metadata"]["resourceVersion"] = str(rec.revision)
            self.apply(rec.key, obj, rec.revision)

    def _index_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old is None or new is None or owner_of(old) != owner_of(new):
            for obj in (old, new):
                if obj is not None:
                    self._job_order.pop(owner_of(obj), None)
        if old is not None:
            self._by_job[owner_of(old)].discard(key)
            lineage = _index_of(old)
            same = self._by_index.get(lineage)
            if same is not None:
                same.discard(key)
                if not same:
                    del self._by_index[lineage]
            node = (old.get("spec") or {}).get("node")
            if node:
                self._by_node[node].discard(key)
                live = self._live_by_node.get(node)
                if live is not None:
                    live.discard(key)
                    if not live:
                        del self._live_by_node[node]
            self._by_id.pop((old.get("spec") or {}).get("id", ""), None)
        if new is not None:
            self._by_job[owner_of(new)].add(key)
            self._by_index.setdefault(_index_of(new), set()).add(key)
            spec = new.get("spec") or {}
            if spec.get("node"):
                self._by_node[spec["node"]].add(key)
                if not phase_of(new).terminal:
                    self._live_by_node[spec["node"]].add(key)
            if spec.get("id"):
                self._by_id[spec["id"]] = key

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        return self._objects.get(key)

    def revision(self, key: str) -> int | None:
        return self._revisions.get(key)

    def under(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        kind = self._kinds.get(_top(prefix))
        if kind is None:
            return [(k, v) for k, v in self._objects.items() if k.startswith(prefix)]
        if prefix in self._kinds:
            return list(kind.items())
        return [(k, v) for k, v in kind.items() if k.startswith(prefix)]

    def job(self, project: str, name: str) -> dict[str, Any] | None:
        return self._objects.get(job_key(project, name))

    def attempts_of(self, project: str, job: str) -> list[dict[str, Any]]:
        objects = self._objects
        return [objects[k] for k in self._ordered(project, job) if k in objects]

    def attempts_of_index(self, project: str, job: str, index: int) -> list[dict[str, Any]]:
        """The attempts of one index of the Job (of every Job of that name: callers still match the jobUID), as
        `attempts_of` orders them."""
        return self._values(self._by_index.get((project, job, index), ()))

    def attempts_on(self, node: str) -> list[dict[str, Any]]:
        return self._values(self._by_node.get(node, ()))

    def live_attempts_on(self, node: str) -> list[dict[str, Any]]:
        """The node's attempts whose phase has not ended, as `attempts_on` orders them."""
        return self._values(self._live_by_node.get(node, ()))

    def attempt_by_id(self, attempt_id: str) -> dict[str, Any] | None:
        key = self._by_id.get(attempt_id)
        return self._objects.get(key) if key else None

    def job_view(self, project: str, name: str) -> JobView | None:
        key = job_key(project, name)
        obj = self._objects.get(key)
        if obj is None:
            return None
        revision = self._revisions[key]
        hit = self._job_views.get(key)
        if hit is None or hit[0] != revision:
            hit = self._job_views[key] = (revision, JobView.from_object(obj))
        return hit[1]

    def attempt_view(self, key: str) -> AttemptView | None:
        obj = self._objects.get(key)
        if obj is None:
            return None
        revision = self._revisions[key]
        hit = self._attempt_views.get(key)
        if hit is None or hit[0] != revision:
            hit = self._attempt_views[key] = (revision, AttemptView.from_object(obj))
        return hit[1]

    def attempt_views_of(self, project: str, job: str) -> list[AttemptView]:
        """The Job's attempts as views, in the order of `attempts_of`."""
        views, revisions = self._attempt_views, self._revisions
        out = []
        for k in self._ordered(project, job):
            hit = views.get(k)  # the view of the revision held, inline: this runs per change of a Job's attempt
            if hit is not None and hit[0] == revisions.get(k):
                out.append(hit[1])
            elif (view := self.attempt_view(k)) is not None:
                out.append(view)
        return out

    def _ordered(self, project: str, job: str) -> list[str]:
        order = self._job_order.get((project, job))
        if order is None:
            order = sorted(self._by_job.get((project, job), ()))
            if order:  # a Job with none (gone, or not started) is not remembered
                self._job_order[(project, job)] = order
        return order

    def attempt_revisions(self, project: str, job: str) -> dict[str, int]:
        """Each of the Job's attempts' key → the revision held (no view built): what a decision reads of them."""
        return {k: self._revisions[k] for k in self._by_job.get((project, job), ()) if k in self._revisions}

    def job_revisions(self, key: str) -> tuple[int | None, dict[str, int]]:
        """The revision held of the Job at `key` (a jobs/ key) and `attempt_revisions` of it: what a controller
        compares to skip a Job whose inputs did not change (ADR 0086)."""
        project, _, name = key[len(JOBS):].partition("/")
        return self._revisions.get(key), self.attempt_revisions(project, name)

    def attempt_owners(self) -> list[tuple[str, str]]:
        """(project, job name) of every Job that has an attempt in the cache (the Job itself may be gone)."""
        return [owner for owner, keys in self._by_job.items() if keys]

    def attempts(self) -> list[dict[str, Any]]:
        return list(self._kinds[ATTEMPTS].values())

    def _values(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        return [self._objects[k] for k in sorted(keys) if k in self._objects]
