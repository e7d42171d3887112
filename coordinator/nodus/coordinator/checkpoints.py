"""The coordinator's checkpoint store: commits from agents, fenced, and what an assignment restores.

Archives live in the embedded blob store (`blob://sha256/<hex>`: every node reads the same
checkpoints); the commit record (the manifest's fields: seq, time, size, sha256, paths, attempt,
epoch, format, pause, reason) is written on the Attempt that took it, in the same compare-and-swap
that checks the fence, so a commit from a superseded attempt or an older epoch can never become the
latest (controllers/checkpoints.py says what is refused). The Job controller derives
`status.checkpoint` and `status.storage` from there.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import logging
from typing import Any, Awaitable, Callable, Protocol, Sequence

from google.protobuf import duration_pb2

from nodus.v1 import agent_pb2

from .api.connection import SECRET_KEYS, SESSION_TOKEN
from .api.units import parse_quantity
from .clock import Clock, parse, rfc3339
from .controllers import checkpoints as rules
from .controllers.attempts import AttemptPhase, phase_of
from .controllers.cache import ATTEMPTS, JOBS, Cache, attempt_key
from .controllers.objects import Objects
from .errors import NodusError
from .vault import Vault

log = logging.getLogger("nodus.checkpoints")

REASONS = {agent_pb2.CHECKPOINT_REASON_PERIODIC: "Periodic", agent_pb2.CHECKPOINT_REASON_SUSPEND: "Suspend",
           agent_pb2.CHECKPOINT_REASON_PREEMPTION: "Preemption"}
FORMATS = {agent_pb2.CHECKPOINT_FORMAT_DCP: "Dcp"}
_INTEGRATIONS = {"Auto": agent_pb2.CHECKPOINT_INTEGRATION_AUTO, "None": agent_pb2.CHECKPOINT_INTEGRATION_NONE,
                 "HFTrainer": agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER}
BLOB_URI = "blob://sha256/"


def commit_of(c: agent_pb2.CheckpointCommit) -> rules.Commit:
    return rules.Commit(attempt_id=c.attempt_id, job_uid=c.job.uid, seq=int(c.seq), sha256=c.sha256.lower(),
                        size=int(c.size_bytes), uri=c.uri or BLOB_URI + c.sha256.lower(),
                        time=c.time.ToNanoseconds() / 1e9 if (c.time.seconds or c.time.nanos) else 0.0,
                        epoch=int(c.epoch), paths=tuple(c.paths), pause=c.pause.ToNanoseconds() / 1e9,
                        reason=REASONS.get(c.reason, ""), format=FORMATS.get(c.format, "Snapshot"))


async def commit(cache: Cache, objects: Objects, c: agent_pb2.CheckpointCommit, now: float) -> str | None:
    """Records a commit on its Attempt; returns why it was refused (None: committed)."""
    record = commit_of(c)
    if record.time <= 0:
        record = rules.Commit(**{**{f: getattr(record, f) for f in record.__dataclass_fields__}, "time": now})
    attempt = cache.attempt_by_id(c.attempt_id)
    if attempt is None:
        return f"attempt {c.attempt_id} is unknown"
    gang = (attempt.get("spec") or {}).get("gang") or {}
    if record.format == "Dcp" and int(gang.get("size") or 1) > 1:
        record = dataclasses.replace(record, rank=int(gang.get("rank") or 0), ranks=int(gang["size"]))
    project, name = attempt["metadata"]["namespace"], attempt["metadata"]["name"]
    if record.uri.startswith(rules.S3_URI):
        job = cache.job(project, attempt["spec"]["job"])
        record = dataclasses.replace(record, connection=await connection_of(reader(objects), job, record.uri))
    why: list[str] = []

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        siblings = [s if s["metadata"]["name"] != name else obj
                    for s in cache.attempts_of(project, obj["spec"]["job"])]
        refused = rules.refusal(obj, siblings, record)
        why[:] = [refused] if refused else []
        if refused:
            return None
        return {**obj, "status": rules.with_commit(obj.get("status") or {}, record)}
    await objects.mutate(attempt_key(project, name), mutate)
    if why and why[0] != "already committed":
        log.warning("checkpoint %d of attempt %s refused: %s", record.seq, c.attempt_id, why[0])
        return why[0]
    if not why:
        log.info("checkpoint %d of %s/%s committed (%d bytes, %s)", record.seq, project, name, record.size,
                 record.reason or "unspecified reason")
    return None


Mtbi = Callable[[dict[str, Any]], "float | None"]
"""An attempt → the measured MTBI of its offering (controllers/interruptions.py), for `auto` cadences."""


def _gang_due(spec: dict[str, Any], attempt: dict[str, Any], same: Sequence[dict[str, Any]],
              now: float, mtbi: Mtbi) -> tuple[bool, int]:
    """For one member of a Dcp gang: whether to ask it for a part now, and which seq (0: a new one). A
    seq some member of the epoch already stored is asked of the others (so the parts meet); otherwise
    a new seq, when rank 0's cadence is due."""
    gang = attempt["spec"]["gang"]
    epoch = [s for s in same if ((s.get("spec") or {}).get("gang") or {}).get("epoch") == gang.get("epoch")
             and not phase_of(s).terminal]
    stored = {int(c.get("seq", 0)) for s in epoch for c in (s.get("status") or {}).get("checkpoints") or []}
    mine = {int(c.get("seq", 0)) for c in (attempt.get("status") or {}).get("checkpoints") or []}
    pending = sorted(stored - mine)
    if pending:
        return phase_of(attempt) is AttemptPhase.RUNNING, pending[-1]
    rank0 = next((s for s in epoch if int(((s.get("spec") or {}).get("gang") or {}).get("rank") or 0) == 0), None)
    if rank0 is None:
        return False, 0
    due, _ = rules.periodic_due(spec, rank0, same, now, mtbi(rank0))
    return due and phase_of(attempt) is AttemptPhase.RUNNING, 0


