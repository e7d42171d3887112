"""The desired state of one agent stream: what a node should run, against what the agent has.

Pure, in two steps. `full_state`: when the stream opens, the node's attempts (as the store has them,
reduced to `OnNode`) and what the agent's Hello reported; what FullState says of each. `diff`: from
then on, the node's attempts and what the stream said, knows and saw finish; the messages to send.
The stream (`agent_session.py`) builds and sends them, and records what it said.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from .reasons import AttemptReason


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
                messages.append(Message(Send.CANCEL, attempt_id, attempt.reason or AttemptReason.UNASSIGNED))
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
            # Deleted, or moved off this node.
            messages.append(Message(Send.CANCEL, attempt_id, AttemptReason.UNASSIGNED))
    return Diff(tuple(messages), frozenset(said.keys() - here), frozenset((known | finished) - here))


# -- FullState, when the stream opens ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InHello:
    """One attempt the agent's Hello reported."""

    attempt_id: str
    live: bool
    """Its reported phase has not ended (False for an ended phase, or one this coordinator does not know)."""


class Resync(enum.Enum):
    """What FullState does about one attempt after the agent (re)connects."""

    ASSIGN = "assign"
    """Its Assignment goes in FullState: the agent starts it, or keeps running the one it has."""
    KEEP_FOR_SUSPEND = "keep-for-suspend"
    """It is stopping with a checkpoint first and the agent has it: its Assignment goes in FullState so
    it keeps running, and the Suspend (checkpoint, then stop) follows from the first `diff`."""
    CANCEL = "cancel"
    """A Cancel goes in FullState with `reason` and `grace_seconds`."""
    SETTLE = "settle"
    """It is stopped and the agent does not have it: it ends in the store, as the agent would have reported."""


@dataclass(frozen=True, slots=True)
class FullStateEntry:
    """What FullState does about one attempt."""

    resync: Resync
    attempt_id: str
    reason: str = ""
    grace_seconds: int = 0
    reported: bool = False
    """The Hello named it: its Assignment is a copy of what already runs there."""


def full_state(on_node: Sequence[OnNode], hello: Sequence[InHello]) -> tuple[FullStateEntry, ...]:
    """FullState's content, in order: the node's attempts first, then what the Hello reported that
    this node should no longer run. Everything the Hello named is what the agent has."""
    reported = {h.attempt_id: h for h in hello}
    entries: list[FullStateEntry] = []
    wanted: set[str] = set()
    for attempt in on_node:
        attempt_id, stop, has_it = attempt.attempt_id, attempt.stop, attempt.attempt_id in reported
        if attempt.terminal:
            continue
        wanted.add(attempt_id)
        if stop is None:
            entries.append(FullStateEntry(Resync.ASSIGN, attempt_id, reported=has_it))
        elif not has_it:
            entries.append(FullStateEntry(Resync.SETTLE, attempt_id, stop.reason))
        elif stop.suspend_seq is not None:
            entries.append(FullStateEntry(Resync.KEEP_FOR_SUSPEND, attempt_id, reported=True))
        else:
            entries.append(FullStateEntry(Resync.CANCEL, attempt_id, stop.reason, stop.grace_seconds))
    ended = {a.attempt_id: a for a in on_node if a.terminal}
    for attempt_id, seen in reported.items():
        if attempt_id in wanted or not seen.live:
            continue
        # Ended in the store while the agent was away (NodeLost: replaced) says why; anything else is
        # no longer this node's.
        here = ended.get(attempt_id)
        reason = (here.reason if here else "") or AttemptReason.UNASSIGNED
        entries.append(FullStateEntry(Resync.CANCEL, attempt_id, reason))
    return tuple(entries)
