"""The ledger over the real SQLite store: random histories of grants, holds, renewals, releases and
charges, run by two writers at once, killed at a random store write (as by kill -9: the write and
everything after it never happen) and then replayed, a prefix of the history twice, by a new writer.
Whatever happens, the balances are the fold of the append-only postings, the ledger balances to zero,
nothing goes negative, no key posts twice and every object's charges sum to its spent account."""
from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus.coordinator.errors import NodusError
from nodus.coordinator.money.credits import Credits, first_hold_refusal
from nodus.coordinator.money.ledger import (AVAILABLE, FUNDING, Accounts, Kind, Request, Segment, decide, fold,
                                            held, spent)
from nodus.coordinator.money.ledger_cost import Cost
from nodus.coordinator.money.ledger_store import Ledger
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.store.base import Event, ListResult, Record, Store

NOW = "2026-12-02T03:00:00Z"


class Killed(Exception):
    """The process died before this write."""


class Dying(Store):
    """The real store, until the `writes_left`-th write: that write and every later one never happen."""

    def __init__(self, store: Store, writes_left: int) -> None:
        self.inner, self.writes_left = store, writes_left

    def _write(self) -> None:
        if self.writes_left <= 0:
            raise Killed()
        self.writes_left -= 1

    async def create(self, key: str, value: bytes) -> Record:
        self._write()
        return await self.inner.create(key, value)

    async def update(self, key: str, value: bytes, expected_revision: int | None) -> Record:
        self._write()
        return await self.inner.update(key, value, expected_revision)

    async def delete(self, key: str, expected_revision: int | None = None) -> Record:
        self._write()
        return await self.inner.delete(key, expected_revision)

    async def get(self, key: str) -> Record | None:
        return await self.inner.get(key)

    async def list(self, prefix: str, *, limit: int = 0, start_after: str | None = None,
                   revision: int | None = None) -> ListResult:
        return await self.inner.list(prefix, limit=limit, start_after=start_after, revision=revision)

    def watch(self, prefix: str, from_revision: int) -> AsyncIterator[Event]:
        return self.inner.watch(prefix, from_revision)

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    @property
    def revision(self) -> int:
        return self.inner.revision

    @property
    def compacted_revision(self) -> int:
        return self.inner.compacted_revision

    async def close(self) -> None:
        await self.inner.close()


cents = st.integers(min_value=1, max_value=5000).map(lambda n: Decimal(n) / 100)
objects = st.sampled_from(["att-a", "att-b", "job-1"])
operation = st.one_of(
    st.tuples(st.just(Kind.GRANT), st.integers(0, 4), st.just(""), st.just(Segment.NONE), cents.map(lambda c: c * 4)),
    st.tuples(st.just(Kind.HOLD), st.integers(0, 2), objects, st.just(Segment.NONE), cents),
    st.tuples(st.just(Kind.RENEW), st.integers(0, 3), objects, st.just(Segment.NONE), cents),
    st.tuples(st.just(Kind.RELEASE), st.integers(0, 2), objects, st.just(Segment.NONE), st.none()),
    st.tuples(st.just(Kind.CHARGE), st.integers(0, 5), objects,
              st.sampled_from([Segment.BOOT, Segment.RUNNING, Segment.RESTORE, Segment.TEARDOWN]), cents),
    # an attempt's charge paid from its Job's hold
    st.tuples(st.just(Kind.CHARGE), st.integers(6, 9), st.sampled_from(["att-a", "att-b"]),
              st.sampled_from([Segment.BOOT, Segment.RUNNING]), cents),
)


def requests(ops: list[tuple[Kind, int, str, Segment, Decimal | None]]) -> list[Request]:
    """One request per op; an op whose key came before repeats that request exactly (a replay)."""
    first: dict[str, Request] = {}
    out = []
    for kind, n, obj, segment, amount in ops:
        key = f"grant/r{n}" if kind is Kind.GRANT else (
            f"{obj}/charge/{n}" if kind is Kind.CHARGE else f"{obj}/{kind.value.lower()}/{n}")
        payer = "job-1" if kind is Kind.CHARGE and n >= 6 else ""
        out.append(first.setdefault(key, Request(key, kind, obj, amount, segment, payer=payer)))
    return out


async def run(ledger: Ledger, history: list[Request]) -> set[str]:
    """Posts `history` in order; the keys that were refused for want of credits."""
    refused = set()
    for request in history:
        try:
            await ledger.post("p", request, NOW)
        except NodusError as e:
            assert e.reason == "InsufficientCredits", e
            assert "nodus credits grant --project p" in e.effective_fix
            refused.add(request.key)
    return refused


