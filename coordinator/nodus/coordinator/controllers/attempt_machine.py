"""The Attempt's life in one place: its phases, the events that move it, and the legal moves.

`transition(attempt, event)` is pure: the stored Attempt and one event in, the attempt's next status
out, or a `Refusal` that says why the event cannot move it (the writer logs or ignores it; nothing is
written). Every writer of an Attempt's phase goes through it, so the table below is the whole story:

    event               writer                                 moves
    Created             controllers/job_controller.new_attempt  (nothing) -> Pending
    Placed              controllers/placement.bind             Pending -> Provisioning
    Reported            controllers/attempts.fold_report        forward, Checkpointing <-> Running, -> any end
    NodeLost            controllers/lease.lost                 non-terminal -> Lost
    StoppedUnplaced     controllers/job_controller.stop        non-terminal -> Cancelled
    AssignmentRefused   agent_session (an Assignment cannot be built) non-terminal -> Failed

Terminal phases (Succeeded, Failed, Lost, Cancelled) are never left. The proto's AttemptPhase is
mapped by name (ATTEMPT_PHASE_<member name>), never by number (docs/adr/0017-attempt-state-machine.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union, cast

from nodus.v1 import common_pb2

from ..clock import parse, rfc3339
from .reasons import LOST_CAPACITY_STOPS as LOST_CAPACITY_STOPS  # re-exported: the stops that end Lost
from .reasons import REASON_CLASSES as REASON_CLASSES
from .reasons import AttemptReason


class AttemptPhase(str, enum.Enum):
    """Where one attempt (one run of one Job index) stands; the words of common.proto's AttemptPhase."""

    PENDING = "Pending"
    """Created by the job controller, not yet placed on a node."""
    PROVISIONING = "Provisioning"
    """Placed on a node; the assignment is on its way to the agent, or the agent reserves capacity."""
    MATERIALIZING = "Materializing"
    """The agent fetches the image, code, inputs and volumes, and restores a checkpoint."""
    INITIALIZING = "Initializing"
    """The init command runs."""
    STARTING_SIDECARS = "StartingSidecars"
    """Sidecars start and become ready."""
    RUNNING = "Running"
    """The main command runs."""
    CHECKPOINTING = "Checkpointing"
    """A checkpoint is being taken while the program keeps running."""
    STOPPING = "Stopping"
    """The program was asked to stop or has exited; outputs are collected."""
    SUCCEEDED = "Succeeded"
    """Terminal: exit 0 and every output committed."""
    FAILED = "Failed"
    """Terminal: a customer failure (non-zero exit, OOM, init command, sidecar); counts against backoffLimit."""
    LOST = "Lost"
    """Terminal: lost capacity (lease expired, drain, preemption, agent fault); counts against maxAttempts."""
    CANCELLED = "Cancelled"
    """Terminal: stopped on purpose (cancel, suspend, deadline); counts against nothing."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @classmethod
    def parse(cls, value: object) -> "AttemptPhase":
        """The stored word; an absent phase is Pending (an attempt is created before anything happens)."""
        try:
            return cls(value) if value else cls.PENDING
        except ValueError:
            return cls.PENDING

    @property
    def proto(self) -> common_pb2.AttemptPhase:
        """The common.proto AttemptPhase member, found by name (the stubs type Value() as a plain int)."""
        return cast(common_pb2.AttemptPhase, common_pb2.AttemptPhase.Value(PROTO_PREFIX + self.name))

    @classmethod
    def of_proto(cls, number: int) -> "AttemptPhase | None":
        """The phase a common.proto AttemptPhase number names; None for UNSPECIFIED or an unknown number."""
        try:
            name = common_pb2.AttemptPhase.Name(number)
        except ValueError:
            return None
        return cls.__members__.get(name[len(PROTO_PREFIX):])


PROTO_PREFIX = "ATTEMPT_PHASE_"
TERMINAL = frozenset({AttemptPhase.SUCCEEDED, AttemptPhase.FAILED, AttemptPhase.LOST, AttemptPhase.CANCELLED})


PHASE_NUMBERS: Mapping[AttemptPhase, common_pb2.AttemptPhase] = {phase: phase.proto for phase in AttemptPhase}
"""Each phase's common.proto number, derived by name (for messages that carry many phases)."""


