"""The money controller's decision (controllers/billing.py) over random histories of allocations:
replaying it posts nothing twice, no balance or hold goes negative, every allocation is charged
exactly what its tariff says for the time it held its node, status.cost's total is the sum of the
postings to the cent, the hold goes back once nothing runs, and the cap and the credits stop the Job
when they should."""
from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.coordinator.clock import rfc3339
from nodus.coordinator.controllers.billing import Bill, Stop, allocations, decide_billing
from nodus.coordinator.controllers.views import AttemptView
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.holds import first_hold
from nodus.coordinator.money.ledger import Accounts, Kind, Posting, Request, Segment, decide
from nodus.coordinator.money.ledger_charges import Allocation, increments_due
from nodus.coordinator.money.ledger_cost import Cost

T0 = 1_800_000_000.0
JOB = "job-uid"


class Books:
    """One project's ledger in memory, booked as the store writer books it (keys once)."""

    def __init__(self, grant: Decimal) -> None:
        self.accounts = Accounts("p")
        self.postings: list[Posting] = []
        self.post(Request("grant/1", Kind.GRANT, amount=grant))

    def post(self, request: Request) -> None:
        assert request.key not in {p.key for p in self.postings}, f"{request.key} posted twice"
        posting = decide(self.accounts, request, "2027-01-15T00:00:00Z")
        self.accounts = self.accounts.apply(posting)  # raises if anything but funding goes negative
        self.postings.append(posting)

    def mine(self) -> list[Posting]:
        return [p for p in self.postings if p.owner == JOB]


tariffs = st.builds(Tariff, st.decimals("0.01", "40.00", places=2), st.sampled_from([1, 30, 60, 120]),
                    st.sampled_from([0, 60, 300]))


@settings(max_examples=150, deadline=None)
@given(tariff=tariffs, spans=st.lists(st.tuples(st.integers(0, 900), st.integers(1, 4000)), min_size=1, max_size=4),
       steps=st.lists(st.integers(1, 400), min_size=1, max_size=40))
def test_every_history_is_charged_exactly_once_and_the_cost_is_the_ledger(
        tariff: Tariff, spans: list[tuple[int, int]], steps: list[int]) -> None:
    # Allocations one after another (a replacement after each): (gap before it, how long it held the node).
    allocations, t = [], T0
    for i, (gap, held_s) in enumerate(spans):
        start = t + gap
        allocations.append(Allocation(f"a{i}", tariff, start, start + 1, start + held_s, start + held_s, restore=i > 0))
        t = start + held_s
    books = Books(Decimal("1000000.00"))
    books.post(Request(f"{JOB}/hold/a0", Kind.HOLD, JOB, first_hold(tariff, Decimal(0), None)))
    now, end = T0, t + 1
    for s in [*steps, int(end - T0) + 1]:
        now = min(now + s, end + 1)
        seen = tuple(a if a.release_time is not None and a.release_time <= now else
                     Allocation(a.uid, a.tariff, a.allocate_time, a.start_time) for a in allocations
                     if a.allocate_time <= now)
        bill = Bill(JOB, "p", None, seen, active=now < end)
        decision = decide_billing(bill, books.accounts, books.mine(), now)
        for request in decision.posts:
            books.post(request)
        again = decide_billing(bill, books.accounts, books.mine(), now)
        assert again.posts == (), "a replay of the same picture posts nothing"
        assert decision.verdict.stop is Stop.NONE
    charges = [p for p in books.postings if p.kind is Kind.CHARGE]
    for a in allocations:
        owed = tariff.charge(Decimal(str(a.release_time - a.allocate_time)))  # type: ignore[operator]
        assert sum((p.amount for p in charges if p.obj == a.uid), Decimal(0)) == owed, a
    cost = Cost.of(books.accounts, JOB, books.mine())
    assert cost.total == sum((p.amount for p in charges), Decimal(0))
    assert cost.held == 0 and books.accounts.held == 0, "nothing runs: the hold went back"
    assert books.accounts.spent == cost.total and books.accounts.available == Decimal("1000000.00") - cost.total