async def suspend_failed(cache: Cache, objects: Objects, attempt_id: str, tries: int) -> None:
    """Records on the attempt that its suspend checkpoint failed `tries` times for the Job's current spec."""
    attempt = cache.attempt_by_id(attempt_id)
    if attempt is None:
        return
    project = attempt["metadata"]["namespace"]
    job = cache.job(project, attempt["spec"]["job"]) or {}
    generation = int((job.get("metadata") or {}).get("generation") or 1)

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        if phase_of(obj).terminal:
            return None
        obj["status"] = {**(obj.get("status") or {}), "suspendFailed": {"generation": generation, "tries": tries}}
        stop = (obj.get("spec") or {}).get("stop") or {}
        if stop.get("checkpointSeq"):
            obj["spec"].pop("stop")  # it keeps running; a later suspend asks again
            obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
        return obj
    await objects.mutate(attempt_key(project, attempt["metadata"]["name"]), mutate)


def _duration(secs: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(secs * 1e9)))
    return d


Read = Callable[[str, str, str], Awaitable["dict[str, Any] | None"]]
"""(plural, project, name) → the stored object or None: how `checkpoint_store` reads Connections and Secrets."""


async def checkpoint_store(read: Read, vault: Vault, job: dict[str, Any]) -> agent_pb2.Location | None:
    """Where a Checkpointed Job's checkpoints go: the first S3 Connection in spec.connections, with the
    keys of its Secret's latest version (read now, at assignment, so rotated keys reach new attempts);
    None for the embedded blob store (no Connection listed, or the Job does not checkpoint).

    Raises NodusError, which fails the attempt's assignment, when a listed Connection or its Secret
    does not exist or the Secret lacks a key: they may be created after the Job (ADR 0014)."""
    spec = job.get("spec") or {}
    if rules.continuity(spec) != "Checkpointed":
        return None
    project, name = job["metadata"]["namespace"], job["metadata"]["name"]
    for conn_name in spec.get("connections") or []:
        conn = await read("connections", project, conn_name)
        if conn is None:
            raise NodusError("NotFound", f'Connection "{conn_name}" (named in spec.connections of Job "{name}") '
                             f'does not exist in project "{project}"', name=conn_name, kind="connections",
                             fix=f"create the Connection {conn_name} (kubectl apply -f connection.yaml); the next "
                                 "attempt uses it")
        cspec = conn.get("spec") or {}
        if cspec.get("type") != "S3":
            continue
        s3 = cspec.get("s3") or {}
        prefix = "/".join(p for p in (str(s3.get("prefix") or "").strip("/"), project, name) if p)
        credentials = await connection_fields(read, vault, project, conn_name, s3)
        return agent_pb2.Location(uri=f"s3://{s3['bucket']}/{prefix}/", credentials=credentials)
    return None


