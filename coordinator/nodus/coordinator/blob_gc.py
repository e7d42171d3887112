"""Blob and log garbage collection: nothing the coordinator stores grows forever (issue 16 item 5, ADR 0047).

Deleting a Job (by hand, or once its `ttlSecondsAfterFinished` has passed) deletes its Attempts; this
pass then deletes what only they named: their outputs' blobs and their logs. So are volume revisions,
sources and checkpoints whose records are gone (checkpoint retention deletes those it releases
itself; this catches the rest).

Mark and sweep, level-triggered, on a timer (`--blob-gc-interval`):

1. mark: every stored record (all prefixes, one paged pass over the store) is searched for blob
   digests — any 64-hex-digit string, as a `sha256:`, a `blob://sha256/` URI or a bare `sha256`
   field — and every Attempt's wire id is a live log. A stray match can only keep a blob longer,
   never delete one, and no schema has to list where digests live;
2. `decide_gc` (pure) compares the blobs and logs the blob store holds with the marks: one that is
   unmarked becomes a candidate, stamped with the time it was first seen unmarked; one whose stamp is
   older than the grace (`--blob-gc-grace`, default 1 h) is deleted; a candidate that is marked again
   (its upload has just been referenced) is dropped;
3. the candidates are stored (`_gc/state`) before anything is deleted, so a coordinator that stops
   anywhere in a pass, `kill -9` included, resumes with the same stamps and never deletes early.

The grace is what makes uploads safe: an agent or a push stores a blob before the write that names it
(OutputCommit, a volume revision), so a blob in flight is unmarked for as long as that takes, far
less than the grace. A Job's storage (`status.storage`) counts its logs too (`status.logBytes` of each
Attempt, recorded by this pass while the log grows and once it ends).
"""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from .blobs.base import Blobs
from .clock import Clock
from .controllers.attempt_machine import phase_of
from .controllers.cache import ATTEMPTS, Cache
from .controllers.objects import Objects
from .errors import NodusError
from .store.base import Store

log = logging.getLogger("nodus.blob_gc")