def test_the_cap_stops_a_job_before_its_next_increment_and_a_raise_lifts_it() -> None:
    tariff = Tariff(Decimal("6.00"), 60, 60)  # $0.10 a minute
    books = Books(Decimal("50.00"))
    books.post(Request(f"{JOB}/hold/a0", Kind.HOLD, JOB, first_hold(tariff, Decimal(0), Decimal("1.00"))))
    running = Allocation("a0", tariff, T0, T0 + 1)
    stop_at = None
    for minute in range(1, 20):
        d = decide_billing(Bill(JOB, "p", Decimal("1.00"), (running,), True), books.accounts, books.mine(),
                           T0 + minute * 60)
        for request in d.posts:
            books.post(request)
        if d.verdict.stop is Stop.MAX_COST:
            stop_at = minute
            break
    assert stop_at == 9, "spent 0.90: the next increment and a final one would pass 1.00"
    assert "spent 0.90 USD of its spec.maxCostUSD 1.00" in d.verdict.message
    # It stops: the node is released a minute later, and the cap holds while it is suspended.
    ended = Allocation("a0", tariff, T0, T0 + 1, T0 + 9 * 60, T0 + 10 * 60)
    d = decide_billing(Bill(JOB, "p", Decimal("1.00"), (ended,), False, Stop.MAX_COST), books.accounts,
                       books.mine(), T0 + 11 * 60)
    for request in d.posts:
        books.post(request)
    assert d.verdict.stop is Stop.MAX_COST and d.final
    assert Cost.of(books.accounts, JOB, books.mine()).total == Decimal("1.00") and books.accounts.held == 0
    lifted = decide_billing(Bill(JOB, "p", Decimal("2.00"), (ended,), False, Stop.MAX_COST), books.accounts,
                            books.mine(), T0 + 12 * 60)
    assert lifted.verdict.stop is Stop.NONE and lifted.posts == (), "a raised cap lets it start again"


def test_credits_that_cannot_renew_the_hold_stop_the_job_until_a_grant() -> None:
    tariff = Tariff(Decimal("6.00"), 60, 60)
    books = Books(Decimal("1.30"))
    books.post(Request(f"{JOB}/hold/a0", Kind.HOLD, JOB, first_hold(tariff, Decimal(0), None)))  # 1.00
    running = Allocation("a0", tariff, T0, T0 + 1)
    verdict = None
    for minute in range(1, 15):
        d = decide_billing(Bill(JOB, "p", None, (running,), True), books.accounts, books.mine(), T0 + minute * 60)
        for request in d.posts:
            books.post(request)
        if d.verdict.stop is Stop.CREDITS:
            verdict = d.verdict
            break
    assert verdict is not None and verdict.funded_until is not None
    assert verdict.funded_until > T0 + minute * 60, "stopByTime is ahead: what is held still pays for a while"
    assert books.accounts.available == 0 and books.accounts.balance("available") >= 0
    # Once stopped for credits it stays so (the partial renewal does not lift it) until a grant covers a hold.
    d = decide_billing(Bill(JOB, "p", None, (running,), True, Stop.CREDITS), books.accounts, books.mine(),
                       T0 + minute * 60 + 1)
    assert d.verdict.stop is Stop.CREDITS
    ended = Allocation("a0", tariff, T0, T0 + 1, T0 + minute * 60, T0 + minute * 60 + 30)
    d = decide_billing(Bill(JOB, "p", None, (ended,), False, Stop.CREDITS), books.accounts, books.mine(),
                       T0 + minute * 60 + 31)
    for request in d.posts:
        books.post(request)
    assert d.verdict.stop is Stop.CREDITS and books.accounts.held == 0
    books.post(Request("grant/2", Kind.GRANT, amount=Decimal("5.00")))
    d = decide_billing(Bill(JOB, "p", None, (ended,), False, Stop.CREDITS), books.accounts, books.mine(),
                       T0 + minute * 60 + 40)
    assert d.verdict.stop is Stop.NONE