async def connection_fields(read: Read, vault: Vault, project: str, conn_name: str, s3: dict[str, Any]) -> dict[str, str]:
    """Location.credentials of an s3:// store: accessKeyId, secretAccessKey, sessionToken (its Secret's
    latest version), endpoint and region (S3Store.at reads the same names). Raises NodusError."""
    values = await _connection_keys(read, vault, project, conn_name, str(s3.get("secret") or ""))
    return {k: v for k, v in (("endpoint", s3.get("endpoint") or ""), ("region", s3.get("region") or ""),
                              *values.items()) if v}


async def _connection_keys(read: Read, vault: Vault, project: str, conn: str, secret_name: str) -> dict[str, str]:
    """accessKeyId, secretAccessKey and sessionToken (when present) of the Secret's latest version."""
    where = f'Secret "{secret_name}" (spec.s3.secret of Connection "{conn}")'
    needs = f"a Secret with the keys {' and '.join(SECRET_KEYS)} (and optionally {SESSION_TOKEN})"
    secret = await read("secrets", project, secret_name)
    version = int(((secret or {}).get("status") or {}).get("version") or 0)
    if secret is None or not version:
        raise NodusError("NotFound", f'{where} does not exist in project "{project}"', name=secret_name,
                         kind="secrets", fix=f"create {needs} named {secret_name}; the next attempt uses it")
    stored = await vault.get(project, secret_name, version)
    out: dict[str, str] = {}
    for key in (*SECRET_KEYS, SESSION_TOKEN):
        if key not in stored:
            if key == SESSION_TOKEN:
                continue
            raise NodusError("NotFound", f'{where} has no key "{key}"', name=secret_name, kind="secrets",
                             fix=f"give it {needs}")
        try:
            out[key] = base64.b64decode(stored[key], validate=True).decode().strip()
        except (binascii.Error, ValueError):
            raise NodusError("BadRequest", f'{where}: the value of "{key}" is not UTF-8 text', name=secret_name,
                             kind="secrets", fix=f"write {key} as plain text (stringData)") from None
    return out


def prepare(out: agent_pb2.Assignment, attempt: dict[str, Any], job: dict[str, Any],
            siblings: Sequence[dict[str, Any]], store: agent_pb2.Location | None = None,
            mtbi: float | None = None) -> None:
    """Adds recovery to a built Assignment: the checkpoint policy, and for a replacement what it resumes
    from (continuity Checkpointed: the index's latest committed checkpoint as restore_from;
    Restartable: the last reported progress units as NODUS_RESUME_UNITS; Ephemeral: nothing).

    `store` is where new checkpoints go (`checkpoint_store`; None: the embedded blob store); an s3://
    checkpoint to restore carries the same credentials."""
    spec = job.get("spec") or {}
    a = attempt["spec"]
    same = [s for s in rules.index_attempts(siblings, a.get("jobUID", ""), int(a.get("index", 0)))
            if s["spec"].get("id") != a.get("id")]
    mode = rules.continuity(spec)
    if mode == "Checkpointed":
        policy = (spec.get("recovery") or {}).get("checkpoint") or {}
        out.checkpoint.CopyFrom(agent_pb2.CheckpointPolicy(
            paths=policy.get("paths") or ["/nodus/state"], interval=_duration(rules.interval(spec, same, mtbi)),
            max_size_bytes=_size(policy.get("maxSize")),
            format=agent_pb2.CHECKPOINT_FORMAT_DCP if policy.get("format") == "Dcp"
            else agent_pb2.CHECKPOINT_FORMAT_SNAPSHOT,
            integration=_INTEGRATIONS.get(policy.get("integration") or "Auto", agent_pb2.CHECKPOINT_INTEGRATION_AUTO),
            store=store if store is not None else agent_pb2.Location(uri=BLOB_URI)))
        top = rules.latest(same)
        if top is not None:
            ref = _ref(top)
            ref.parts.extend(_ref(p) for p in top.get("parts") or [])
            if store is not None and store.uri.startswith("s3://"):
                for r in (ref, *ref.parts):
                    if r.manifest.uri.startswith("s3://"):
                        r.manifest.credentials.update(store.credentials)
            out.restore_from.CopyFrom(ref)
    elif mode == "Restartable":
        done = [((s.get("status") or {}).get("progress") or {}).get("units", {}).get("completed")
                for s in sorted(same, key=lambda s: int(s["spec"].get("number", 0)))]
        units = [d for d in done if isinstance(d, int)]
        if units:
            out.env["NODUS_RESUME_UNITS"] = str(max(units))