def terminal_phases() -> frozenset[AttemptPhase]:
    return TERMINAL


_P = AttemptPhase
_ENDS = TERMINAL
LEGAL: Mapping[AttemptPhase, frozenset[AttemptPhase]] = {
    # The same phase again is legal: a report may add facts (outputs, a gang step) without moving.
    _P.PENDING: frozenset({_P.PENDING, _P.PROVISIONING, _P.MATERIALIZING, _P.INITIALIZING, _P.STARTING_SIDECARS,
                           _P.RUNNING, _P.CHECKPOINTING, _P.STOPPING}) | _ENDS,
    _P.PROVISIONING: frozenset({_P.PROVISIONING, _P.MATERIALIZING, _P.INITIALIZING, _P.STARTING_SIDECARS,
                                _P.RUNNING, _P.CHECKPOINTING, _P.STOPPING}) | _ENDS,
    _P.MATERIALIZING: frozenset({_P.MATERIALIZING, _P.INITIALIZING, _P.STARTING_SIDECARS, _P.RUNNING,
                                 _P.CHECKPOINTING, _P.STOPPING}) | _ENDS,
    _P.INITIALIZING: frozenset({_P.INITIALIZING, _P.STARTING_SIDECARS, _P.RUNNING, _P.CHECKPOINTING,
                                _P.STOPPING}) | _ENDS,
    _P.STARTING_SIDECARS: frozenset({_P.STARTING_SIDECARS, _P.RUNNING, _P.CHECKPOINTING, _P.STOPPING}) | _ENDS,
    _P.RUNNING: frozenset({_P.RUNNING, _P.CHECKPOINTING, _P.STOPPING}) | _ENDS,
    _P.CHECKPOINTING: frozenset({_P.CHECKPOINTING, _P.RUNNING, _P.STOPPING}) | _ENDS,
    _P.STOPPING: frozenset({_P.STOPPING}) | _ENDS,
    _P.SUCCEEDED: frozenset(),
    _P.FAILED: frozenset(),
    _P.LOST: frozenset(),
    _P.CANCELLED: frozenset(),
}
"""Every legal (from, to) pair: an agent may skip steps but never go back, except Checkpointing -> Running."""

def legal(current: AttemptPhase, proposed: AttemptPhase) -> bool:
    return proposed in LEGAL[current]


# -- events ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Created:
    """The Job controller creates the attempt (its first status)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """The scheduler bound the attempt to a node."""

    now: float
    explain: str = ""
    """The scheduler's explanation (status.placement.explain)."""


@dataclass(frozen=True, slots=True)
class Reported:
    """The node's agent reported the attempt (an AttemptUpdate), already folded into a full status by
    `attempts.fold_report`; the machine decides whether the move it makes is legal."""

    phase: AttemptPhase
    status: Mapping[str, Any]
    """The status the report's facts give (phase, reason, times, outputs …)."""
    time: float | None = None
    """Agent clock when observed: orders reports from one agent."""


@dataclass(frozen=True, slots=True)
class NodeLost:
    """The attempt's node stopped renewing its lease."""

    node: str
    now: float


@dataclass(frozen=True, slots=True)
class StoppedUnplaced:
    """A stop for an attempt no agent has (not placed yet): it ends Cancelled at once."""

    reason: str
    now: float


@dataclass(frozen=True, slots=True)
class AssignmentRefused:
    """The attempt's Assignment cannot be built (a missing Secret, a bad reference): it fails."""

    reason: str
    message: str
    now: float


