"""What the agent does about its attempts when something happens: events in, actions out. Pure.

reconcile.py decides about what the coordinator wants (assignments, cancels); this module decides
about time and acknowledgements: a lease that ran out stops every live attempt, an ack lets
reported ends be forgotten, a renewal moves the lease (and says whether state.json must hear of
it). Nothing here reads a clock, a file or a socket: `now` comes in the event, the attempts as
`AttemptFacts`, and the daemon performs the actions (daemon.py `_apply`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from . import layout as L
from .attempts import Stage
from .reasons import Reason
from .reconcile import Stop

LEASE_EXPIRED = Reason.LEASE_EXPIRED
LEASE_EXPIRED_GRACE = 5.0
"""At most this many seconds of grace once the lease is gone: a replacement may already run elsewhere."""
PROGRESS_MIN_INTERVAL = 0.5
"""At most two Progress messages a second per attempt."""


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """The facts about one of this agent's attempts that the decisions read: its stage, whether a stop
    was asked, whether its end was reported and acknowledged, whether its log is shipped. (Not the
    coordinator's AttemptView, which is a stored Attempt decoded; the agent never sees that.)"""

    id: str
    stage: Stage
    stopping: bool = False
    """A stop was asked for."""
    terminal_seq: tuple[int, int] | None = None
    """(stream, seq) of the message that reported its end."""
    acked: bool = False
    log_done: bool = False

    @property
    def live(self) -> bool:
        return self.stage in (Stage.ACCEPTED, Stage.SUPERVISED)


# -- events ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tick:
    """The watch loop's beat (every poll interval, or woken by a supervisor); `now` is monotonic."""

    now: float


@dataclass(frozen=True, slots=True)
class Acked:
    """The coordinator acknowledged every message up to `seq` of stream `stream_id`."""

    stream_id: int
    seq: int


@dataclass(frozen=True, slots=True)
class LogShipped:
    """An attempt's log reached the blob store to its end (or cannot be shipped at all)."""

    attempt_id: str


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """The coordinator renewed the node's lease for `valid_for` seconds at monotonic `now`."""

    now: float
    valid_for: float


Event = Tick | Acked | LogShipped | LeaseRenewed


# -- actions ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MarkAcked:
    """The end of this attempt was acknowledged: it is never reported again."""

    attempt_id: str


@dataclass(frozen=True, slots=True)
class Forget:
    """The attempt's end is acknowledged and its log shipped: drop it, keep a tombstone, remove its files."""

    attempt_id: str


@dataclass(frozen=True, slots=True)
class MoveLease:
    deadline: float
    """Monotonic."""
    persist: bool
    """The deadline moved enough that state.json should record it (a restart restores the lease)."""


Action = Stop | MarkAcked | Forget | MoveLease


def decide(event: Event, attempts: Sequence[AttemptFacts], lease_deadline: float | None,
           stop_grace: float) -> list[Action]:
    """The actions for one event, given the attempts and the lease as they are now."""
    if isinstance(event, Tick):
        return _lease_expiry(event.now, attempts, lease_deadline, stop_grace) + _forgettable(attempts)
    if isinstance(event, Acked):
        acked = [MarkAcked(a.id) for a in attempts if not a.acked and a.terminal_seq is not None
                 and a.terminal_seq[0] == event.stream_id and a.terminal_seq[1] <= event.seq]
        now_acked = {m.attempt_id for m in acked}
        return [*acked, *_forgettable(attempts, now_acked)]
    if isinstance(event, LogShipped):
        return _forgettable(attempts, shipped={event.attempt_id})
    return _renewal(event, lease_deadline)


def _lease_expiry(now: float, attempts: Iterable[AttemptFacts], lease_deadline: float | None,
                  stop_grace: float) -> list[Action]:
    """Without a renewal for the lease's duration the coordinator counts this node lost and replaces
    its attempts: stop every live one that is not stopping already."""
    if lease_deadline is None or now <= lease_deadline:
        return []
    grace = min(stop_grace, LEASE_EXPIRED_GRACE)
    return [Stop(a.id, LEASE_EXPIRED, grace, L.LOST) for a in attempts if a.live and not a.stopping]


def _forgettable(attempts: Iterable[AttemptFacts], acked: frozenset[str] | set[str] = frozenset(),
                 shipped: frozenset[str] | set[str] = frozenset()) -> list[Action]:
    return [Forget(a.id) for a in attempts if a.stage == Stage.DONE and (a.acked or a.id in acked)
            and (a.log_done or a.id in shipped)]


def _renewal(event: LeaseRenewed, before: float | None) -> list[Action]:
    if event.valid_for <= 0:
        return []
    deadline = event.now + event.valid_for
    moved = before is None or abs(deadline - before) > max(1.0, event.valid_for / 4)
    return [MoveLease(deadline, persist=moved)]


CHECKPOINTING = "CHECKPOINTING"
"""The phase shown while a checkpoint of a running attempt is taken (the agent's, not the supervisor's)."""


def shown_phase(observed: str, checkpointing: bool) -> str:
    """The phase to report for a supervised attempt: Checkpointing while a checkpoint of a running
    attempt is taken (it keeps running; the program is held only for the local copy)."""
    return CHECKPOINTING if observed == L.RUNNING and checkpointing else observed


def progress_due(now: float, last_sent: float, changed: bool, force: bool) -> bool:
    """Whether an attempt's progress goes out now (`force`: its end, which is never held back)."""
    return changed and (force or now - last_sent >= PROGRESS_MIN_INTERVAL)
