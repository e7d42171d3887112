"""Retention: deleting the checkpoints whose time is up, in the blob store and in customers' buckets."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from typing import Any, Callable, Protocol, Sequence

import orjson

from ..clock import Clock
from ..controllers import checkpoints as rules
from ..controllers.cache import ATTEMPTS, JOBS, Cache, attempt_key
from ..controllers.objects import Objects
from ..errors import NodusError
from ..vault import Vault
from .locations import Read, connection_fields, reader

log = logging.getLogger("nodus.checkpoints")

RETENTION_TICK = 60.0
"""How often the retention sweep looks for checkpoints whose time is up (retainAfterFinish is hours)."""


class Blobs(Protocol):
    """What the sweep needs of the embedded blob store (blobs.BlobStore)."""

    async def delete(self, sha256: str) -> bool: ...

FORGOTTEN = "_retention/"
"""Archives of Attempts deleted with their records (their Job was deleted): one stored record per
Attempt uid, written before the Attempt's delete and dropped once the sweep deleted them, so a
coordinator that stops in between deletes them after its restart."""


def _archives(attempt: dict[str, Any]) -> tuple[set[str], set[rules.S3Archive]]:
    """The blob digests and the S3 stores an Attempt's records name (committed and superseded)."""
    status = attempt.get("status") or {}
    project = attempt["metadata"].get("namespace", "")
    digests: set[str] = set()
    s3: set[rules.S3Archive] = set()
    for c in [*(status.get("checkpoints") or []), *(status.get(rules.SUPERSEDED) or [])]:
        if rules.in_s3(c):
            s3.add(rules.s3_archive(project, c, whole=True))
        elif c.get("sha256"):
            digests.add(str(c["sha256"]))
    return digests, s3


def _s3_order(archive: rules.S3Archive) -> tuple[str, int, str, str]:
    return archive.prefix, archive.seq, archive.project, archive.connection


def delete_s3(archive: rules.S3Archive, fields: dict[str, str]) -> None:
    """Blocking: deletes one checkpoint of an attempt's S3 store, or the whole store (seq 0). A
    checkpoint already gone counts as deleted."""
    from nodus.checkpoint.errors import NotFound
    from nodus.checkpoint.stores.s3 import S3Store  # boto3 is imported only for S3

    store = S3Store.at(archive.prefix, fields)
    if not archive.seq:
        store.purge()
        return
    try:
        store.delete(archive.seq)
    except NotFound:
        pass


