"""The money controller's decision: from (a Job's priced attempts, its ledger, now) to the postings
that bring the ledger up to date and whether money lets the Job go on running.

Pure and level-triggered, like `job.decide`: it reads the whole picture every time and returns only
what is missing, so running it again on its own result posts nothing. Every posting it returns is
keyed (ledger.py), so a replay after a crash, or a second coordinator deciding the same thing, books
nothing twice. `billing_controller.py` posts what it says and writes the display copy.

A Job's hold (`held/<job uid>`) pays for its attempts' charges:

- the first hold is taken by placement before it binds an attempt to a priced node (`first_hold`),
  so no money is spent before a hold covers it;
- charges post per billing increment of each allocation (ledger_charges.py: Boot, Running, Restore,
  Teardown by the attempt's times, the minimum charge on the first increments);
- the hold is renewed as it is used: while capacity bills and what is held covers less than half of
  the next HOLD_AHEAD_S (money/holds.py), it grows back to cover all of it (never beyond what maxCostUSD leaves);
- once no attempt of the Job is live, what is still held goes back to the project.

Money stops a Job through its `Funded` condition (the Job controller suspends a Running Job whose
Funded is False, through its checkpoint, and resumes it when Funded turns True):

- MaxCostReached: what it has spent, plus its next increment and one more for a final checkpoint and
  teardown, would pass maxCostUSD. It stays so until maxCostUSD is raised past what a new start needs.
- InsufficientCredits: the project's credits cannot renew the hold. `fundedUntil` (and stopByTime)
  is when what is held runs out at the current rate; a grant that covers a new hold turns it True.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from decimal import ROUND_FLOOR, Decimal
from typing import Callable, Sequence

from ..clock import parse
from ..money.budgets import Room, exhausted
from ..money.estimate import SECONDS_PER_HOUR
from ..money.holds import ahead, first_hold, restart_need, step
from ..money.ledger import ZERO, Accounts, Kind, Posting, Request, Segment, held
from ..money.ledger_charges import Allocation, covered_segments, increments_due
from .reasons import AttemptReason
from .attempt_machine import AttemptPhase
from .views import AttemptView

UNFUNDED_RECHECK_S = 5.0
"""How often an unfunded Job looks at its project's credits again (a grant is not a Job event)."""


class Stop(enum.Enum):
    """Why money stops a Job (the reason of its Funded condition when False)."""

    NONE = ""
    MAX_COST = AttemptReason.MAX_COST_REACHED.value
    CREDITS = AttemptReason.INSUFFICIENT_CREDITS.value


@dataclass(frozen=True, slots=True)
class Bill:
    """What the decision reads of one Job."""

    uid: str
    project: str
    max_cost: Decimal | None
    """spec.maxCostUSD (None: no cap)."""
    allocations: tuple[Allocation, ...]
    """Every attempt of the Job that was placed on priced capacity (released ones included)."""
    active: bool
    """Some attempt of the Job is not finished (placed or waiting): its hold may still be needed."""
    stopped: Stop = Stop.NONE
    """Why money stopped the Job before (its Funded condition), so a stop holds until it is lifted."""
    rooms: tuple[Room, ...] = ()
    """The room each Budget the Job counts towards leaves this month (budgets.rooms, read before this
    pass's postings): a renewal and a new start must fit them as well as the credits."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether money lets the Job run, and in what words."""

    stop: Stop
    message: str = ""
    funded_until: float | None = None
    """While capacity bills: when what is held runs out at the current rate."""


@dataclass(frozen=True, slots=True)
class BillingDecision:
    posts: tuple[Request, ...]
    """In order: charges, then a renewal or a release."""
    verdict: Verdict
    rate: Decimal | None
    """USD per hour of the Job's capacity still billing (None: nothing bills)."""
    final: bool
    """Every allocation is released and charged: nothing more will post."""
    covered: frozenset[Segment]
    """Segments with time Nodus paid for instead of charging it (status.cost.bySegment.coveredByNodus)."""
    wake_at: float | None
    """When time alone changes the decision: the next increment ends, or an unfunded Job rechecks."""


NODUS_FAULTS = frozenset({AttemptReason.NODE_LOST, AttemptReason.DRAINED, AttemptReason.AGENT_FAULT,
                          AttemptReason.LEASE_EXPIRED, AttemptReason.IMAGE_PULL_NODE_FAULT})