def test_time_lost_to_a_nodus_fault_is_covered_not_charged() -> None:
    """A node lost after the attempt's last checkpoint: the running time since that checkpoint and the
    replacement's restore are Nodus's; a reclaim of interruptible capacity is the customer's choice."""
    def attempt(number: int, phase: str, reason: str, provisioned: float, started: float, ended: float,
                checkpoint: float | None = None) -> AttemptView:
        status = {"phase": phase, "reason": reason, "provisioningTime": rfc3339(provisioned),
                  "startTime": rfc3339(started)}
        status["lostTime" if phase == "Lost" else "finishTime"] = rfc3339(ended)
        if checkpoint is not None:
            status["checkpoints"] = [{"seq": 1, "time": rfc3339(checkpoint)}]
        if number > 1:
            status["restoredFromSeq"] = 1
        return AttemptView.from_object({
            "metadata": {"name": f"j-0-{number}", "namespace": "p"},
            "spec": {"job": "j", "jobUID": JOB, "index": 0, "number": number, "node": "n", "id": f"att-{number}",
                     "rateUSDPerHour": "6.00", "billingIncrementSeconds": 60, "minimumChargeSeconds": 60},
            "status": status})

    for reason, covered in (("NodeLost", True), ("Reclaimed", False), ("Preempted", False)):
        lost = attempt(1, "Lost", reason, T0, T0 + 30, T0 + 600, checkpoint=T0 + 300)
        replacement = attempt(2, "Succeeded", "Completed", T0 + 700, T0 + 820, T0 + 1000)
        books = Books(Decimal("100.00"))
        books.post(Request(f"{JOB}/hold/x", Kind.HOLD, JOB, Decimal("5.00")))
        d = decide_billing(Bill(JOB, "p", None, allocations([lost, replacement]), False), books.accounts, [],
                           T0 + 2000)
        for request in d.posts:
            books.post(request)
        charged = {p.obj: sum((q.amount for q in books.postings if q.obj == p.obj and q.kind is Kind.CHARGE),
                              Decimal(0)) for p in books.postings if p.kind is Kind.CHARGE}
        if covered:
            # 10 minutes held, charged only until the checkpoint at 5:00; the replacement's 2-minute
            # restore is covered and its 3 running minutes are charged.
            assert charged == {"att-1": Decimal("0.50"), "att-2": Decimal("0.30")}, charged
            assert {s.value for s in d.covered} == {"Running", "Restore"}
        else:
            assert charged == {"att-1": Decimal("1.00"), "att-2": Decimal("0.50")}, charged
            assert d.covered == frozenset()


def test_a_node_kept_warm_after_the_job_bills_as_teardown_until_it_is_released() -> None:
    view = AttemptView.from_object({
        "metadata": {"name": "j-0-1", "namespace": "p"},
        "spec": {"job": "j", "jobUID": JOB, "index": 0, "number": 1, "node": "n", "id": "att-1",
                 "rateUSDPerHour": "6.00", "billingIncrementSeconds": 60, "minimumChargeSeconds": 60},
        "status": {"phase": "Succeeded", "reason": "Completed", "provisioningTime": rfc3339(T0),
                   "startTime": rfc3339(T0 + 10), "finishTime": rfc3339(T0 + 300)}})
    books = Books(Decimal("100.00"))
    warm = allocations([view], lambda a: T0 + 900)  # scaledownWindow 10m after the end
    d = decide_billing(Bill(JOB, "p", None, warm, False), books.accounts, [], T0 + 600)
    assert d.rate == Decimal("6.00") and not d.final, "the warm node still bills"
    for request in d.posts:
        books.post(request)
    d = decide_billing(Bill(JOB, "p", None, warm, False), books.accounts, books.mine(), T0 + 1000)
    for request in d.posts:
        books.post(request)
    cost = Cost.of(books.accounts, JOB, books.mine())
    assert d.final and cost.total == Decimal("1.50")  # 15 minutes held
    assert cost.by_segment[Segment.TEARDOWN] == Decimal("1.00"), "the 10 warm minutes are Teardown"
    released = allocations([view])  # no window: released when it ended
    assert sum((i.amount for a in released for i in increments_due(a, T0 + 1000)), Decimal(0)) == Decimal("0.50")