Event = Union[Created, Placed, Reported, NodeLost, StoppedUnplaced, AssignmentRefused]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an event cannot move the attempt; nothing is written."""

    current: AttemptPhase
    event: str
    reason: str

    def __str__(self) -> str:
        return f"{self.event} refused in phase {self.current.value}: {self.reason}"


# -- the transition ---------------------------------------------------------------------------------------

def phase_of(attempt: Mapping[str, Any]) -> AttemptPhase:
    return AttemptPhase.parse((attempt.get("status") or {}).get("phase"))


def _created(status: dict[str, Any], event: Created) -> tuple[AttemptPhase, dict[str, Any]]:
    return AttemptPhase.PENDING, {**status, "phase": AttemptPhase.PENDING.value}


def _placed(status: dict[str, Any], event: Placed) -> tuple[AttemptPhase, dict[str, Any]]:
    out = {k: v for k, v in status.items() if k not in ("reason", "message")}
    out.update(phase=AttemptPhase.PROVISIONING.value, provisioningTime=rfc3339(event.now),
               placement={"explain": event.explain})
    return AttemptPhase.PROVISIONING, out


def _reported(status: dict[str, Any], event: Reported) -> tuple[AttemptPhase, dict[str, Any]]:
    return event.phase, {**event.status, "phase": event.phase.value}


def _node_lost(status: dict[str, Any], event: NodeLost) -> tuple[AttemptPhase, dict[str, Any]]:
    now = rfc3339(event.now)
    return AttemptPhase.LOST, {**status, "phase": AttemptPhase.LOST.value, "reason": AttemptReason.NODE_LOST,
                               "message": f'node "{event.node}" stopped renewing its lease', "lostTime": now,
                               "finishTime": now}


def _stopped_unplaced(status: dict[str, Any], event: StoppedUnplaced) -> tuple[AttemptPhase, dict[str, Any]]:
    return AttemptPhase.CANCELLED, {**status, "phase": AttemptPhase.CANCELLED.value, "reason": event.reason,
                                    "finishTime": rfc3339(event.now)}


def _assignment_refused(status: dict[str, Any], event: AssignmentRefused) -> tuple[AttemptPhase, dict[str, Any]]:
    return AttemptPhase.FAILED, {**status, "phase": AttemptPhase.FAILED.value, "reason": event.reason,
                                 "message": event.message, "finishTime": rfc3339(event.now)}


_MOVES: dict[type, Callable[[dict[str, Any], Any], tuple[AttemptPhase, dict[str, Any]]]] = {
    Created: _created, Placed: _placed, Reported: _reported, NodeLost: _node_lost,
    StoppedUnplaced: _stopped_unplaced, AssignmentRefused: _assignment_refused,
}


def transition(attempt: Mapping[str, Any], event: Event) -> dict[str, Any] | Refusal:
    """The attempt's next status after `event`, or a Refusal saying why the event cannot move it."""
    status = dict(attempt.get("status") or {})
    current = AttemptPhase.parse(status.get("phase"))
    name = type(event).__name__
    if isinstance(event, Created):
        if status.get("phase"):
            return Refusal(current, name, "the attempt already has a phase")
    elif current.terminal:
        return Refusal(current, name, "terminal phases are never left")
    if isinstance(event, Reported):
        seen = parse(status.get("reportTime"))
        if event.time is not None and seen is not None and event.time < seen:
            return Refusal(current, name, "older than the latest report (a resend from before a reconnect)")
    if isinstance(event, NodeLost) and (attempt.get("spec") or {}).get("node") != event.node:
        return Refusal(current, name, f'the attempt is not on node "{event.node}"')
    if isinstance(event, StoppedUnplaced) and (attempt.get("spec") or {}).get("node"):
        return Refusal(current, name, "the attempt is placed: its agent stops it (spec.stop)")
    proposed, out = _MOVES[type(event)](status, event)
    if not isinstance(event, Created) and not legal(current, proposed):
        return Refusal(current, name, f"{current.value} -> {proposed.value} is not a legal transition")
    return out
