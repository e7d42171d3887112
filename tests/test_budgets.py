"""Budgets, the pure part (money/budgets.py) and the money decision under them (controllers/billing.py):
a Budget's used is this month's charges to its objects plus their live holds, a hold that passes it is
refused with the Budget named, a running Job whose renewal no longer fits stops as when credits run out,
and a raised Budget lets it start again."""
from __future__ import annotations

from decimal import Decimal

import pytest

from nodus.coordinator.controllers.billing import Bill, Stop, decide_billing
from nodus.coordinator.errors import NodusError
from nodus.coordinator.money.budgets import Budget, Room, budget_of, matching, refusal, rooms
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.holds import first_hold
from nodus.coordinator.money.ledger import Accounts, Kind, Posting, Request, decide
from nodus.coordinator.money.ledger_charges import Allocation

T0 = 1_800_000_000.0
JOB = "job-uid"
MONTH = "2027-01"


class Books:
    """One project's ledger in memory, each posting booked at `time`."""

    def __init__(self, grant: Decimal) -> None:
        self.accounts = Accounts("p")
        self.postings: list[Posting] = []
        self.post(Request("grant/1", Kind.GRANT, amount=grant))

    def post(self, request: Request, time: str = "2027-01-15T00:00:00Z") -> None:
        assert request.key not in {p.key for p in self.postings}, f"{request.key} posted twice"
        posting = decide(self.accounts, request, time)
        self.accounts = self.accounts.apply(posting)
        self.postings.append(posting)

    def mine(self) -> list[Posting]:
        return [p for p in self.postings if p.owner == JOB]


def test_used_is_this_months_charges_of_matching_objects_plus_their_live_holds() -> None:
    books = Books(Decimal("100.00"))
    books.post(Request("a/charge/1", Kind.CHARGE, "att-a", Decimal("2.00"), payer="job-a"), "2026-12-31T23:59:59Z")
    books.post(Request("a/charge/2", Kind.CHARGE, "att-a", Decimal("3.00"), payer="job-a"))
    books.post(Request("b/charge/1", Kind.CHARGE, "att-b", Decimal("4.00"), payer="job-b"))
    books.post(Request("gone/charge/1", Kind.CHARGE, "att-gone", Decimal("0.50"), payer="job-gone"))
    books.post(Request("job-a/hold/1", Kind.HOLD, "job-a", Decimal("1.25")))
    labels = {"job-a": {"team": "a"}, "job-b": {"team": "b"}}
    everything = Budget("p", "all", Decimal("20.00"))
    team_a = Budget("p", "team-a", Decimal("5.00"), {"team": "a"})
    found = {r.budget.name: r for r in rooms([everything, team_a], books.accounts, books.postings, labels, MONTH)}
    # Last month's 2.00 does not count; a deleted Job's charge counts only where no selector asks for labels.
    assert found["all"].used == Decimal("8.75") and found["all"].left == Decimal("11.25")
    assert found["team-a"].used == Decimal("4.25") and found["team-a"].left == Decimal("0.75")
    assert [r.budget.name for r in matching(found.values(), {"team": "b"})] == ["all"]
    assert found["team-a"].to_json(MONTH)["leftUSD"] == "0.75"


def test_a_hold_a_budget_cannot_take_is_refused_naming_the_budget_the_amounts_and_the_fix() -> None:
    tight = Room(Budget("p", "team-a", Decimal("5.00"), {"team": "a"}), Decimal("4.25"))
    loose = Room(Budget("p", "all", Decimal("20.00")), Decimal("8.75"))
    assert refusal([tight, loose], Decimal("0.75"), "the first hold of this Job") is None
    err = refusal([tight, loose], Decimal("1.00"), "the first hold of this Job")
    assert err is not None and err.reason == "InsufficientCredits"
    assert 'budget "team-a" of project "p" (objects labelled team=a) has used 4.25 USD of its 5.00 USD' in err.message
    assert "needs 1.00 USD (0.25 USD more)" in err.message
    assert "nodus budgets set --project p --name team-a --amount AMOUNT --selector team=a" in err.effective_fix
    assert "at least 5.25 USD" in err.effective_fix and err.extra["budget"] == "team-a"