"""Losses that are Nodus's fault (its node, agent or operator), not the customer's choice: the time they
cost is coveredByNodus. A provider's reclaim of interruptible capacity (Preempted, as the reclaim
notice stops it; or Reclaimed) is not among them: the customer chose that capacity, and its estimate
counts the expected restores."""


def nodus_fault(a: AttemptView) -> bool:
    return a.phase is AttemptPhase.LOST and a.reason in NODUS_FAULTS


def allocation_of(a: AttemptView, after_fault: bool = False, warm_until: float | None = None) -> Allocation | None:
    """The allocation of an attempt placed on priced capacity (None for any other). Billing starts at
    the binding (provisioningTime), the program's start begins Running, a stop asked for begins
    Teardown, and the attempt's end (finished, or lost) releases the node. An attempt a Nodus fault
    ended is not charged from its last checkpoint on (that progress is lost); `after_fault`: it replaces
    one, and its restore is not charged either. `warm_until`: its node stays held for the project
    until then (scaledownWindow, or an earlier reuse), billed as Teardown."""
    if a.tariff is None or not a.placed or a.provisioned is None:
        return None
    stop = parse((a.stop or {}).get("time"))
    release = a.finished or a.lost_at
    if release is None and a.phase.terminal:
        release = stop or a.provisioned
    # The agent stamps the start and the end on its own clock: a skew must not put them before the
    # binding the coordinator stamped (a negative allocation).
    started = max(a.started, a.provisioned) if a.started is not None else None
    release = max(release, started or a.provisioned) if release is not None else None
    if warm_until is not None and release is not None and a.phase is not AttemptPhase.LOST:
        stop = stop if stop is not None else release
        release = max(release, warm_until)
    covered_from = None
    if nodus_fault(a):
        saved = [t for c in a.checkpoints if (t := parse(c.get("time"))) is not None]
        covered_from = max(saved, default=a.started or a.provisioned)
    return Allocation(a.id or a.name, a.tariff, a.provisioned, started, stop if stop is not None else (
        release if started is not None else None), release, restore=a.restored_from_seq > 0,
        covered_from=covered_from, covered_until=(started or release or a.provisioned) if after_fault else None)


def allocations(attempts: Sequence[AttemptView],
                warm: Callable[[AttemptView], float | None] = lambda a: None) -> tuple[Allocation, ...]:
    """The allocations of one Job's attempts; a replacement (the next number of an index) of an
    attempt a Nodus fault ended has its restore covered; `warm(a)`: until when a finished attempt's
    node is kept warm for its project (None: released when it ended)."""
    faults = {(a.index, a.rank, a.number) for a in attempts if nodus_fault(a)}
    out = []
    for a in attempts:
        allocation = allocation_of(a, (a.index, a.rank, a.number - 1) in faults,
                                   warm(a) if a.phase.terminal else None)
        if allocation is not None:
            out.append(allocation)
    return tuple(out)