async def check(ledger: Ledger, history: list[Request]) -> None:
    postings = await ledger.postings("p")
    accounts = await ledger.accounts("p")
    assert [p.seq for p in postings] == list(range(1, len(postings) + 1))
    keys = [p.key for p in postings]
    assert len(keys) == len(set(keys)), "a key posted twice"
    wanted = {r.key: r for r in history}
    assert all(wanted[p.key].same_as(p) for p in postings)
    assert fold("p", postings) == accounts  # the balance record is exactly the append-only postings
    assert sum(accounts.balances.values(), Decimal(0)) == 0  # double entry
    assert all(v >= 0 for k, v in accounts.balances.items() if k != FUNDING)
    assert accounts.granted == sum((p.amount for p in postings if p.kind is Kind.GRANT), Decimal(0))
    for obj in {r.obj for r in history if r.obj}:
        charges = [p for p in postings if p.kind is Kind.CHARGE and p.obj == obj]
        assert accounts.balance(spent(obj)) == sum((wanted[p.key].amount or 0 for p in charges), Decimal(0))
        assert all(p.amount == wanted[p.key].amount for p in charges)  # charged to the cent, no more, no less
    assert accounts.spent_in(NOW[:7]) == accounts.spent
    for owner in ("att-a", "att-b", "job-1"):  # status.cost reads an object's own list: complete and exact
        listed = await ledger.postings("p", owner)
        assert listed == [p for p in postings if p.owner == owner]
        cost = Cost.of(accounts, owner, listed)
        assert cost.total == sum((p.amount for p in postings if p.kind is Kind.CHARGE and p.owner == owner),
                                 Decimal(0))
        assert cost.total == sum(cost.by_segment.values(), Decimal(0)) and cost.held == accounts.balance(held(owner))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=30), kill_at=st.integers(0, 40),
       prefix=st.integers(0, 30), split=st.integers(0, 30))
def test_any_history_killed_anywhere_and_replayed_books_each_key_once(
        ops: list[tuple[Kind, int, str, Segment, Decimal | None]], kill_at: int, prefix: int, split: int) -> None:
    history = requests(ops)

    async def scenario(path: Path) -> None:
        store = await SqliteStore.open(path / "store.db", synchronous="OFF")
        try:
            dying = Dying(store, kill_at)
            # two coordinators at once, both killed at the same write
            results = await asyncio.gather(run(Ledger(dying), history[:split]), run(Ledger(dying), history[split:]),
                                           return_exceptions=True)
            assert all(r is None or isinstance(r, (set, Killed)) for r in results), results
            restarted = Ledger(store)
            await run(restarted, history[:prefix])  # the replays after the restart, a prefix twice
            await run(restarted, history[:prefix])
            await check(restarted, history)
            refused = await run(restarted, history)
            await check(restarted, history)
            booked = {p.key for p in await restarted.postings("p")}
            assert booked | refused == set(r.key for r in history)  # everything not refused is booked now
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


def test_a_hold_beyond_the_balance_is_refused_naming_the_amounts_and_the_fix() -> None:
    accounts = fold("acme", [decide(Accounts("acme"), Request("grant/1", Kind.GRANT, amount=Decimal("10.00")), NOW)])
    with pytest.raises(NodusError) as refused:
        decide(accounts, Request("att/hold/0", Kind.HOLD, "att", Decimal("12.50")), NOW)
    assert refused.value.reason == "InsufficientCredits" and refused.value.code.grpc == "FAILED_PRECONDITION"
    assert "has 10.00 USD of credits available; a hold for att needs 12.50 USD (2.50 USD more)" in \
        refused.value.message
    assert "grant at least 2.50 USD (nodus credits grant --project acme AMOUNT)" in refused.value.effective_fix
    assert refused.value.extra == {"neededUSD": "12.50", "availableUSD": "10.00"}


def test_a_charge_draws_on_its_hold_first_and_a_release_returns_the_rest() -> None:
    steps = [Request("grant/1", Kind.GRANT, amount=Decimal("100.00")),
             Request("att/hold/0", Kind.HOLD, "att", Decimal("20.00")),
             Request("att/Running/1", Kind.CHARGE, "att", Decimal("25.40"), Segment.RUNNING),
             Request("att/release/0", Kind.RELEASE, "att")]
    accounts, postings = Accounts("acme"), []
    for step in steps:
        postings.append(decide(accounts, step, NOW))
        accounts = accounts.apply(postings[-1])
    assert [(leg.source, leg.target, leg.amount) for leg in postings[2].legs] == [
        (held("att"), spent("att"), Decimal("20.00")), (AVAILABLE, spent("att"), Decimal("5.40"))]
    assert postings[3].legs == ()  # nothing left to release
    assert (accounts.available, accounts.held, accounts.spent) == (Decimal("74.60"), 0, Decimal("25.40"))


