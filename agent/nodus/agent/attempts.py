"""One attempt as the agent knows it, and the pure step that folds a supervisor's status into it.

Stages (the agent's own bookkeeping, persisted in state.json):

    ACCEPTED ──materialized, spawned──▶ SUPERVISED ──succeeded with outputs──▶ COLLECTING ──uploaded──▶ DONE
        │                                   │                                                        ▲
        └──────── refused, input failed, stopped before the spawn ─────────────┴── any other end ─────┘

An ACCEPTED attempt has run nothing, so after an agent restart it is dropped and started afresh
when the coordinator's FullState names it again. A SUPERVISED attempt is re-adopted through its
supervisor's lock and status file. DONE attempts wait for the coordinator to acknowledge the update
that reported their end, then are forgotten (a tombstone stays, so an assignment sent again is never
run twice).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, cast

from google.protobuf.timestamp_pb2 import Timestamp

from nodus.v1 import agent_pb2, common_pb2

from . import layout as L
from .reasons import Reason, check_against_proto, reason_word

# The stubs type EnumTypeWrapper.Value() as a plain int; the value is the enum's member.
PHASES: dict[str, common_pb2.AttemptPhase] = {
    name: cast(common_pb2.AttemptPhase, common_pb2.AttemptPhase.Value(f"ATTEMPT_PHASE_{name}")) for name in (
    "PROVISIONING", "MATERIALIZING", "INITIALIZING", "STARTING_SIDECARS", "RUNNING", "CHECKPOINTING",
    "STOPPING", "SUCCEEDED", "FAILED", "LOST", "CANCELLED")}
TERMINAL = L.TERMINAL

check_against_proto(v.name for v in common_pb2.AttemptReason.DESCRIPTOR.values)
_COUNTS_AS: dict[str, int] = {reason_word(v.name): v.GetOptions().Extensions[common_pb2.counts_as]  # type: ignore[index]
                              for v in common_pb2.AttemptReason.DESCRIPTOR.values if v.number}
LOST_CAPACITY_REASONS = frozenset(word for word, counts in _COUNTS_AS.items()
                                  if counts == common_pb2.REASON_CLASS_LOST_CAPACITY)
"""Stops because the capacity goes (common.proto's ReasonClass, read by name): a checkpoint before
such a stop is a Preemption checkpoint, best effort within the grace."""


class GangStep(enum.StrEnum):
    """A gang member's start-up step (gang.py), in order. The value is the word state.json stores (`gang.done`,
    `gang.plan.step`) and the coordinator's status shows; on the wire it is agent.proto's GangStep member
    of the same name (`proto`, `of_proto`), never a number copied by hand."""

    ASSEMBLE = "Assemble"
    """Materialized, restored and spawned: the supervisor waits at its gate, the member's ports are reserved."""
    MESH = "Mesh"
    """The probe measured RTT and all-reduce bandwidth to the peers (a failed probe does not stop the gang)."""
    START = "Start"
    """The launcher's steps are in run/launch.json: the gate opens and the member's program runs."""

    @property
    def proto(self) -> agent_pb2.GangStep:
        return _STEP_PROTO[self]

    @classmethod
    def of_proto(cls, number: int) -> GangStep | None:
        """The step a GangPlan names (None: unspecified, or a number this agent does not know)."""
        return _PROTO_STEP.get(number)

    @property
    def last(self) -> bool:
        """Nothing of the member is held by the agent after its last step (the program owns its ports)."""
        return self is GangStep.START


_STEP_PROTO: dict[GangStep, agent_pb2.GangStep] = {
    step: cast(agent_pb2.GangStep, agent_pb2.GangStep.Value(f"GANG_STEP_{step.name}")) for step in GangStep}
_PROTO_STEP: dict[int, GangStep] = {number: step for step, number in _STEP_PROTO.items()}


def gang_step(word: object) -> GangStep | None:
    """The step a stored word names ("" or None: no step done yet)."""
    return GangStep(str(word)) if word else None


class Stage(str, enum.Enum):
    ACCEPTED = "accepted"
    """Known; inputs are being materialized; no supervisor exists and nothing of it has run."""
    SUPERVISED = "supervised"
    """A supervisor was spawned (its lock was taken before the fork); it owns the attempt's processes."""
    COLLECTING = "collecting"
    """The command succeeded; the agent uploads the outputs the supervisor collected."""
    DONE = "done"
    """The end is fixed; it waits for the coordinator's ack of the update that reported it."""


def timestamp(seconds: float | None) -> Timestamp | None:
    if seconds is None:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