class Retention:
    """Deletes the checkpoints of finished Jobs once `recovery.checkpoint.retainAfterFinish` has passed
    since completionTime, or `ttlSecondsAfterFinished` when that comes first, and of Jobs that are gone;
    and, while a Job runs, the checkpoints its Attempts' newer ones superseded.

    Level-triggered: each sweep reads the Jobs and Attempts as they are (controllers/checkpoints.py
    `release` decides) and first deletes the archives, then the records on the Attempts, so a crash
    between the two only repeats the first step (deleting a missing archive is a no-op). The Job
    controller derives status.checkpoint and status.storage from the same clock, and deletes a Job past
    its TTL once its records are gone. A Job deleted by hand takes its Attempts (and their records)
    with it at once; their archives are stored (FORGOTTEN) before each Attempt's delete and deleted
    by the next sweep, so a coordinator that stops in between deletes them after its restart.

    Checkpoints in a customer's bucket are deleted with the keys of the Connection they went to (read
    now, as at assignment). A deletion that may succeed later (the network, a throttle) keeps its
    record for the next sweep; one that cannot (the Connection or its Secret is gone, the keys are
    refused, the bucket is gone) is logged with the prefix left behind and its record dropped, since
    nothing Nodus holds could ever delete it.
    """

    def __init__(self, cache: Cache, objects: Objects, blobs: Blobs, clock: Clock, vault: Vault | None = None,
                 tick: float = RETENTION_TICK, delete: Callable[[rules.S3Archive, dict[str, str]], None] = delete_s3) -> None:
        self.cache, self.objects, self.blobs, self.clock, self.tick = cache, objects, blobs, clock, tick
        self.vault, self._delete = vault, delete
        objects.before_delete(ATTEMPTS, self._remember)

    async def _remember(self, key: str, attempt: dict[str, Any]) -> None:
        """Stores the archives of an Attempt about to be deleted (FORGOTTEN)."""
        digests, s3 = _archives(attempt)
        if digests or s3:
            await self._write_forgotten(FORGOTTEN + str(attempt["metadata"].get("uid") or key), digests, s3)

    async def _write_forgotten(self, key: str, digests: set[str], s3: set[rules.S3Archive]) -> None:
        """Writes (or, with nothing left, deletes) one FORGOTTEN record, whatever it held before."""
        if not digests and not s3:
            await self.objects.delete(key)
            return
        doc = {"digests": sorted(digests), "s3": [dataclasses.asdict(a) for a in sorted(s3, key=_s3_order)]}
        await self.objects.upsert(key, lambda _: doc)

    async def _forgotten(self) -> dict[str, tuple[set[str], set[rules.S3Archive]]]:
        """The FORGOTTEN records of Attempts that are gone (one still here may yet fail its delete)."""
        live = {str(a["metadata"].get("uid")) for a in self.cache.attempts()}
        out = {}
        for rec in (await self.objects.store.list(FORGOTTEN)).records:
            if rec.key[len(FORGOTTEN):] in live:
                continue
            doc = orjson.loads(rec.value)
            out[rec.key] = ({str(d) for d in doc.get("digests") or []},
                            {rules.S3Archive(**a) for a in doc.get("s3") or []})
        return out

    async def run(self) -> None:
        await self.cache.synced.wait()
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("checkpoint retention sweep failed; retrying in %.0fs", self.tick)
            await asyncio.sleep(self.tick)

    async def sweep(self) -> rules.Release:
        """One pass: deletes what is due now; returns what it found due."""
        jobs = [obj for _, obj in self.cache.under(JOBS)]
        due = rules.release(self.cache.job, self.cache.attempts(), jobs, self.clock.now())
        # Archives of deleted Attempts go unless something that is still here names them (then they
        # are not ours to delete). A failed blob delete raises before any record is dropped.
        records = await self._forgotten()
        remembered = {d for digests, _ in records.values() for d in digests}
        forgotten = rules.unnamed(remembered, [*map(rules.unlisted, self.cache.attempts()), *jobs])
        for digest in sorted(set(due.digests) | forgotten):
            await self.blobs.delete(digest)
        forgotten_s3 = {a for _, s3 in records.values() for a in s3}
        retry = await self._delete_s3(sorted({*due.s3, *forgotten_s3}, key=lambda x: (x.prefix, x.seq)))
        for key, (_, s3) in records.items():
            await self._write_forgotten(key, set(), s3 & retry)  # only S3 deletions to try again stay
        for project, name in due.attempts:
            await self.objects.mutate(attempt_key(project, name),
                                      lambda obj: _with_status(obj, rules.without_checkpoints, retry))
        for project, name, upto in due.trimmed:
            trim = functools.partial(rules.without_superseded, upto=upto)
            await self.objects.mutate(attempt_key(project, name),
                                      functools.partial(_with_status, change=trim, keep=retry))
        if due.attempts or due.trimmed or forgotten or forgotten_s3:
            log.info("retention: deleted %d checkpoint archives (%d bytes) and %d in buckets, of %d attempts",
                     len(due.digests) + len(forgotten), due.bytes, len(due.s3) + len(forgotten_s3) - len(retry),
                     len(due.attempts) + len(due.trimmed))
        return due

    async def _delete_s3(self, archives: Sequence[rules.S3Archive]) -> set[rules.S3Archive]:
        """Deletes checkpoints in customers' buckets; returns those to try again at the next sweep."""
        retry: set[rules.S3Archive] = set()
        keys: dict[tuple[str, str], dict[str, str] | str] = {}
        read = reader(self.objects)
        for archive in archives:
            where = (archive.project, archive.connection)
            if where not in keys:
                keys[where] = await self._keys(read, archive)
            fields = keys[where]
            what = f"checkpoint {archive.seq} in {archive.prefix}" if archive.seq else f"the checkpoints in {archive.prefix}"
            if isinstance(fields, str):
                log.warning("retention: %s cannot be deleted and stays in the bucket: %s", what, fields)
                continue
            try:
                await asyncio.to_thread(self._delete, archive, fields)
            except Exception as e:  # noqa: BLE001 - StoreError, botocore errors
                if getattr(e, "retryable", True):
                    log.warning("retention: deleting %s failed, the next sweep tries again: %s", what, e)
                    retry.add(archive)
                else:
                    log.warning("retention: %s cannot be deleted and stays in the bucket: %s", what, e)
        return retry

    async def _keys(self, read: Read, archive: rules.S3Archive) -> dict[str, str] | str:
        """The Connection's fields with its Secret's keys, or why there are none."""
        if not archive.connection:
            return "the record names no Connection"
        conn = await read("connections", archive.project, archive.connection)
        if conn is None:
            return f'Connection "{archive.connection}" no longer exists in project "{archive.project}"'
        if self.vault is None:
            return "this coordinator has no secret vault"
        try:
            return await connection_fields(read, self.vault, archive.project, archive.connection,
                                           (conn.get("spec") or {}).get("s3") or {})
        except NodusError as e:
            return e.message


def _with_status(obj: dict[str, Any], change: Callable[..., dict[str, Any] | None],
                 keep: set[rules.S3Archive]) -> dict[str, Any] | None:
    status = change(obj.get("status") or {}, keep)
    return None if status is None else {**obj, "status": status}