def decide_billing(bill: Bill, accounts: Accounts, postings: Sequence[Posting], now: float) -> BillingDecision:
    """`postings` are those listed under the Job (its holds and its attempts' charges)."""
    uid = bill.uid
    booked = {p.key for p in postings}
    posts: list[Request] = []
    new_charges = ZERO
    for a in bill.allocations:
        for inc in increments_due(a, now):
            key = inc.key(a.uid)
            if key not in booked:
                posts.append(Request(key, Kind.CHARGE, a.uid, inc.amount, inc.segment, payer=uid))
                new_charges += inc.amount
    spent = sum((p.amount for p in postings if p.kind is Kind.CHARGE), ZERO) + new_charges
    hold_before = accounts.balance(held(uid))
    holding = max(hold_before - new_charges, ZERO)  # a charge draws on the hold first
    beyond = max(new_charges - hold_before, ZERO)  # charged from credits: it uses the budgets too
    available = accounts.available - beyond
    rooms = [replace(r, used=r.used + beyond) for r in bill.rooms]
    billing = [a for a in bill.allocations if a.release_time is None or a.release_time > now]
    rate = sum((a.tariff.rate_usd_per_hour for a in billing), ZERO) if billing else None
    last = max(bill.allocations, key=lambda a: a.allocate_time).tariff if bill.allocations else None

    verdict = Verdict(Stop.NONE)
    cap = bill.max_cost
    # Capped: running, the next increment and one more would pass the cap; stopped for it, a new start would.
    need = (2 * sum((step(a.tariff) for a in billing), ZERO) if billing else
            restart_need(last) if bill.stopped is Stop.MAX_COST and last is not None else None)
    if cap is not None and need is not None and spent + need > cap:
        verdict = Verdict(Stop.MAX_COST, _capped(spent, cap))

    renewals = sum(1 for p in postings if p.kind is Kind.RENEW)
    releases = sum(1 for p in postings if p.kind is Kind.RELEASE)
    if billing and verdict.stop is Stop.NONE:
        target = sum((ahead(a.tariff) for a in billing), ZERO)
        if cap is not None:
            target = min(target, max(cap - spent, ZERO))
        short = max(target - holding, ZERO)
        amount = ZERO
        room = min((r.left for r in rooms), default=None)
        if holding * 2 < target:
            amount = min(short, max(available, ZERO), short if room is None else room)
            if amount > 0:
                posts.append(Request(f"{uid}/renew/{renewals + 1}", Kind.RENEW, uid, amount))
        # Short of credits (or of a Budget): the renewal due now cannot be taken whole, or (once
        # stopped for it) they still could not top the hold up while the suspend runs its course.
        if amount < short and (holding * 2 < target or bill.stopped is Stop.CREDITS):
            verdict = Verdict(Stop.CREDITS, _unfunded(bill.project, short, available, rooms),
                              _funded_until(billing, holding + amount, now))
        holding += amount
    elif not billing and bill.stopped is Stop.CREDITS and last is not None:
        need = first_hold(last, spent, cap)
        if need > available or any(need > r.left for r in rooms):
            verdict = Verdict(Stop.CREDITS, _unfunded(bill.project, need, available, rooms))
    if not bill.active and holding > 0:
        posts.append(Request(f"{uid}/release/{releases + 1}", Kind.RELEASE, uid))
    if verdict.stop is Stop.NONE and billing:
        verdict = Verdict(Stop.NONE, funded_until=_funded_until(billing, holding, now))

    wake: list[float] = [_next_increment(a, now) for a in billing]
    if verdict.stop is Stop.CREDITS:
        wake.append(now + UNFUNDED_RECHECK_S)
    final = not bill.active and not billing and bool(bill.allocations)
    covered = frozenset(seg for a in bill.allocations for seg in covered_segments(a, now))
    return BillingDecision(tuple(posts), verdict, rate, final, covered, min(wake) if wake else None)


def _funded_until(billing: Sequence[Allocation], holding: Decimal, now: float) -> float | None:
    """When `holding` runs out: the end of the increments charged so far, plus what it pays for at the
    rate of the capacity still billing (it moves only when a posting does)."""
    rate = sum((a.tariff.rate_usd_per_hour for a in billing), ZERO)
    if rate <= 0:
        return None
    charged = max(a.allocate_time + a.billed_increments(now) * a.tariff.billing_increment_s for a in billing)
    return charged + float(holding / rate * SECONDS_PER_HOUR)


def _next_increment(a: Allocation, now: float) -> float:
    increment = a.tariff.billing_increment_s
    done = Decimal(str(max(now - a.allocate_time, 0.0))) / increment
    return a.allocate_time + (int(done.to_integral_value(rounding=ROUND_FLOOR)) + 1) * increment


def _capped(spent: Decimal, cap: Decimal) -> str:
    return (f"the Job has spent {spent} USD of its spec.maxCostUSD {cap}; its next billing increment and a final "
            f"checkpoint would pass the cap, so it checkpoints and suspends: raise spec.maxCostUSD to resume")


def _unfunded(project: str, need: Decimal, available: Decimal, rooms: Sequence[Room]) -> str:
    """Why the Job's hold cannot be had: the credits, or else the tightest Budget that cannot take it."""
    available = max(available, ZERO)
    if need > available:
        return _short(project, need, available)
    short = [r for r in rooms if need > r.left]
    room = min(short, key=lambda r: (r.left, r.budget.name))
    err = exhausted(room, need, "the Job's hold")
    return f"{err.message}; it checkpoints and suspends until then: {err.effective_fix}"


def _short(project: str, need: Decimal, available: Decimal) -> str:
    return (f'project "{project}" has {available} USD of credits available and the Job\'s hold needs {need} USD; it '
            f"checkpoints and suspends until credits are granted (nodus credits grant --project {project} AMOUNT)")