@dataclass(slots=True)
class Attempt:
    id: str
    job: dict[str, str] = field(default_factory=dict)
    index: int = 0
    number: int = 0
    stage: Stage = Stage.ACCEPTED
    phase: str = "PROVISIONING"
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    oom_killed: bool = False
    start_time: float | None = None
    finish_time: float | None = None
    inputs_ready_time: float | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    """The sha256 of each input by name, as materialized (reported with inputs_ready_time)."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """OutputCommits uploaded so far (name, path, uri, sha256, size)."""
    stop: dict[str, Any] | None = None
    """The stop asked for: reason, grace_seconds, phase."""
    log_done: bool = False
    """The log was shipped to its end (eof acknowledged)."""
    restored_from_seq: int = 0
    """The checkpoint restored before the command; 0 if none."""
    gang: dict[str, Any] | None = None
    """A gang member's facts (gang.py): epoch, rank, size, launcher, the step done, the reserved ports,
    the latest plan."""
    image_pull: list[int] | None = None
    """[bytes done, bytes total] of the attempt's image pulls; None without an image."""
    egress_denied: int = 0
    """Connections its pod's egress rules refused so far (the supervisor's run/egress.json)."""
    # -- not persisted ---------------------------------------------------------------------------
    acked: bool = False
    terminal_seq: tuple[int, int] | None = None
    """(stream, seq) of the message that reported the end."""
    reported: tuple[Any, ...] | None = None
    supervisor_ended: bool = False

    PERSISTED = ("id", "job", "index", "number", "phase", "reason", "message", "exit_code", "oom_killed",
                 "start_time", "finish_time", "inputs_ready_time", "inputs", "outputs", "stop", "log_done", "restored_from_seq",
                 "gang", "image_pull", "egress_denied")

    @classmethod
    def of(cls, a: agent_pb2.Assignment) -> "Attempt":
        return cls(a.attempt_id, {"project": a.job.project, "name": a.job.name, "uid": a.job.uid}, a.index,
                   a.attempt_number)

    def persisted(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.PERSISTED}
        d["stage"] = self.stage.value
        return d

    @classmethod
    def from_persisted(cls, d: dict[str, Any]) -> "Attempt":
        att = cls(d["id"], **{k: d[k] for k in cls.PERSISTED if k in d and k != "id"})
        att.stage = Stage(d.get("stage", "accepted"))
        att.supervisor_ended = att.stage in (Stage.COLLECTING, Stage.DONE)
        return att

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def live(self) -> bool:
        """Work exists or may start (anything before the end is fixed and stopping is not asked)."""
        return self.stage in (Stage.ACCEPTED, Stage.SUPERVISED)

    def key(self) -> tuple[Any, ...]:
        return (self.phase, self.reason, self.exit_code, len(self.outputs), self.inputs_ready_time, self.start_time,
                (self.gang or {}).get("done"), tuple(self.image_pull or ()), self.egress_denied)

    def fold_pull(self, progress: tuple[int, int] | None) -> bool:
        """Takes the runtime's pull progress; True when it changed (an update is due)."""
        if progress is None or list(progress) == self.image_pull:
            return False
        self.image_pull = list(progress)
        return True

    def update(self, now: float | None = None) -> agent_pb2.AttemptUpdate:
        u = agent_pb2.AttemptUpdate(attempt_id=self.id, phase=PHASES[self.phase], reason=self.reason,
                                    message=self.message, oom_killed=self.oom_killed,
                                    time=timestamp(now if now is not None else time.time()))
        if self.exit_code is not None:
            u.exit_code = self.exit_code
        for name, value in (("start_time", self.start_time), ("finish_time", self.finish_time),
                            ("inputs_ready_time", self.inputs_ready_time)):
            if value is not None:
                getattr(u, name).CopyFrom(timestamp(value))
        if self.image_pull is not None:
            u.image_pull.CopyFrom(agent_pb2.ImagePull(bytes_done=self.image_pull[0], bytes_total=self.image_pull[1]))
        if self.egress_denied:
            u.egress_denied = self.egress_denied
        u.input_sha256.update(self.inputs)
        if self.restored_from_seq:
            u.restored_from_seq = self.restored_from_seq
        for o in self.outputs:
            u.outputs.add(name=o["name"], path=o["path"], uri=o["uri"], sha256=o["sha256"], size_bytes=o["size"],
                          rank=int(o.get("rank") or 0), archive=bool(o.get("archive")))
        if self.gang and self.gang.get("done"):
            g = self.gang
            u.gang.CopyFrom(agent_pb2.GangMemberReport(
                epoch=int(g["epoch"]), done=GangStep(g["done"]).proto, address=g.get("address", ""),
                port=int(g.get("port") or 0), probe_port=int(g.get("probe_port") or 0)))
        return u


@dataclass(frozen=True, slots=True)
class Observed:
    """What a status file says about an attempt, folded with whether its supervisor lives."""

    stage: Stage
    phase: str
    fields: dict[str, Any]
    kill_leftovers: bool = False
    """The supervisor died without finishing: what it started may still run."""


def observe(status: dict[str, Any] | None, alive: bool, now: float | None = None) -> Observed | None:
    """The pure step: supervisor status + liveness → the attempt's next stage and phase (None: no news).
    `now` (the agent clock's Unix seconds) is the finish time of a supervisor found dead.

    Read `alive` before `status`: a supervisor that ends between the two reads has written its final
    status before it let go of its lock.
    """
    if status is None:
        if alive:
            return None
        return Observed(Stage.DONE, L.LOST, {"reason": Reason.AGENT_FAULT, "message": "the attempt's supervisor exited "
                                             "before it started anything"}, kill_leftovers=True)
    phase = str(status.get("phase") or L.SPAWNED)
    fields = {k: status.get(k) for k in ("reason", "message", "exit_code", "oom_killed", "start_time", "finish_time")
              if status.get(k) is not None}
    if phase in TERMINAL:
        if phase == L.SUCCEEDED and status.get("outputs"):
            return Observed(Stage.COLLECTING, L.STOPPING, fields)
        return Observed(Stage.DONE, phase, fields)
    if alive:
        if phase == L.SPAWNED:
            return None
        return Observed(Stage.SUPERVISED, phase, fields)
    return Observed(Stage.DONE, L.LOST, {**fields, "reason": Reason.AGENT_FAULT,
                                         "message": "the attempt's supervisor exited unexpectedly" + (
                                             "" if phase == L.SPAWNED else f" while {phase.lower().replace('_', ' ')}"),
                                         "finish_time": now if now is not None else time.time()},
                    kill_leftovers=True)
