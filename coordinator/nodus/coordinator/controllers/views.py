"""Typed, frozen views of the stored objects the controllers read.

A stored object is a nested dict whose fields may be absent; `from_object` is the one place that
digs into it and applies the defaults, so a decision reads typed fields and never `(x.get("spec")
or {})`. Views are for reading: writers still patch the stored dicts (status, spec.stop).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..clock import parse
from .attempt_machine import AttemptPhase


def _dict(value: object) -> dict[str, Any]:
    """A nested object, or an empty one when it is absent or not an object."""
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> tuple[dict[str, Any], ...]:
    """A list of nested objects; entries that are not objects are left out."""
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


@dataclass(frozen=True, slots=True)
class AttemptView:
    """The parts of an Attempt object the decisions read."""

    name: str
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

    @property
    def placed(self) -> bool:
        return bool(self.node)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> AttemptView:
        meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
        progress = status.get("progress")
        return cls(name=meta["name"], job_uid=spec.get("jobUID", ""), index=int(spec.get("index", 0)),
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
                   inputs_ready_time=status.get("inputsReadyTime") or "")
