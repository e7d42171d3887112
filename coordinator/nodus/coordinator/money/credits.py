"""Prepaid credits of a project, in the words of its callers: operators grant, customers read their
balance, and the coordinator takes, renews and releases holds and posts charges (ledger.py books each
as one posting; ledger_store.py keeps them).

The idempotency keys are chosen here, from what names the request uniquely and survives a retry:
a grant by the request id its caller chose (a client that retries after a timeout sends the same
one), a charge by `<object>/charge/<increment n>` (ledger_charges.py says why without the segment), a hold by `<object>/hold/<n>`.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ..clock import rfc3339
from ..errors import NodusError, required
from .ledger import Accounts, Kind, Posting, Request, Segment, amount_of, insufficient, spent
from .ledger_charges import Allocation, increments_due
from .ledger_store import Ledger

MAX_REQUEST_ID = 128


@dataclass(frozen=True, slots=True)
class Balance:
    """What `nodus credits` shows."""

    project: str
    available: Decimal
    """Credits no hold reserves: what new work can take."""
    held: Decimal
    """Reserved by holds of running work."""
    spent_this_month: Decimal
    month: str
    """The calendar month (UTC, "2026-12") `spent_this_month` counts."""
    granted: Decimal
    """Every grant ever, for reconciling with invoices."""

    @classmethod
    def of(cls, accounts: Accounts, month: str) -> Balance:
        return cls(accounts.project, accounts.available, accounts.held, accounts.spent_in(month), month,
                   accounts.granted)


def first_hold_refusal(accounts: Accounts, hold: Decimal, what: str) -> dict[str, str] | None:
    """The InsufficientCredits entry of status.estimate.blockingReasons when the project's available
    credits cannot take `hold`, the first hold of `what` (None when they can): admission shows it on
    a dry run and refuses a real create with the same words."""
    if hold <= accounts.available:
        return None
    refusal = insufficient(accounts.project, hold, accounts.available, f"the first hold of {what}")
    return {"code": refusal.reason, "message": refusal.message, "fix": refusal.effective_fix}


def _request_id(request_id: str) -> str:
    if not request_id:
        raise NodusError("Invalid", "requestId: Required value: a grant names a request id so a retry grants once",
                         causes=(required("requestId", "a grant names a request id so a retry grants once"),),
                         fix="send a unique requestId (nodus credits grant makes one) and the same one on retry")
    if len(request_id) > MAX_REQUEST_ID or not request_id.isprintable() or " " in request_id:
        raise NodusError("Invalid", f"requestId: Invalid value: {request_id[:40]!r}: must be at most "
                         f"{MAX_REQUEST_ID} printable characters without spaces")
    return request_id


class Credits:
    """Credits of every project, over the ledger in the store."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def balance(self, project: str, now: str) -> Balance:
        return Balance.of(await self.ledger.accounts(project), now[:7])

    async def grant(self, project: str, amount: str, request_id: str, now: str, note: str = "") -> tuple[Posting, bool]:
        """Adds `amount` (a decimal string of USD) once per `request_id`; (posting, False) on a replay."""
        request = Request(f"grant/{_request_id(request_id)}", Kind.GRANT, amount=amount_of(amount), note=note)
        return await self.ledger.post(project, request, now)

    async def take_hold(self, project: str, obj: str, n: int, amount: Decimal, now: str) -> Posting:
        """Reserves `amount` for `obj` (hold number `n` of it), or InsufficientCredits with the amounts."""
        return (await self.ledger.post(project, Request(f"{obj}/hold/{n}", Kind.HOLD, obj, amount), now))[0]

    async def renew_hold(self, project: str, obj: str, n: int, amount: Decimal, now: str) -> Posting:
        """Grows `obj`'s hold by `amount` (renewal number `n`), or InsufficientCredits."""
        return (await self.ledger.post(project, Request(f"{obj}/renew/{n}", Kind.RENEW, obj, amount), now))[0]

    async def release_hold(self, project: str, obj: str, n: int, now: str) -> Posting:
        """Returns what `obj`'s hold still reserves to the available credits."""
        return (await self.ledger.post(project, Request(f"{obj}/release/{n}", Kind.RELEASE, obj), now))[0]

    async def charge(self, project: str, obj: str, segment: Segment, increment: int, amount: Decimal,
                     now: str, payer: str = "") -> Posting:
        """Charges `amount` for increment `increment` of `obj`: from the hold of `payer` (its own when
        empty; a Job's for its attempts), the rest from credits."""
        request = Request(f"{obj}/charge/{increment}", Kind.CHARGE, obj, amount, segment, payer=payer)
        return (await self.ledger.post(project, request, now))[0]

    async def settle(self, project: str, allocation: Allocation, now: float, payer: str = "") -> Decimal:
        """Posts every increment `allocation` owes by `now` (those posted before are not posted again)
        and returns what it has been charged; InsufficientCredits when the credits cannot cover one."""
        for increment in increments_due(allocation, now):
            await self.charge(project, allocation.uid, increment.segment, increment.n, increment.amount,
                              rfc3339(now), payer)
        return (await self.ledger.accounts(project)).balance(spent(allocation.uid))