GiB = 1024**3


@settings(max_examples=150, deadline=None)
@given(rate=st.decimals("0.01", "5.00", places=2),
       steps=st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 50 * GiB), st.booleans(), st.booleans()),
                      min_size=1, max_size=40))
def test_storage_is_charged_what_it_accrued_once_per_period_through_crashes_and_replays(
        rate: Decimal, steps: list[tuple[int, int, bool, bool]]) -> None:
    """Random histories of billed bytes over time, each pass perhaps killed between writing the accrual
    and posting the charge, perhaps replayed: every storage charge posts once, none is negative, the
    Job's status.cost (total and bySegment.storageUSD) is the sum of its postings, and what was charged
    is the exact accrual rounded down to the cent, never more."""
    from nodus.coordinator.money.storage import GIB, MONTH_S, STORAGE_PERIOD_S, decide_storage
    books = Books(Decimal("1000000.00"))
    record = None
    since: float | None = None  # the oracle: when the accrual last moved, and what it is exactly
    exact, t = Decimal(0), T0
    for advance, billed, crash, replay in steps:
        t += advance
        if since is None and billed > 0:
            since = t
        elif since is not None and int(t // STORAGE_PERIOD_S) > int(since // STORAGE_PERIOD_S):
            exact += Decimal(billed) / GIB * rate * Decimal(round((t - since) * 1000)) / 1000 / MONTH_S
            since = t
        for _ in range(2 if replay or crash else 1):
            d = decide_storage(JOB, record, billed, rate, books.mine(), t)
            record = d.write or record
            if d.post is not None and not crash:
                assert d.post.amount is not None and d.post.amount > 0
                books.post(d.post)  # Books refuses a key posted twice
            crash = False  # killed between the record and the charge: the next pass posts it
        assert (record is None) == (since is None) and (record is None or record.accrued == exact)
    mine = books.mine()
    total = sum((p.amount for p in mine if p.kind is Kind.CHARGE), Decimal(0))
    cost = Cost.of(books.accounts, JOB, mine)
    assert cost.total == total and Decimal(cost.to_status(t)["bySegment"].get("storageUSD", "0.00")) == total
    assert total <= exact and exact - total < Decimal("0.01"), "charged the accrual rounded down to the cent"
    assert all(p.amount > 0 and p.segment is Segment.STORAGE for p in mine if p.kind is Kind.CHARGE)
    assert books.accounts.available >= 0


def test_storage_too_small_for_a_cent_an_hour_is_charged_once_it_adds_up() -> None:
    """10 GiB at 0.08 USD per GiB-month is 0.0011 USD an hour: nothing posts for the first nine hours,
    a cent in the tenth, and a month of hourly passes charges 0.80 USD, within a cent."""
    from nodus.coordinator.money.storage import decide_storage
    books = Books(Decimal("10.00"))
    record = None
    posted_at = []
    for hour in range(0, 30 * 24 + 1):
        d = decide_storage(JOB, record, 10 * GiB, Decimal("0.08"), books.mine(), T0 + hour * 3600)
        record = d.write or record
        if d.post is not None:
            books.post(d.post)
            posted_at.append(hour)
        assert d.wake_at is not None and d.wake_at > T0 + hour * 3600
    assert posted_at[0] == 10
    total = Cost.of(books.accounts, JOB, books.mine()).by_segment[Segment.STORAGE]
    assert Decimal("0.79") <= total <= Decimal("0.80")
    # Storage gone (billedBytes 0): the accrual stops, nothing more is charged.
    for hour in range(30 * 24 + 1, 30 * 24 + 50):
        d = decide_storage(JOB, record, 0, Decimal("0.08"), books.mine(), T0 + hour * 3600)
        record = d.write or record
        assert d.wake_at is None
        if d.post is not None:
            books.post(d.post)
    assert Cost.of(books.accounts, JOB, books.mine()).by_segment[Segment.STORAGE] <= Decimal("0.80")
