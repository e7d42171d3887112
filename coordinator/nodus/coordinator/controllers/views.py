"""Typed, frozen views of the stored objects the controllers read.

A stored object is a nested dict whose fields may be absent; `from_object` is the one place that
digs into it and applies the defaults, so a decision reads typed fields and never `(x.get("spec")
or {})`. Views are for reading: writers still patch the stored dicts (status, spec.stop).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from ..clock import parse, seconds
from .attempt_machine import AttemptPhase


def _dict(value: object) -> dict[str, Any]:
    """A nested object, or an empty one when it is absent or not an object."""
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> tuple[dict[str, Any], ...]:
    """A list of nested objects; entries that are not objects are left out."""
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


class JobState(str, enum.Enum):
    """spec.state: what the customer wants of the Job (the words of api/job.py's STATES)."""

    RUNNING = "Running"
    """The default: run to completion."""
    SUSPENDED = "Suspended"
    """Stop the attempts (checkpointing first where it can) and free the capacity until Running again."""
    CANCELLED = "Cancelled"
    """Stop the Job for good: it ends Cancelled and is never resumed."""

    @classmethod
    def parse(cls, value: object) -> JobState:
        """The stored word; an absent one is Running (admission refuses any other word)."""
        try:
            return cls(value) if value else cls.RUNNING
        except ValueError:
            return cls.RUNNING


@dataclass(frozen=True, slots=True)
class AttemptView:
    """The parts of an Attempt object the decisions read."""

    name: str
    project: str
    job: str
    """spec.job: the name of the Job it runs for."""
    job_uid: str
    index: int
    number: int
    phase: AttemptPhase
    reason: str
    message: str
    exit_code: int | None
    oom_killed: bool
    node: str
    created: float | None
    provisioned: float | None
    started: float | None
    stop_requested: bool
    obj: dict[str, Any]
    """The stored object, for the readers not yet moved onto typed fields (checkpoints, gang steps)."""
    finished: float | None
    """status.finishTime: when the attempt reached a terminal phase."""
    lost_at: float | None
    """status.lostTime: when its capacity was declared lost."""
    placement_explain: str
    """status.placement.explain: why no node fits yet (shown while the attempt waits)."""
    progress: Mapping[str, Any] | None
    """status.progress: the latest progress line the program reported."""
    unit_samples_ms: tuple[int, ...]
    """status.unitSamplesMs: durations of the units it completed."""
    outputs: tuple[Mapping[str, Any], ...]
    """status.outputs: the outputs it committed."""
    checkpoints: tuple[Mapping[str, Any], ...]
    """status.checkpoints: the checkpoints it holds."""
    inputs_ready_time: str
    """status.inputsReadyTime, as stored (the Job's status copies the word)."""
    id: str
    """spec.id: the attempt's wire id, as agents name it."""
    offering: str
    """spec.offering: what it was placed on ("" until placed)."""
    region_class: str
    epoch: int
    """spec.gang.epoch: the gang epoch a member belongs to (0 outside a gang)."""
    rank: int
    """spec.gang.rank: the member's rank in its epoch."""
    in_gang: bool
    """spec.gang is set: a member of a gang, placed with its epoch all or nothing."""
    gang_size: int
    """spec.gang.size: the ranks of its epoch (0 outside a gang)."""
    gang_report: Mapping[str, Any]
    """status.gang: what the member's agent reported of its gang steps (epoch, done, address, probe)."""
    stop: Mapping[str, Any] | None
    """spec.stop: the stop the controller asked for (reason, grace), None when none was."""
    suspend_failed: Mapping[str, Any] | None
    """status.suspendFailed: the failed suspend checkpoints (tries, generation)."""
    restored_from_seq: int
    """status.restoredFromSeq: the checkpoint it started from (0: none)."""

    @property
    def placed(self) -> bool:
        return bool(self.node)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> AttemptView:
        meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
        progress, gang = status.get("progress"), _dict(spec.get("gang"))
        return cls(name=meta["name"], project=meta.get("namespace", ""), job=spec.get("job", ""),
                   job_uid=spec.get("jobUID", ""), index=int(spec.get("index", 0)),
                   number=int(spec.get("number", 1)), phase=AttemptPhase.parse(status.get("phase")),
                   reason=status.get("reason", ""), message=status.get("message", ""),
                   exit_code=status.get("exitCode"), oom_killed=bool(status.get("oomKilled")),
                   node=spec.get("node", ""), created=parse(meta.get("creationTimestamp")),
                   provisioned=parse(status.get("provisioningTime")), started=parse(status.get("startTime")),
                   stop_requested=bool(spec.get("stop")), obj=obj,
                   finished=parse(status.get("finishTime")), lost_at=parse(status.get("lostTime")),
                   placement_explain=_dict(status.get("placement")).get("explain") or "",
                   progress=progress if isinstance(progress, dict) and progress else None,
                   unit_samples_ms=tuple(s for s in status.get("unitSamplesMs") or [] if isinstance(s, int)),
                   outputs=_dicts(status.get("outputs")), checkpoints=_dicts(status.get("checkpoints")),
                   inputs_ready_time=status.get("inputsReadyTime") or "", id=spec.get("id", ""),
                   offering=spec.get("offering") or "", region_class=spec.get("regionClass") or "",
                   epoch=int(gang.get("epoch") or 0), rank=int(gang.get("rank") or 0),
                   in_gang=bool(gang), gang_size=int(gang.get("size") or 0),
                   gang_report=_dict(status.get("gang")), stop=_dict(spec.get("stop")) or None,
                   suspend_failed=_dict(status.get("suspendFailed")) or None,
                   restored_from_seq=int(status.get("restoredFromSeq") or 0))


@dataclass(frozen=True, slots=True)
class JobView:
    """The parts of a Job object the decisions read, with the spec's defaults applied."""

    name: str
    project: str
    uid: str
    generation: int
    """metadata.generation: the spec's version, echoed as observedGeneration (1 before any update)."""
    deleting: bool
    """metadata.deletionTimestamp is set: the Job is going and its attempts are orphans."""
    completions: int
    parallelism: int
    backoff_limit: int
    """spec.backoffLimit: customer failures allowed across all indexes (6)."""
    max_attempts: int
    """spec.recovery.maxAttempts: losses of capacity allowed per index (3)."""
    min_progress: float | None
    """spec.recovery.minProgressDuration: a loss after this long running does not count (None: the default)."""
    fail_on_interruption: bool
    """spec.recovery.onInterruption is Fail: any loss of capacity fails the Job."""
    timeout: float | None
    ttl: int | None
    """spec.ttlSecondsAfterFinished; None keeps the finished Job."""
    state: JobState
    """spec.state: Running, Suspended or Cancelled."""
    queue_timeout: float | None
    checkpoint_interval: str
    """spec.recovery.checkpoint.interval, a duration or "auto" (from the offering's measured MTBI)."""
    checkpoint_format: str
    """spec.recovery.checkpoint.format: Dcp (every rank writes its part) or Snapshot."""
    distributed: Mapping[str, Any] | None
    """spec.distributed: present only for a gang Job."""
    network: str
    """spec.distributed.network: how close a gang's nodes must be (Regional by default)."""
    spec: dict[str, Any]
    """The stored spec, for the checkpoint helpers that still read it whole."""
    status: dict[str, Any]
    """The stored status: the decision starts from it and writes the next one."""
    obj: dict[str, Any]

    @property
    def gang(self) -> bool:
        return self.distributed is not None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> JobView:
        meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
        recovery, checkpoint = _dict(spec.get("recovery")), _dict(_dict(spec.get("recovery")).get("checkpoint"))
        ttl, distributed = spec.get("ttlSecondsAfterFinished"), spec.get("distributed")
        return cls(name=meta.get("name", ""), project=meta.get("namespace", ""), uid=meta.get("uid", ""),
                   generation=int(meta.get("generation") or 1), deleting=bool(meta.get("deletionTimestamp")),
                   completions=int(spec.get("completions") or 1), parallelism=int(spec.get("parallelism") or 1),
                   backoff_limit=int(spec.get("backoffLimit", 6)), max_attempts=int(recovery.get("maxAttempts") or 3),
                   min_progress=seconds(recovery.get("minProgressDuration")),
                   fail_on_interruption=recovery.get("onInterruption") == "Fail",
                   timeout=seconds(spec.get("timeout")), ttl=ttl if isinstance(ttl, int) else None,
                   state=JobState.parse(spec.get("state")),
                   queue_timeout=seconds(_dict(spec.get("placement")).get("queueTimeout")),
                   checkpoint_interval=checkpoint.get("interval", "auto"),
                   checkpoint_format=checkpoint.get("format", ""),
                   distributed=distributed if isinstance(distributed, dict) else None,
                   network=_dict(distributed).get("network") or "Regional",
                   spec=spec, status=_dict(obj.get("status")), obj=obj)
