"""What an assignment carries for recovery: the checkpoint policy and what a replacement resumes from;
and the Suspend that asks a stopping attempt for a checkpoint first."""
from __future__ import annotations

from typing import Any, Sequence

from google.protobuf import duration_pb2

from nodus.v1 import agent_pb2

from ..api.units import parse_quantity
from ..clock import parse
from ..controllers import checkpoints as rules
from ..controllers.reasons import AttemptReason
from .locations import BLOB_URI

_INTEGRATIONS = {"Auto": agent_pb2.CHECKPOINT_INTEGRATION_AUTO, "None": agent_pb2.CHECKPOINT_INTEGRATION_NONE,
                 "HFTrainer": agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER}


def _duration(secs: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(secs * 1e9)))
    return d


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
    out = agent_pb2.Suspend(attempt_id=attempt["spec"]["id"], reason=stop.get("reason", AttemptReason.SUSPENDED),
                            seq=int(stop["checkpointSeq"]), grace_seconds=int(stop.get("graceSeconds") or 0))
    deadline = parse(stop.get("checkpointDeadline"))
    if deadline is not None:
        out.checkpoint_deadline.FromNanoseconds(int(deadline * 1e9))  # a preemption's grace
    return out
