"""Typed, frozen views of the stored objects the controllers read.

A stored object is a nested dict whose fields may be absent; `from_object` is the one place that
digs into it and applies the defaults, so a decision reads typed fields and never `(x.get("spec")
or {})`. Views are for reading: writers patch the stored objects, which they are handed as such
(the Job controller's status write and new attempts, the stream's folds), never through a view.
"""
from __future__ import annotations

import enum
from decimal import Decimal
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..api.job_annotations import CHECKPOINT_REQUESTED
from ..clock import parse, seconds
from ..money.estimate import Tariff
from .attempt_machine import AttemptPhase


def _dict(value: object) -> dict[str, Any]:
    """A nested object, or an empty one when it is absent or not an object."""
    return value if isinstance(value, dict) else {}


_EMPTY: Mapping[str, Any] = MappingProxyType({})

FUNDED = "Funded"
"""The Job condition the money controller owns: False while money stops the Job."""

DEFAULT_STARTUP_TIMEOUT = 15 * 60.0
"""spec.distributed.startupTimeout's default (15m)."""
DEFAULT_ASSEMBLY_RETRIES = 2
"""spec.distributed.maxAssemblyRetries' default."""
DEFAULT_RETAIN = 168 * 3600.0
"""recovery.checkpoint.retainAfterFinish's default (168h)."""


def _dicts(value: object) -> tuple[dict[str, Any], ...]:
    """A list of nested objects; entries that are not objects are left out."""
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


