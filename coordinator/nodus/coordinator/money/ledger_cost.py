"""status.cost, a display copy of the ledger: what an object (a Job) has been charged, by segment, and
what its hold still reserves. Pure: it reads the object's postings and the project's accounts; nothing
is ever charged from these figures (spec/job.md `status.cost`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping, Sequence

from ..clock import rfc3339
from .estimate import SECONDS_PER_HOUR, cents
from .ledger import ZERO, Accounts, Kind, Posting, Segment, held

_SEGMENT_FIELDS = {Segment.BOOT: "bootUSD", Segment.RUNNING: "runningUSD", Segment.RESTORE: "restoreUSD",
                   Segment.TEARDOWN: "teardownUSD", Segment.STORAGE: "storageUSD"}
_SHOWN_WHEN_CHARGED = frozenset({Segment.STORAGE})
"""Shown only once something was charged to it (a Job without billed storage shows no storage line)."""


@dataclass(frozen=True, slots=True)
class Cost:
    """One object's cost as the ledger says it."""

    total: Decimal
    """Every charge listed under the object (its own and its attempts')."""
    held: Decimal
    """What the object's hold still reserves."""
    by_segment: Mapping[Segment, Decimal] = field(default_factory=dict)
    limit: Decimal | None = None
    """spec.maxCostUSD, when set."""
    rate: Decimal | None = None
    """USD per hour of its capacity still billing; None when nothing bills."""
    final: bool = False
    """The last charge has posted (every allocation released)."""

    @classmethod
    def of(cls, accounts: Accounts, owner: str, postings: Sequence[Posting], *, limit: Decimal | None = None,
           rate: Decimal | None = None, final: bool = False) -> Cost:
        charges = [p for p in postings if p.kind is Kind.CHARGE and p.owner == owner]
        by_segment: dict[Segment, Decimal] = {}
        for p in charges:
            by_segment[p.segment] = by_segment.get(p.segment, ZERO) + p.amount
        return cls(sum((p.amount for p in charges), ZERO), accounts.balance(held(owner)), by_segment, limit, rate,
                   final)

    def funded_until(self, now: float) -> float | None:
        """When the hold stops paying at the current rate (None when nothing bills)."""
        if self.rate is None or self.rate <= 0:
            return None
        return now + float(self.held / self.rate * SECONDS_PER_HOUR)

    def to_status(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "totalUSD": str(cents(self.total)), "heldUSD": str(cents(self.held)), "final": self.final,
            "bySegment": {name: str(cents(self.by_segment.get(segment, ZERO)))
                          for segment, name in _SEGMENT_FIELDS.items()
                          if segment not in _SHOWN_WHEN_CHARGED or segment in self.by_segment}}
        if self.limit is not None:
            out["limitUSD"] = str(cents(self.limit))
        if self.rate is not None:
            out["rateUSDPerHour"] = str(self.rate)
        until = self.funded_until(now)
        if until is not None:
            out["fundedUntilTime"] = rfc3339(until)
        return out