GC_KEY = "_gc/state"
"""The candidates and their first-seen-unreferenced times (one stored record)."""
DEFAULT_INTERVAL = 600.0
DEFAULT_GRACE = 3600.0
PAGE = 500
_DIGEST = re.compile(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


@dataclass(frozen=True, slots=True)
class GcSettings:
    interval: float = DEFAULT_INTERVAL
    """Seconds between passes."""
    grace: float = DEFAULT_GRACE
    """How long a blob or log stays unreferenced before it is deleted."""


@dataclass(frozen=True, slots=True)
class GcDecision:
    delete_blobs: tuple[str, ...]
    delete_logs: tuple[str, ...]
    state: dict[str, dict[str, float]] = field(default_factory=dict)
    """The new `_gc/state`: {"blobs": {digest: since}, "logs": {attempt id: since}} without the deleted."""


def digests_in(value: bytes) -> set[str]:
    """Every blob digest a stored record names (any 64-hex-digit run)."""
    return {m.decode() for m in _DIGEST.findall(value)}


def _sweep(stored: set[str], marked: set[str], since: Mapping[str, float], now: float,
           grace: float) -> tuple[list[str], dict[str, float]]:
    doomed, kept = [], {}
    for name in sorted(stored - marked):
        first = float(since.get(name, now))
        if now - first >= grace:
            doomed.append(name)
        else:
            kept[name] = first
    return doomed, kept


def decide_gc(blobs: set[str], referenced: set[str], logs: set[str], live_logs: set[str],
              state: Mapping[str, Mapping[str, float]], now: float, grace: float) -> GcDecision:
    """What one pass deletes, and the candidates it keeps (pure)."""
    doomed_blobs, blob_since = _sweep(blobs, referenced, state.get("blobs") or {}, now, grace)
    doomed_logs, log_since = _sweep(logs, live_logs, state.get("logs") or {}, now, grace)
    return GcDecision(tuple(doomed_blobs), tuple(doomed_logs), {"blobs": blob_since, "logs": log_since})


class BlobGc:
    def __init__(self, store: Store, cache: Cache, objects: Objects, blobs: Blobs, clock: Clock,
                 settings: GcSettings = GcSettings()) -> None:
        self.store, self.cache, self.objects = store, cache, objects
        self.blobs, self.logs, self.clock, self.settings = blobs, blobs.logs, clock, settings

    async def run(self) -> None:
        await self.cache.synced.wait()
        while True:
            try:
                await self.collect()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next pass retries; nothing was deleted unmarked
                log.exception("blob garbage collection failed")
            await asyncio.sleep(self.settings.interval)

    async def mark(self) -> tuple[set[str], set[str]]:
        """(digests some record names, attempt ids that have an Attempt), over every stored record."""
        referenced: set[str] = set()
        attempts: set[str] = set()
        start: str | None = None
        revision: int | None = None
        while True:
            page = await self.store.list("", limit=PAGE, start_after=start, revision=revision)
            revision = page.revision
            for rec in page.records:
                if rec.key == GC_KEY:
                    continue
                referenced |= digests_in(rec.value)
                if rec.key.startswith(ATTEMPTS):
                    attempt_id = (orjson.loads(rec.value).get("spec") or {}).get("id")
                    if attempt_id:
                        attempts.add(str(attempt_id))
            if not page.more:
                return referenced, attempts
            start = page.records[-1].key

    async def _state(self) -> tuple[dict[str, Any], int | None]:
        rec = await self.store.get(GC_KEY)
        return (orjson.loads(rec.value), rec.revision) if rec is not None else ({}, None)

    async def _save(self, state: dict[str, Any], revision: int | None) -> None:
        value = orjson.dumps(state)
        if revision is None:
            await self.store.create(GC_KEY, value)
        else:
            await self.store.update(GC_KEY, value, revision)

    async def collect(self) -> GcDecision:
        """One pass: mark, decide, store the candidates, then delete what is past its grace."""
        stored_blobs = {b.sha256 for b in await self.blobs.list_blobs()}
        stored_logs = set(await self.logs.list())
        referenced, live = await self.mark()  # after the listings: a blob stored meanwhile is only seen next pass
        state, revision = await self._state()
        decision = decide_gc(stored_blobs, referenced, stored_logs, live, state, self.clock.now(),
                             self.settings.grace)
        try:
            await self._save(decision.state, revision)
        except NodusError as e:
            if e.reason in ("Conflict", "AlreadyExists"):
                log.warning("another pass wrote %s meanwhile; this one deletes nothing", GC_KEY)
                return GcDecision((), (), decision.state)
            raise
        for digest in decision.delete_blobs:
            await self.blobs.delete(digest)
        for attempt_id in decision.delete_logs:
            await self.logs.delete(attempt_id)
        if decision.delete_blobs or decision.delete_logs:
            log.info("deleted %d unreferenced blob(s) and %d log(s) of deleted attempts",
                     len(decision.delete_blobs), len(decision.delete_logs))
        await self.account_logs(stored_logs)
        return decision

    async def account_logs(self, stored_logs: set[str]) -> None:
        """Records each Attempt's log size (`status.logBytes`) where it changed: every pass while the
        attempt lives, and once more after it ended, so its Job's status.storage counts the log."""
        for key, attempt in self.cache.under(ATTEMPTS):
            attempt_id = (attempt.get("spec") or {}).get("id")
            status = attempt.get("status") or {}
            if not attempt_id or attempt_id not in stored_logs:
                continue
            if phase_of(attempt).terminal and status.get("logFinal"):
                continue
            state = await self.logs.state(attempt_id)
            recorded = int(status.get("logBytes") or 0)
            # Final once the attempt ended and its log is closed, or stopped growing (a lost node never closes it).
            final = phase_of(attempt).terminal and (state.eof or (recorded == state.size and "logBytes" in status))
            if recorded == state.size and "logBytes" in status and not final:
                continue

            def mutate(obj: dict[str, Any], size: int = state.size, final: bool = final) -> dict[str, Any] | None:
                st = obj.setdefault("status", {})
                st["logBytes"] = size
                if final:
                    st["logFinal"] = True
                return obj
            await self.objects.mutate(key, mutate)
