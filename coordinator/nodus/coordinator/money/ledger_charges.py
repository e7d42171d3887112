"""What an allocation owes, per billing increment and segment, read from its times alone.

Level-triggered: `increments_due(allocation, now)` depends only on the allocation's recorded times
and `now`, so a money controller can run it on every reconcile, after any restart, and post what it
returns; the ledger books each increment once by its key. While the node is held an increment is
charged once it has ended (the hold covers the one in progress); at release the increment in progress
is charged too (every started increment is billed), the minimum charge falls on the first increments
(`Tariff.charged_through`), and the increments sum to `Tariff.charge(released − allocated)` to the
cent. This holds as long as a release is recorded within one increment of happening (an agent's
lease is shorter): what was charged before the record is then never more than the release owes.

The key is `<allocation uid>/charge/<n>`, without the segment: a segment is named by the times known
when the increment is first charged (the agent may report the program's start a moment late), and
the first naming wins. A key with the segment in it would let a late report charge the same
increment twice, under two names.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from .estimate import Tariff
from .ledger import Segment


@dataclass(frozen=True, slots=True)
class Allocation:
    """One node held for one attempt, by the times its Attempt records (Unix seconds)."""

    uid: str
    """The attempt's uid (an allocation per attempt and node)."""
    tariff: Tariff
    """The offering's tariff frozen at placement (status.placement's rate)."""
    allocate_time: float
    """Billing starts: the node was allocated to the attempt."""
    start_time: float | None = None
    """The program started (status.startTime); until then the time is Boot."""
    stop_time: float | None = None
    """The program stopped or was told to; after it the time is Teardown."""
    release_time: float | None = None
    """The node was released; billing ends."""
    restore: bool = False
    """A replacement bringing state back: its boot time is Restore, not Boot."""
    covered_from: float | None = None
    """Time from here on was lost to a Nodus fault (the node or agent failed; the progress since the
    last checkpoint is gone): increments that begin at or after it are not charged (coveredByNodus)."""
    covered_until: float | None = None
    """A replacement for an attempt a Nodus fault ended: increments that begin before it (its restore)
    are not charged."""

    def segment_at(self, t: float) -> Segment:
        if self.start_time is None or t < self.start_time:
            return Segment.RESTORE if self.restore else Segment.BOOT
        if self.stop_time is None or t < self.stop_time:
            return Segment.RUNNING
        return Segment.TEARDOWN

    def billed_increments(self, now: float) -> int:
        """Increments ended by `now`; once released, every increment the allocation lasted into."""
        if now < self.allocate_time:
            return 0
        increment = self.tariff.billing_increment_s
        if self.release_time is not None and self.release_time <= now:
            lasted = _seconds(self.release_time - self.allocate_time) / increment
            billed = int(lasted.to_integral_value(rounding=ROUND_CEILING))
            # a node released at once still owes its minimum charge, which the first increment carries
            return max(billed, 1 if self.tariff.minimum_charge_s > 0 else 0)
        return int((_seconds(now - self.allocate_time) / increment).to_integral_value(rounding=ROUND_FLOOR))

    def covered(self, begins: float) -> bool:
        """Whether the increment that begins at `begins` is Nodus's to pay (coveredByNodus)."""
        return (self.covered_from is not None and begins >= self.covered_from) or (
            self.covered_until is not None and begins < self.covered_until)


def _seconds(elapsed: float) -> Decimal:
    """Times are kept to the millisecond (clock.rfc3339), so a difference is counted in whole ones: a
    float difference such as 119.99999999 must not start another increment."""
    return Decimal(round(elapsed * 1000)) / 1000


@dataclass(frozen=True, slots=True)
class Increment:
    """The charge for one billing increment."""

    n: int
    """From 1."""
    segment: Segment
    amount: Decimal

    def key(self, uid: str) -> str:
        return f"{uid}/charge/{self.n}"


def increments_due(allocation: Allocation, now: float) -> list[Increment]:
    """Every increment charged by `now`, each with its amount (the difference of what is charged
    through it and through the one before); increments the minimum charge paid for, and those Nodus
    covers (`Allocation.covered`), are left out."""
    tariff, out = allocation.tariff, []
    for n in range(1, allocation.billed_increments(now) + 1):
        amount = tariff.charged_through(n) - tariff.charged_through(n - 1)
        begins = allocation.allocate_time + (n - 1) * tariff.billing_increment_s
        if amount > 0 and not allocation.covered(begins):
            out.append(Increment(n, allocation.segment_at(begins), amount))
    return out


def covered_segments(allocation: Allocation, now: float) -> set[Segment]:
    """The segments of the increments by `now` that Nodus pays for instead of charging them."""
    increment = allocation.tariff.billing_increment_s
    out = set()
    for n in range(1, allocation.billed_increments(now) + 1):
        begins = allocation.allocate_time + (n - 1) * increment
        if allocation.covered(begins):
            out.add(allocation.segment_at(begins))
    return out


def charged_by(allocation: Allocation, now: float) -> Decimal:
    """What the allocation has been charged by `now` (what status.cost.totalUSD shows for it)."""
    return sum((i.amount for i in increments_due(allocation, now)), Decimal("0.00"))
