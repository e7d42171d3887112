"""Storage charges: what a Job's checkpoints and outputs above the free inclusion cost
(`status.storage.billedBytes` × the price book's `storageUSDPerGiBMonth` × elapsed / a month of 30 days),
charged at most once per billing period of an hour (issue 12 part 4).

Pure: `decide_storage` reads the Job's accrual record (`Accrual`, kept in the store beside the ledger),
its billed bytes now, the rate and the storage charges already posted, and returns the record to write
and the charge to post. The accrual is exact (not rounded); each charge is what the accrual rounds down
to in whole cents less what was charged before, so storage too small for a cent an hour is still
charged once it adds up, and nothing is charged that has not accrued. The accrual moves once per
period, by the bytes seen then times the time since it last moved (the bytes are taken as constant
over the period). The key is `<job uid>/storage/<period>` (the period the accrual last moved in), so a
retry or a restart posts nothing twice, and the record is written before the charge, so a crash
between the two posts the charge on the next pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any, Mapping, Sequence

from .estimate import CENT
from .ledger import ZERO, Kind, Posting, Request, Segment

STORAGE_PERIOD_S = 3600
"""A storage charge posts at most once per hour (UTC hours from the Unix epoch)."""
MONTH_S = Decimal(30 * 86400)
"""A GiB-month is 30 days: the same hour costs the same in February and in March."""
GIB = Decimal(1024**3)


def period(t: float) -> int:
    return int(t // STORAGE_PERIOD_S)


@dataclass(frozen=True, slots=True)
class Accrual:
    """What a Job's storage has accrued, exactly, up to `time`."""

    time: float
    accrued: Decimal

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "accruedUSD": str(self.accrued)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Accrual:
        return cls(float(doc["time"]), Decimal(doc["accruedUSD"]))


@dataclass(frozen=True, slots=True)
class StorageDecision:
    write: Accrual | None
    """The record to write before the charge (None: unchanged)."""
    post: Request | None
    wake_at: float | None
    """The next period's start, while there is storage to charge."""


def is_storage(p: Posting) -> bool:
    return p.kind is Kind.CHARGE and p.segment is Segment.STORAGE


def accrue(accrual: Accrual, billed_bytes: int, rate: Decimal, now: float) -> Accrual:
    """The accrual at `now`, with `billed_bytes` held since `accrual.time` at `rate` USD per GiB-month."""
    elapsed = Decimal(round(max(now - accrual.time, 0.0) * 1000)) / 1000
    return Accrual(now, accrual.accrued + Decimal(billed_bytes) / GIB * rate * elapsed / MONTH_S)


def decide_storage(uid: str, accrual: Accrual | None, billed_bytes: int, rate: Decimal,
                   postings: Sequence[Posting], now: float) -> StorageDecision:
    """`postings` are the Job's (its storage charges among them)."""
    if accrual is None:  # storage is charged from when it is first seen above the free inclusion
        if billed_bytes > 0 and rate > 0:
            return StorageDecision(Accrual(now, ZERO), None, (period(now) + 1) * STORAGE_PERIOD_S)
        return StorageDecision(None, None, None)
    write = None
    if period(now) > period(accrual.time):
        accrual = write = accrue(accrual, billed_bytes, rate, now)
    charged = sum((p.amount for p in postings if is_storage(p)), ZERO)
    due = accrual.accrued.quantize(CENT, rounding=ROUND_FLOOR) - charged
    key = f"{uid}/storage/{period(accrual.time)}"
    post = None
    if due > 0 and key not in {p.key for p in postings}:
        post = Request(key, Kind.CHARGE, uid, due, Segment.STORAGE, payer=uid)
    wake = (period(now) + 1) * STORAGE_PERIOD_S if billed_bytes > 0 else None
    return StorageDecision(write, post, wake)