def _ref(record: dict[str, Any]) -> agent_pb2.CheckpointRef:
    return agent_pb2.CheckpointRef(
        seq=int(record["seq"]), manifest=agent_pb2.Location(uri=record.get("uri") or BLOB_URI + record["sha256"]),
        sha256=record["sha256"], size_bytes=int(record.get("size") or 0),
        format=agent_pb2.CHECKPOINT_FORMAT_DCP if record.get("format") == "Dcp" else agent_pb2.CHECKPOINT_FORMAT_SNAPSHOT,
        epoch=int(record.get("epoch") or 0))


def _size(text: Any) -> int:
    try:
        return int(parse_quantity(str(text))) if text else 0
    except (ValueError, TypeError):
        return 0


def suspend_message(attempt: dict[str, Any]) -> agent_pb2.Suspend | None:
    """The Suspend for an attempt whose stop asks for a checkpoint first; None for a plain stop."""
    stop = (attempt.get("spec") or {}).get("stop") or {}
    if not stop.get("checkpointSeq"):
        return None
    out = agent_pb2.Suspend(attempt_id=attempt["spec"]["id"], reason=stop.get("reason", "Suspended"),
                            seq=int(stop["checkpointSeq"]), grace_seconds=int(stop.get("graceSeconds") or 0))
    deadline = parse(stop.get("checkpointDeadline"))
    if deadline is not None:
        out.checkpoint_deadline.FromNanoseconds(int(deadline * 1e9))  # a preemption's grace
    return out


async def reclaim(cache: Cache, objects: Objects, node: str, grace_seconds: int, now: float) -> int:
    """A preemption notice for every attempt on `node`: a running attempt of a Checkpointed Job
    checkpoints (reason Preemption) within the grace and then stops; any other stops at once. Either
    way the stop reason is Preempted, so the attempt is recorded Lost (counted against
    recovery.maxAttempts) and replaced elsewhere, restoring the latest checkpoint. Returns how many
    attempts were asked to checkpoint."""
    asked = 0
    for attempt in cache.attempts_on(node):
        if phase_of(attempt).terminal:
            continue
        project, spec = attempt["metadata"]["namespace"], attempt["spec"]
        job = cache.job(project, spec["job"]) or {}
        if spec.get("gang"):
            asked += await _reclaim_gang(cache, objects, attempt, job, grace_seconds, now)
            continue
        seq = 0
        if phase_of(attempt).value == "Running" and rules.continuity(job.get("spec") or {}) == "Checkpointed":
            siblings = rules.index_attempts(cache.attempts_of(project, spec["job"]), spec.get("jobUID", ""),
                                            int(spec.get("index", 0)))
            seq = rules.next_seq(siblings)
        asked += await _notice(objects, attempt, "Preempted", grace_seconds, now, seq)
    return asked