class JobPhase(str, enum.Enum):
    """A Job's run-to-completion phase: a summary of its attempts, not the state machine itself.

    Pending → Queued → Provisioning → Running → Succeeded | Failed | Cancelled, and Suspended from any
    non-terminal phase while spec.state is Suspended (back to Queued on resume). Terminal phases are
    never left.
    """

    PENDING = "Pending"
    """Accepted; the controller has not created its attempts yet."""
    QUEUED = "Queued"
    """Attempts wait for capacity; none is placed yet."""
    PROVISIONING = "Provisioning"
    """An attempt is placed and its node prepares it; no main command runs yet."""
    RUNNING = "Running"
    """At least one attempt's main command runs."""
    SUSPENDED = "Suspended"
    """spec.state is Suspended: attempts are stopped and capacity freed until it is Running again."""
    SUCCEEDED = "Succeeded"
    """Terminal: every index (spec.completions) succeeded."""
    FAILED = "Failed"
    """Terminal: backoffLimit, recovery.maxAttempts, timeout or queueTimeout ran out (see reason)."""
    CANCELLED = "Cancelled"
    """Terminal: spec.state is Cancelled; stopped for good."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES

    @classmethod
    def parse(cls, value: object) -> "JobPhase":
        try:
            return cls(value) if value else cls.PENDING
        except ValueError:
            return cls.PENDING


TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})


def terminal_phases() -> frozenset[JobPhase]:
    return TERMINAL_PHASES


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
    resources: Mapping[str, Any] = field(default_factory=dict)
    """spec.resources: what it asks of a node (the scheduler's Request reads it)."""
    image: str = ""
    """spec.image: an OCI image ("" runs a process)."""
    constraints: Mapping[str, Any] = field(default_factory=dict)
    """spec.placement: where it may run (regions, offerings) and the node a gang rank prefers or avoids."""
    tariff: Tariff | None = None
    """How its allocation is charged, frozen at placement on a priced offering (None: not charged)."""
    inputs: tuple[Mapping[str, Any], ...] = ()
    """status.inputs: {name, sha256} of each input as its agent materialized it."""
    warnings: tuple[Mapping[str, Any], ...] = ()
    """status.warnings: {code, message} notes that stop nothing (GpuUnhealthy: gpu_warnings.py)."""
    log_bytes: int = 0
    """status.logBytes: its log's size in the blob store, as garbage collection last measured it (blob_gc.py)."""

    @property
    def placed(self) -> bool:
        return bool(self.node)

    @property
    def checkpoint_seq_asked(self) -> int:
        """spec.stop.checkpointSeq: the seq of the suspend checkpoint asked for (0: none)."""
        return int((self.stop or {}).get("checkpointSeq") or 0)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> AttemptView:
        meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
        progress, gang = status.get("progress"), _dict(spec.get("gang"))
        return cls(name=meta["name"], project=meta.get("namespace", ""), job=spec.get("job", ""),
                   job_uid=spec.get("jobUID", ""), index=int(spec.get("index", 0)),
                   number=int(spec.get("number", 1)), phase=AttemptPhase.parse(status.get("phase")),
                   reason=status.get("reason", ""), message=status.get("message", ""),
                   exit_code=status.get("exitCode"), oom_killed=bool(status.get("oomKilled")),
                   node=spec.get("node", ""), created=parse(meta.get("creationTimestamp")),
                   provisioned=parse(status.get("provisioningTime")), started=parse(status.get("startTime")),
                   stop_requested=bool(spec.get("stop")),
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
                   restored_from_seq=int(status.get("restoredFromSeq") or 0),
                   resources=_dict(spec.get("resources")), image=spec.get("image") or "",
                   constraints=_dict(spec.get("placement")), tariff=_tariff(spec),
                   inputs=_dicts(status.get("inputs")), warnings=_dicts(status.get("warnings")),
                   log_bytes=int(status.get("logBytes") or 0))


def _tariff(spec: Mapping[str, Any]) -> Tariff | None:
    """The tariff placement froze on the Attempt (spec.rateUSDPerHour, billingIncrementSeconds,
    minimumChargeSeconds), or None on capacity no price book prices."""
    rate, increment = spec.get("rateUSDPerHour"), spec.get("billingIncrementSeconds")
    if not rate or not increment:
        return None
    return Tariff(Decimal(str(rate)), int(increment), int(spec.get("minimumChargeSeconds") or 0))


@dataclass(frozen=True, slots=True)
class OutputInput:
    """One `output` input of a Job's spec.inputs: a committed output of another Job of its project."""

    name: str
    """spec.inputs[i].name: where it lands (/nodus/inputs/<name>)."""
    position: int
    """i, for the field path spec.inputs[i] in messages."""
    job: str
    """output.job: the producing Job."""
    output: str
    """output.name: the producer's output."""
    index: int
    """output.index: the producer's index (0)."""


@dataclass(frozen=True, slots=True)
class Producer:
    """What a consumer's decision reads of a Job one of its `output` inputs names: whether that output
    is committed, could still be, or never will be (the Job controller reads it from the cache)."""

    phase: JobPhase
    committed: frozenset[tuple[str, int]]
    """(output, index) of every output committed with a digest."""
    declared: frozenset[str]
    """The output names it can commit: spec.outputs and the default `outputs`."""
    completions: int

    @classmethod
    def of(cls, view: JobView) -> Producer:
        return cls(phase=view.phase,
                   committed=frozenset((str(o.get("name")), int(o.get("index") or 0)) for o in view.outputs
                                       if o.get("sha256")),
                   declared=frozenset(view.declared_outputs) | {"outputs"}, completions=view.completions)


def _output_inputs(spec: Mapping[str, Any]) -> tuple[OutputInput, ...]:
    out = []
    for i, item in enumerate(_dicts(spec.get("inputs"))):
        ref = _dict(item.get("output"))
        if ref:
            out.append(OutputInput(name=str(item.get("name") or ""), position=i, job=str(ref.get("job") or ""),
                                   output=str(ref.get("name") or ""), index=int(ref.get("index") or 0)))
    return tuple(out)


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
    """spec.state: Running, Suspended or Cancelled; Suspended too while money stops a Running Job
    (`money_stop`)."""
    queue_timeout: float | None
    checkpoint_interval: str
    """spec.recovery.checkpoint.interval, a duration or "auto" (from the offering's measured MTBI)."""
    checkpoint_format: str
    """spec.recovery.checkpoint.format: Dcp (every rank writes its part) or Snapshot."""
    gang: bool
    """spec.distributed is set: a gang Job, its one index run by `topology["nodes"]` members."""
    network: str
    """spec.distributed.network: how close a gang's nodes must be (Regional by default)."""
    launcher: str
    """spec.distributed.launcher: Plain (the default), Torchrun, Ray …"""
    startup_timeout: float
    """spec.distributed.startupTimeout in seconds: how long a placed gang may take to assemble (15m)."""
    startup_timeout_text: str
    """spec.distributed.startupTimeout as written, for messages ("15m" when unset)."""
    max_assembly_retries: int
    """spec.distributed.maxAssemblyRetries: re-placements after an assembly timeout (2)."""
    topology: Mapping[str, Any]
    """status.topology once resolved, else resolved from the spec now (`topology`); empty outside a gang."""
    continuity: str
    """spec.recovery.continuity: Checkpointed (the default) or Restart."""
    retain_after_finish: float
    """spec.recovery.checkpoint.retainAfterFinish in seconds (168h): how long checkpoints outlive the finish."""
    finished: float | None
    """status.completionTime: when the Job reached a terminal phase."""
    phase: JobPhase
    """status.phase as last written (Pending before the first decision)."""
    reason: str
    """status.reason as last written."""
    message: str
    """status.message as last written."""
    conditions: tuple[Mapping[str, Any], ...]
    """status.conditions as last written (Suspended, SuspendFailed, Complete, Failed, Cancelled)."""
    timeout_start: float | None
    """status.timeoutStartTime: when spec.timeout started counting (the first provisioning)."""
    suspended_for: float
    """status.suspendedDuration in seconds: time suspended since timeoutStartTime (not counted)."""
    started: float | None
    """status.startTime: when the first attempt's main command started."""
    outputs: tuple[Mapping[str, Any], ...]
    """status.outputs: the outputs committed so far (they only accumulate)."""
    gang_status: Mapping[str, Any]
    """status.gang as last written (its probe is kept while the epoch's members report none)."""
    stop_by: float | None = None
    """status.stopByTime: while money stops the Job for credits, the funded edge after which its
    attempts stop without their checkpoint."""
    spec_state: JobState = JobState.RUNNING
    """spec.state as written (`state` reads Suspended while money stops the Job)."""
    money_stop: tuple[str, str] | None = None
    """(reason, message) of a False Funded condition, which the money controller (billing.py) writes:
    MaxCostReached or InsufficientCredits. A Running Job is then suspended as if spec.state said so,
    and resumes once Funded turns True."""
    output_inputs: tuple[OutputInput, ...] = ()
    """spec.inputs that name another Job's output: no attempt is created before each is committed."""
    pinned_inputs: tuple[Mapping[str, Any], ...] = ()
    """status.inputs as last written: admission's volume pins, and the digests attempts verified."""
    declared_outputs: tuple[str, ...] = ()
    """spec.outputs[].name: what a consumer of this Job may name (besides the default `outputs`)."""
    sink_outputs: frozenset[str] = frozenset()
    """spec.outputs[].name of those with a sink: committed, they start at sink phase Pending (sinks.py)."""
    producers: Mapping[str, Producer] = field(default_factory=dict)
    """The Jobs `output_inputs` name, by name, as the Job controller read them (not from this object);
    one that is absent does not exist (or is being deleted)."""
    checkpoint_requested: str = ""
    """metadata.annotations["nodus.dev/checkpoint-requested-at"]: a checkpoint asked for (job_requests.py)."""
    handled_requests: Mapping[str, Any] = field(default_factory=dict)
    """status.handledRequests: the last value of each *-requested-at annotation that was carried out."""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> JobView:
        meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
        recovery, checkpoint = _dict(spec.get("recovery")), _dict(_dict(spec.get("recovery")).get("checkpoint"))
        ttl, dist = spec.get("ttlSecondsAfterFinished"), spec.get("distributed")
        gang, retain = isinstance(dist, dict), seconds(checkpoint.get("retainAfterFinish"))
        dist = _dict(dist)
        conditions = _dicts(status.get("conditions"))
        funded = next((c for c in conditions if c.get("type") == FUNDED), None)
        money_stop = (str(funded.get("reason") or ""), str(funded.get("message") or "")) \
            if funded is not None and funded.get("status") == "False" else None
        state = JobState.parse(spec.get("state"))
        if money_stop is not None and state is JobState.RUNNING:
            state = JobState.SUSPENDED
        return cls(name=meta.get("name", ""), project=meta.get("namespace", ""), uid=meta.get("uid", ""),
                   generation=int(meta.get("generation") or 1), deleting=bool(meta.get("deletionTimestamp")),
                   completions=int(spec.get("completions") or 1), parallelism=int(spec.get("parallelism") or 1),
                   backoff_limit=int(spec.get("backoffLimit", 6)), max_attempts=int(recovery.get("maxAttempts") or 3),
                   min_progress=seconds(recovery.get("minProgressDuration")),
                   fail_on_interruption=recovery.get("onInterruption") == "Fail",
                   timeout=seconds(spec.get("timeout")),
                   ttl=ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None,
                   state=state,
                   queue_timeout=seconds(_dict(spec.get("placement")).get("queueTimeout")),
                   checkpoint_interval=checkpoint.get("interval", "auto"),
                   checkpoint_format=checkpoint.get("format", ""),
                   gang=gang, network=dist.get("network") or "Regional", launcher=dist.get("launcher") or "Plain",
                   startup_timeout=seconds(dist.get("startupTimeout")) or DEFAULT_STARTUP_TIMEOUT,
                   startup_timeout_text=str(dist.get("startupTimeout") or "15m"),
                   max_assembly_retries=int(dist.get("maxAssemblyRetries", DEFAULT_ASSEMBLY_RETRIES)),
                   topology=topology(spec, _dict(status.get("topology"))) if gang else _EMPTY,
                   continuity=recovery.get("continuity") or "Checkpointed",
                   retain_after_finish=DEFAULT_RETAIN if retain is None else max(0.0, retain),
                   finished=parse(status.get("completionTime")), phase=JobPhase.parse(status.get("phase")),
                   reason=status.get("reason", ""), message=status.get("message", ""),
                   conditions=conditions, timeout_start=parse(status.get("timeoutStartTime")),
                   suspended_for=seconds(status.get("suspendedDuration")) or 0.0,
                   started=parse(status.get("startTime")), outputs=_dicts(status.get("outputs")),
                   gang_status=_dict(status.get("gang")),
                   spec_state=JobState.parse(spec.get("state")), money_stop=money_stop,
                   stop_by=parse(status.get("stopByTime")), output_inputs=_output_inputs(spec),
                   pinned_inputs=_dicts(status.get("inputs")),
                   declared_outputs=tuple(str(o.get("name")) for o in _dicts(spec.get("outputs"))),
                   sink_outputs=frozenset(str(o.get("name")) for o in _dicts(spec.get("outputs")) if o.get("sink")),
                   checkpoint_requested=str(_dict(meta.get("annotations")).get(CHECKPOINT_REQUESTED) or ""),
                   handled_requests=_dict(status.get("handledRequests")))


def topology(spec: Mapping[str, Any], prev: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """status.topology: resolved once from spec.distributed and spec.resources.gpu (it never changes
    across epochs, so a resolved `prev` is kept as it is)."""
    if prev:
        return dict(prev)
    dist = spec.get("distributed") or {}
    gpu = (spec.get("resources") or {}).get("gpu") or {}
    per_node = int(dist.get("gpusPerNode") or gpu.get("count") or (1 if gpu.get("type") else 0))
    if dist.get("totalGPUs"):
        nodes, resolved = int(dist["totalGPUs"]) // max(per_node, 1), "TotalGPUs"
    else:
        nodes, resolved = int(dist.get("nodes") or 2), "Nodes"
    out = {"nodes": nodes, "gpusPerNode": per_node, "totalGPUs": nodes * per_node,
           "network": dist.get("network") or "Regional", "resolvedFrom": resolved}
    if gpu.get("type"):
        out["accelerator"] = str(gpu["type"][0])
    return out