def test_an_operators_budget_is_checked_field_by_field() -> None:
    assert budget_of("p", "monthly", "250.00", {"team": "a"}).amount == Decimal("250.00")
    with pytest.raises(NodusError, match="name: Invalid value"):
        budget_of("p", "Not A Label", "1.00", {})
    with pytest.raises(NodusError, match="whole cents"):
        budget_of("p", "monthly", "1.001", {})
    with pytest.raises(NodusError, match="selector: Invalid value"):
        budget_of("p", "monthly", "1.00", {"bad key!": "x"})


def test_a_budget_smaller_than_the_credits_stops_the_job_until_it_is_raised() -> None:
    tariff = Tariff(Decimal("6.00"), 60, 60)  # $0.10 a minute, a hold of 1.00
    books = Books(Decimal("50.00"))
    budget = Budget("p", "monthly", Decimal("1.50"))
    books.post(Request(f"{JOB}/hold/a0", Kind.HOLD, JOB, first_hold(tariff, Decimal(0), None)))
    running = Allocation("a0", tariff, T0, T0 + 1)

    def room(b: Budget) -> tuple[Room, ...]:
        return tuple(rooms([b], books.accounts, books.postings, {JOB: {}}, MONTH))

    verdict, minute = None, 0
    for minute in range(1, 30):
        d = decide_billing(Bill(JOB, "p", None, (running,), True, rooms=room(budget)), books.accounts,
                           books.mine(), T0 + minute * 60)
        for request in d.posts:
            books.post(request)
        assert room(budget)[0].used <= budget.amount, "no renewal passes the budget"
        if d.verdict.stop is Stop.CREDITS:
            verdict = d.verdict
            break
    assert verdict is not None and books.accounts.available > 40, "the budget stopped it, not the credits"
    assert 'budget "monthly" of project "p"' in verdict.message and "nodus budgets set" in verdict.message
    assert verdict.funded_until is not None and verdict.funded_until > T0 + minute * 60
    ended = Allocation("a0", tariff, T0, T0 + 1, T0 + minute * 60, T0 + minute * 60 + 30)
    d = decide_billing(Bill(JOB, "p", None, (ended,), False, Stop.CREDITS, room(budget)), books.accounts,
                       books.mine(), T0 + minute * 60 + 31)
    for request in d.posts:
        books.post(request)
    assert d.verdict.stop is Stop.CREDITS and books.accounts.held == 0, "stopped, its hold released"
    assert 'budget "monthly"' in d.verdict.message
    raised = Budget("p", "monthly", Decimal("10.00"))
    d = decide_billing(Bill(JOB, "p", None, (ended,), False, Stop.CREDITS, room(raised)), books.accounts,
                       books.mine(), T0 + minute * 60 + 40)
    assert d.verdict.stop is Stop.NONE, "a raised budget lets it start again"


def test_a_budget_the_job_does_not_count_towards_changes_nothing() -> None:
    tariff = Tariff(Decimal("6.00"), 60, 60)
    books = Books(Decimal("50.00"))
    books.post(Request(f"{JOB}/hold/a0", Kind.HOLD, JOB, first_hold(tariff, Decimal(0), None)))
    running = Allocation("a0", tariff, T0, T0 + 1)
    other = Budget("p", "team-b", Decimal("0.50"), {"team": "b"})
    for minute in range(1, 30):
        mine = tuple(matching(rooms([other], books.accounts, books.postings, {JOB: {"team": "a"}}, MONTH),
                              {"team": "a"}))
        d = decide_billing(Bill(JOB, "p", None, (running,), True, rooms=mine), books.accounts, books.mine(),
                           T0 + minute * 60)
        for request in d.posts:
            books.post(request)
        assert d.verdict.stop is Stop.NONE