async def _notice(objects: Objects, attempt: dict[str, Any], reason: str, grace_seconds: int, now: float,
                  seq: int) -> int:
    """Stops `attempt` for `reason` within the grace, checkpointing `seq` first (0: none) by the
    deadline; 1 when a checkpoint was asked for."""
    from .controllers.job_controller import stop  # noqa: PLC0415 - the executor's own stop mutation

    mutation = stop(reason, grace_seconds, now, seq)

    def noticed(obj: dict[str, Any]) -> dict[str, Any] | None:
        new = mutation(obj)
        if new is not None and seq:
            new["spec"]["stop"]["checkpointDeadline"] = rfc3339(now + grace_seconds)
        return new
    key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])
    return 1 if await objects.mutate(key, noticed) is not None and seq else 0


async def _reclaim_gang(cache: Cache, objects: Objects, attempt: dict[str, Any], job: dict[str, Any],
                        grace_seconds: int, now: float) -> int:
    """A gang member's node is reclaimed: the whole gang checkpoints with one seq (every rank its part
    for Dcp, rank 0 its state for a Snapshot) within the grace, then stops; the reclaimed member is
    Preempted (Lost: the gang restarts at the next epoch from that checkpoint), the others GangRestart."""
    project, spec = attempt["metadata"]["namespace"], attempt["spec"]
    epoch = int(spec["gang"].get("epoch") or 0)
    siblings = cache.attempts_of(project, spec["job"])
    members = [m for m in siblings if ((m.get("spec") or {}).get("gang") or {}).get("epoch") == epoch
               and (m.get("spec") or {}).get("jobUID") == spec.get("jobUID") and not phase_of(m).terminal]
    job_spec = job.get("spec") or {}
    dcp = ((job_spec.get("recovery") or {}).get("checkpoint") or {}).get("format") == "Dcp"
    running = all(phase_of(m).value == "Running" for m in members) and len(members) == int(spec["gang"].get("size") or 0)
    seq = 0
    if running and rules.continuity(job_spec) == "Checkpointed":
        seq = rules.next_seq(rules.index_attempts(siblings, spec.get("jobUID", ""), 0))
    asked = 0
    for m in members:
        rank = int(m["spec"]["gang"].get("rank") or 0)
        reason = "Preempted" if m["spec"]["id"] == spec["id"] else "GangRestart"
        asked += await _notice(objects, m, reason, grace_seconds, now, seq if dcp or rank == 0 else 0)
    return asked


CADENCE_TICK = 5.0
"""How often each agent stream checks whether a Periodic checkpoint fell due (intervals are ≥ 1m)."""


def due_requests(cache: Cache, node: str, now: float, asked: dict[str, tuple[int, float]],
                 mtbi: Mtbi = lambda attempt: None) -> list[agent_pb2.CheckpointRequest]:
    """Periodic CheckpointRequests due on `node` now. `asked` (attempt id → (seq, when)) is the
    stream's memory of what it asked, so a request is repeated only when its checkpoint never came."""
    out = []
    for attempt in cache.attempts_on(node):
        spec = attempt["spec"]
        if phase_of(attempt).terminal or spec.get("stop"):
            asked.pop(spec["id"], None)
            continue
        job = cache.job(attempt["metadata"]["namespace"], spec["job"]) or {}
        if (job.get("metadata") or {}).get("uid") != spec.get("jobUID"):
            continue
        siblings = cache.attempts_of(attempt["metadata"]["namespace"], spec["job"])
        same = rules.index_attempts(siblings, spec.get("jobUID", ""), int(spec.get("index", 0)))
        gang = spec.get("gang") or {}
        if gang:
            # A gang's Snapshot is rank 0's state (every rank holds the same replica); a Dcp checkpoint
            # is every rank's part of the same seq, asked when rank 0's cadence says so.
            dcp = (((job.get("spec") or {}).get("recovery") or {}).get("checkpoint") or {}).get("format") == "Dcp"
            if not dcp and int(gang.get("rank") or 0):
                asked.pop(spec["id"], None)
                continue
            if dcp:
                due, seq = _gang_due(job.get("spec") or {}, attempt, same, now, mtbi)
            else:
                due, seq = rules.periodic_due(job.get("spec") or {}, attempt, siblings, now, mtbi(attempt))[0], 0
        else:
            due, seq = rules.periodic_due(job.get("spec") or {}, attempt, siblings, now, mtbi(attempt))[0], 0
        if not due:
            continue
        seq = seq or rules.next_seq(same)  # only once due: it reads every committed checkpoint
        before = asked.get(spec["id"])
        if before is not None and before[0] == seq and now - before[1] < rules.interval(job.get("spec") or {}, same,
                                                                                         mtbi(attempt)):
            continue
        asked[spec["id"]] = (seq, now)
        out.append(agent_pb2.CheckpointRequest(attempt_id=spec["id"], reason=agent_pb2.CHECKPOINT_REASON_PERIODIC,
                                               seq=seq))
    return out


