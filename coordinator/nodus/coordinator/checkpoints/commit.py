"""Commits from agents, fenced: a commit record is written on the Attempt that took it in the same
compare-and-swap that checks the fence (controllers/checkpoints.py says what is refused), and a
suspend checkpoint that failed is recorded where the Job controller reads it."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from nodus.v1 import agent_pb2

from ..controllers import checkpoints as rules
from ..controllers.attempts import phase_of
from ..controllers.cache import Cache, attempt_key
from ..controllers.objects import Objects
from .locations import BLOB_URI, connection_of, reader

log = logging.getLogger("nodus.checkpoints")

REASONS = {agent_pb2.CHECKPOINT_REASON_PERIODIC: "Periodic", agent_pb2.CHECKPOINT_REASON_SUSPEND: "Suspend",
           agent_pb2.CHECKPOINT_REASON_PREEMPTION: "Preemption", agent_pb2.CHECKPOINT_REASON_REQUESTED: "Requested"}
FORMATS = {agent_pb2.CHECKPOINT_FORMAT_DCP: "Dcp"}


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
