"""Charges per billing increment, level-triggered from an allocation's times: whenever a money
controller looks (any sequence of looks up to the release, each posted through the real ledger), the
posted increments are a prefix of what the release owes, no increment posts twice, and at release the
postings sum to the tariff's charge for the allocation to the cent, split by segment."""
from __future__ import annotations

import asyncio
import tempfile
from decimal import Decimal
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.coordinator.errors import NodusError
from nodus.coordinator.money.credits import Credits
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.ledger import Kind, Segment, spent
from nodus.coordinator.money.ledger_charges import Allocation, charged_by, increments_due
from nodus.coordinator.money.ledger_store import Ledger
from nodus.coordinator.store import SqliteStore

T0 = 1_796_000_000.0  # 2026-11-30, a time the store's RFC 3339 strings carry to the millisecond

tariffs = st.builds(
    lambda rate, increment, minimum: Tariff(Decimal(rate) / 100, increment, increment * minimum),
    st.integers(1, 4000), st.sampled_from([1, 30, 60, 3600]), st.integers(0, 5))


@st.composite
def allocations(draw: st.DrawFn) -> tuple[Allocation, list[float]]:
    """An allocation with ordered times, and the times a controller looked before its release."""
    tariff = draw(tariffs)
    # at most a few dozen increments, each posted through the real store
    span = st.integers(0, 12 * tariff.billing_increment_s * 1000).map(lambda ms: ms / 1000)
    boot, run, teardown = draw(span), draw(span), draw(span)
    started = draw(st.booleans())  # some attempts are lost before their program starts
    start = T0 + boot if started else None
    stop = (T0 + boot + run) if started else T0 + boot
    release = stop + teardown
    allocation = Allocation("att-1", tariff, T0, start, stop, release, restore=draw(st.booleans()))
    looks = sorted(draw(st.lists(st.floats(T0 - 10, release, allow_nan=False), max_size=6)))
    return allocation, looks


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=allocations())
def test_looking_at_any_times_charges_each_increment_once_and_the_allocation_exactly(
        case: tuple[Allocation, list[float]]) -> None:
    allocation, looks = case
    assert allocation.release_time is not None
    release = allocation.release_time
    owed = increments_due(allocation, release)
    # the tariff's price of the whole allocation, to the cent, is what its increments sum to
    assert charged_by(allocation, release) == allocation.tariff.charge(Decimal(round((release - T0) * 1000)) / 1000)
    assert [i.n for i in owed] == sorted({i.n for i in owed})

    async def scenario(path: Path) -> None:
        store = await SqliteStore.open(path / "store.db", synchronous="OFF")
        try:
            credits = Credits(Ledger(store))
            await credits.grant("p", "100000000.00", "seed", "2026-11-30T00:00:00Z")
            for look in looks:
                # what the controller sees then: a program start or stop not yet reported is unknown
                seen = Allocation(allocation.uid, allocation.tariff, T0,
                                  allocation.start_time if allocation.start_time is not None
                                  and allocation.start_time <= look else None,
                                  allocation.stop_time if allocation.stop_time is not None
                                  and allocation.stop_time <= look else None,
                                  None, allocation.restore)
                charged = await credits.settle("p", seen, look)
                assert charged == charged_by(seen, look)
                assert [i.n for i in increments_due(seen, look)] == [i.n for i in owed][:len(
                    increments_due(seen, look))]  # a prefix of what the release owes
            total = await credits.settle("p", allocation, release)
            assert await credits.settle("p", allocation, release + 3600) == total  # after release, nothing more
            postings = [p for p in await credits.ledger.postings("p") if p.kind is Kind.CHARGE]
            assert total == charged_by(allocation, release) == sum((p.amount for p in postings), Decimal(0))
            assert sorted(p.key for p in postings) == sorted(i.key(allocation.uid) for i in owed)
            if not looks:  # named from the final times, every increment has its true segment
                assert {p.key: p.segment for p in postings} == {i.key(allocation.uid): i.segment for i in owed}
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


def test_segments_follow_the_times_and_the_minimum_falls_on_the_first_increments() -> None:
    tariff = Tariff(Decimal("36.00"), 60, 180)  # 1 cent a second, three increments minimum
    allocation = Allocation("a", tariff, T0, start_time=T0 + 90, stop_time=T0 + 400, release_time=T0 + 430)
    due = increments_due(allocation, T0 + 430)
    assert [(i.n, i.segment, i.amount) for i in due] == [
        (1, Segment.BOOT, Decimal("1.80")), (4, Segment.RUNNING, Decimal("0.60")),
        (5, Segment.RUNNING, Decimal("0.60")), (6, Segment.RUNNING, Decimal("0.60")),
        (7, Segment.RUNNING, Decimal("0.60")), (8, Segment.TEARDOWN, Decimal("0.60"))]
    assert charged_by(allocation, T0 + 430) == tariff.charge(Decimal(430)) == Decimal("4.80")
    # before the release only ended increments are charged; the hold covers the one in progress
    running = Allocation("a", tariff, T0, start_time=T0 + 90)
    assert [i.n for i in increments_due(running, T0 + 59.999)] == []
    assert [i.n for i in increments_due(running, T0 + 60)] == [1]
    replacement = Allocation("b", tariff, T0, restore=True)
    assert increments_due(replacement, T0 + 120)[0].segment is Segment.RESTORE


def test_a_charge_beyond_hold_and_credits_is_refused_and_posts_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            credits = Credits(Ledger(store))
            await credits.grant("p", "1.00", "seed", "2026-12-02T00:00:00Z")
            await credits.take_hold("p", "a", 0, Decimal("0.50"), "2026-12-02T00:00:00Z")
            hourly = Allocation("a", Tariff(Decimal("36.00"), 60, 60), T0, start_time=T0)
            try:
                await credits.settle("p", hourly, T0 + 600)  # 6.00 USD owed, 1.00 there
            except NodusError as e:
                assert e.reason == "InsufficientCredits" and "0.40 USD of credits available" in e.message
            else:
                raise AssertionError("charged beyond the credits")
            accounts = await credits.ledger.accounts("p")
            # the first increment (0.60: 0.50 from the hold, 0.10 from credits) posted; the rest did not
            assert accounts.balance(spent("a")) == Decimal("0.60") and accounts.available == Decimal("0.40")
            assert accounts.held == 0
        finally:
            await store.close()

    asyncio.run(scenario())