# -- retention ---------------------------------------------------------------------------------------

RETENTION_TICK = 60.0
"""How often the retention sweep looks for checkpoints whose time is up (retainAfterFinish is hours)."""


class Blobs(Protocol):
    """What the sweep needs of the embedded blob store (blobs.BlobStore)."""

    async def delete(self, sha256: str) -> bool: ...


def reader(objects: Objects) -> Read:
    """`Read` over the stored objects (Connections and Secrets are not in the cache)."""
    async def read(plural: str, project: str, name: str) -> dict[str, Any] | None:
        found = await objects.read(f"{plural}/{project}/{name}")
        return found[0] if found is not None else None
    return read


async def connection_of(read: Read, job: dict[str, Any] | None, uri: str) -> str:
    """The Connection of the Job's spec.connections that an s3:// checkpoint went to (its bucket)."""
    if job is None or not uri.startswith(rules.S3_URI):
        return ""
    bucket = uri[len(rules.S3_URI):].partition("/")[0]
    project = job["metadata"]["namespace"]
    for name in (job.get("spec") or {}).get("connections") or []:
        conn = await read("connections", project, name)
        cspec = (conn or {}).get("spec") or {}
        if cspec.get("type") == "S3" and (cspec.get("s3") or {}).get("bucket") == bucket:
            return str(name)
    return ""


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
    with it at once; their archives are remembered from the deletion event and deleted on the next
    sweep, so only a coordinator that stops in between leaves them behind.

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
        self._forgotten: set[str] = set()
        """Archives of Attempts deleted with their records (their Job was deleted)."""
        self._forgotten_s3: set[rules.S3Archive] = set()
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None and old is not None:
            status = old.get("status") or {}
            project = old["metadata"].get("namespace", "")
            for c in [*(status.get("checkpoints") or []), *(status.get(rules.SUPERSEDED) or [])]:
                if rules.in_s3(c):
                    self._forgotten_s3.add(rules.s3_archive(project, c, whole=True))
                elif c.get("sha256"):
                    self._forgotten.add(str(c["sha256"]))

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
        # Archives of deleted Attempts go unless something that is still here names them.
        forgotten = rules.unnamed(self._forgotten, [*map(rules.unlisted, self.cache.attempts()), *jobs])
        self._forgotten &= forgotten  # one still named by something is not ours to delete
        for digest in sorted(set(due.digests) | forgotten):
            await self.blobs.delete(digest)
            self._forgotten.discard(digest)  # a failed delete stays remembered for the next sweep
        forgotten_s3, self._forgotten_s3 = self._forgotten_s3, set()
        retry = await self._delete_s3(sorted({*due.s3, *forgotten_s3}, key=lambda x: (x.prefix, x.seq)))
        self._forgotten_s3 |= retry & forgotten_s3
        for project, name in due.attempts:
            await self.objects.mutate(attempt_key(project, name),
                                      lambda obj: _with_status(obj, rules.without_checkpoints, retry))
        for project, name, upto in due.trimmed:
            trim = functools.partial(rules.without_superseded, upto=upto)
            await self.objects.mutate(attempt_key(project, name), lambda obj, trim=trim: _with_status(obj, trim, retry))
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
