"""Desired state (FullState, Assignment, Cancel) against what the agent runs → actions. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from nodus.v1 import agent_pb2

from .reasons import Reason

UNASSIGNED = Reason.UNASSIGNED


@dataclass(frozen=True, slots=True)
class Start:
    assignment: agent_pb2.Assignment


@dataclass(frozen=True, slots=True)
class Stop:
    attempt_id: str
    reason: str
    grace: float
    phase: str = "CANCELLED"


@dataclass(frozen=True, slots=True)
class Resend:
    """An assignment for an attempt this node already finished and forgot: report the end again."""

    attempt_id: str


Action = Start | Stop | Resend


def assignment(a: agent_pb2.Assignment, known: Collection[str], finished: Collection[str]) -> list[Action]:
    if a.attempt_id in known:
        return []  # a repeated assignment is a no-op
    if a.attempt_id in finished:
        return [Resend(a.attempt_id)]
    return [Start(a)]


def cancel(c: agent_pb2.Cancel, live: Collection[str], default_grace: float) -> list[Action]:
    if c.attempt_id not in live:
        return []
    grace = float(c.grace_seconds) if c.grace_seconds > 0 else default_grace
    return [Stop(c.attempt_id, c.reason or Reason.CANCELLED, grace)]


def full_state(fs: agent_pb2.FullState, known: Collection[str], live: Collection[str],
               finished: Collection[str], default_grace: float) -> list[Action]:
    """Start what is missing, stop what is cancelled, stop (Unassigned) what nobody mentions."""
    actions: list[Action] = []
    wanted: Mapping[str, agent_pb2.Assignment] = {a.attempt_id: a for a in fs.assignments}
    cancelled = {c.attempt_id: c for c in fs.cancels}
    for a in fs.assignments:
        if a.attempt_id not in cancelled:
            actions += assignment(a, known, finished)
    for c in fs.cancels:
        actions += cancel(c, live, default_grace)
    for attempt_id in sorted(live):
        if attempt_id not in wanted and attempt_id not in cancelled:
            actions.append(Stop(attempt_id, UNASSIGNED, default_grace))
    return actions
