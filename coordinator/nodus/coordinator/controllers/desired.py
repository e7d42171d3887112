"""The desired-state diff of one agent stream: what a node should run, against what the stream told it.

Pure: the node's attempts (as the store has them, reduced to `OnNode`) and what the stream said,
knows and saw finish in; the messages to send out. The stream (`agent_session.py`) builds and sends
them, and records what it said.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass


class Told(enum.Enum):
    """What a stream last told the agent about an attempt."""

    ASSIGN = "assign"
    """An Assignment (in FullState or on its own): the agent should run it."""
    SUSPEND = "suspend"
    """A Suspend: checkpoint with its seq, then stop."""
    CANCEL = "cancel"
    """A Cancel: stop it."""


@dataclass(frozen=True, slots=True)
class Said:
    """One message this stream sent about an attempt; a Suspend's seq tells a newer one apart."""

    told: Told
    seq: int = 0


ASSIGNED, CANCELLED = Said(Told.ASSIGN), Said(Told.CANCEL)


@dataclass(frozen=True, slots=True)
class Stop:
    """spec.stop of an attempt: why, and how long the agent waits before it kills."""

    reason: str
    grace_seconds: int = 0
    suspend_seq: int | None = None
    """The checkpoint seq when the stop asks for a checkpoint first (a Suspend); None: a plain Cancel."""


@dataclass(frozen=True, slots=True)
class OnNode:
    """One attempt placed on the node, as far as the diff needs it."""

    attempt_id: str
    terminal: bool = False
    reason: str = ""
    """status.reason ('' when none): a Cancel of an attempt that ended while the agent was away says it."""
    stop: Stop | None = None
    gang: bool = False


class Send(enum.Enum):
    """What one step of the diff sends (or does in the agent's stead)."""

    ASSIGN = "assign"
    """Build and send its Assignment: nothing was said yet."""
    SUSPEND = "suspend"
    """Send a Suspend with `seq`: checkpoint, then stop."""
    CANCEL = "cancel"
    """Send a Cancel with `reason` and `grace_seconds`."""
    SETTLE = "settle"
    """A stop for an attempt the agent never had: end it in the store, as the agent would have reported."""
    PLAN = "plan"
    """A running gang member: send its GangPlan if its step moved."""


@dataclass(frozen=True, slots=True)
class Message:
    """One step of the diff, about one attempt."""

    send: Send
    attempt_id: str
    reason: str = ""
    grace_seconds: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Diff:
    """The messages to send, in order, and what the stream can forget afterwards."""

    messages: tuple[Message, ...]
    unsaid: frozenset[str]
    """Attempts off the node: drop what was said of them (after the messages)."""
    forgotten: frozenset[str]
    """Attempts off the node: drop them from what the agent has and what it reported ended."""


def diff(on_node: Sequence[OnNode], said: Mapping[str, Said], known: Set[str], finished: Set[str]) -> Diff:
    """The messages that bring the agent to the node's desired state. `known`: the attempts the agent
    has (its Hello's and those assigned on this stream); `finished`: those it reported ended."""
    messages: list[Message] = []
    here: set[str] = set()
    for attempt in on_node:
        attempt_id, told, stop = attempt.attempt_id, said.get(attempt.attempt_id), attempt.stop
        here.add(attempt_id)
        if attempt.terminal:
            if told == ASSIGNED and attempt_id not in finished:
                # Ended without the agent saying so (Lost while it was away): stop it there.
                messages.append(Message(Send.CANCEL, attempt_id, attempt.reason or "Unassigned"))
        elif stop is not None:
            if attempt_id not in known:
                messages.append(Message(Send.SETTLE, attempt_id, stop.reason))
            elif attempt_id not in finished and stop.suspend_seq is not None:
                if told not in (Said(Told.SUSPEND, stop.suspend_seq), CANCELLED):
                    messages.append(Message(Send.SUSPEND, attempt_id, stop.reason, stop.grace_seconds,
                                            stop.suspend_seq))
            elif told != CANCELLED and attempt_id not in finished:
                messages.append(Message(Send.CANCEL, attempt_id, stop.reason, stop.grace_seconds))
        elif told is None:
            messages.append(Message(Send.ASSIGN, attempt_id))
        elif told == ASSIGNED and attempt.gang and attempt_id not in finished:
            messages.append(Message(Send.PLAN, attempt_id))
    for attempt_id, told in said.items():
        if attempt_id not in here and told == ASSIGNED and attempt_id not in finished:
            messages.append(Message(Send.CANCEL, attempt_id, "Unassigned"))  # deleted, or moved off this node
    return Diff(tuple(messages), frozenset(said.keys() - here), frozenset((known | finished) - here))