def test_a_key_reused_for_another_request_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            credits = Credits(Ledger(store))
            first, booked = await credits.grant("acme", "25.00", "req-1", NOW)
            again, rebooked = await credits.grant("acme", "25.00", "req-1", NOW)
            assert booked and not rebooked and again == first
            with pytest.raises(NodusError) as reused:
                await credits.grant("acme", "30.00", "req-1", NOW)
            assert reused.value.reason == "AlreadyExists" and "use a new request id" in reused.value.effective_fix
            balance = await credits.balance("acme", NOW)
            assert (balance.available, balance.granted, balance.month) == (Decimal("25.00"), Decimal("25.00"),
                                                                           "2026-12")
        finally:
            await store.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("amount, detail", [
    ("0", "must be more than 0"), ("-5.00", "must be more than 0"), ("1.005", "must be whole cents"),
    ("ten", "must be a decimal amount of USD"), (2.5, "not a number"), ("NaN", "must be more than 0")])
def test_a_bad_grant_amount_names_the_field(tmp_path: Path, amount: object, detail: str) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            with pytest.raises(NodusError) as bad:
                await Credits(Ledger(store)).grant("acme", amount, "req-1", NOW)  # type: ignore[arg-type]
            assert bad.value.reason == "Invalid" and bad.value.causes[0].field == "amountUSD"
            assert detail in bad.value.causes[0].message
        finally:
            await store.close()

    asyncio.run(scenario())


def test_the_same_grant_sent_by_many_coordinators_at_once_books_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db", synchronous="OFF")
        try:
            for n in range(20):
                request = Request(f"grant/race-{n}", Kind.GRANT, amount=Decimal("1.00"))
                results = await asyncio.gather(*(Ledger(store).post("acme", request, NOW) for _ in range(6)))
                assert sum(booked for _, booked in results) == 1
                assert len({posting for posting, _ in results}) == 1
            accounts = await Ledger(store).accounts("acme")
            assert (accounts.available, accounts.seq) == (Decimal("20.00"), 20)
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_first_hold_the_credits_cannot_take_is_a_blocking_reason_with_the_amounts() -> None:
    accounts = fold("acme", [decide(Accounts("acme"), Request("grant/1", Kind.GRANT, amount=Decimal("3.00")), NOW)])
    assert first_hold_refusal(accounts, Decimal("3.00"), "Job train") is None
    reason = first_hold_refusal(accounts, Decimal("23.92"), "Job train")
    assert reason is not None and reason["code"] == "InsufficientCredits"
    assert reason["message"] == ('project "acme" has 3.00 USD of credits available; the first hold of Job train '
                                 "needs 23.92 USD (20.92 USD more)")
    assert reason["fix"].startswith("ask an operator to grant at least 20.92 USD")


def test_status_cost_shows_a_jobs_charges_by_segment_and_what_its_hold_still_pays_for(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            ledger = Ledger(store)
            for request in (Request("grant/1", Kind.GRANT, amount=Decimal("50.00")),
                            Request("job/hold/0", Kind.HOLD, "job", Decimal("12.00")),
                            Request("a1/charge/1", Kind.CHARGE, "a1", Decimal("1.20"), Segment.BOOT, payer="job"),
                            Request("a1/charge/2", Kind.CHARGE, "a1", Decimal("0.40"), Segment.RUNNING, payer="job"),
                            Request("a2/charge/1", Kind.CHARGE, "a2", Decimal("1.20"), Segment.RESTORE, payer="job"),
                            Request("other/hold/0", Kind.HOLD, "other", Decimal("5.00"))):
                await ledger.post("p", request, NOW)
            accounts = await ledger.accounts("p")
            cost = Cost.of(accounts, "job", await ledger.postings("p", "job"), limit=Decimal("30"),
                           rate=Decimal("24.00"))
            assert cost.to_status(1_796_000_000.0) == {
                "totalUSD": "2.80", "heldUSD": "9.20", "final": False, "limitUSD": "30.00", "rateUSDPerHour": "24.00",
                "bySegment": {"bootUSD": "1.20", "runningUSD": "0.40", "restoreUSD": "1.20", "teardownUSD": "0.00"},
                "fundedUntilTime": "2026-11-30T01:16:20Z"}  # 9.20 USD at 24.00 USD/h is 23 minutes
            assert (accounts.available, accounts.held, accounts.spent) == (Decimal("33.00"), Decimal("14.20"),
                                                                           Decimal("2.80"))
        finally:
            await store.close()

    asyncio.run(scenario())
