"""Budgets inside the ledger's compare-and-swap: two coordinators taking holds at once, each with its
own Ledger (on one SQLite store; on PostgreSQL each with its own store connection, as two coordinator
processes), both past their Budget check before either commits. One hold is booked, the other is
refused with InsufficientCredits naming the Budget, and no Budget's used passes its amount, also
when the second coordinator has not yet seen the first one's Job (its labels come from the hold)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from nodus.coordinator.errors import NodusError
from nodus.coordinator.money.budget_store import Budgets
from nodus.coordinator.money.ledger import Kind, Request
from nodus.coordinator.money.ledger_store import Ledger
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.store.base import Event, ListResult, Record, Store
from nodus.coordinator.store.postgres import PostgresStore
from postgres import postgres_cluster  # noqa: F401 - the session fixture

NOW = "2027-01-15T10:00:00Z"
PROJECT = "acme"


class MeetAtCommit(Store):
    """The real store, except that the first write of the project's accounts record (a hold's commit)
    waits until every writer has reached its own: each has read the ledger and checked its Budget by then."""

    def __init__(self, store: Store, meet: asyncio.Barrier) -> None:
        self.inner, self.meet, self.met = store, meet, False

    async def _first_commit(self, key: str) -> None:
        if key.endswith("/accounts") and not self.met:
            self.met = True
            await asyncio.wait_for(self.meet.wait(), 20)

    async def create(self, key: str, value: bytes) -> Record:
        await self._first_commit(key)
        return await self.inner.create(key, value)

    async def update(self, key: str, value: bytes, expected_revision: int | None) -> Record:
        await self._first_commit(key)
        return await self.inner.update(key, value, expected_revision)

    async def delete(self, key: str, expected_revision: int | None = None) -> Record:
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


Opener = Callable[[], Awaitable[Store]]


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Opener, bool]:
    """How to open the store each coordinator uses, and whether each opens its own (PostgreSQL) or
    all share one (the SQLite file has one writer per process)."""
    if request.param == "sqlite":
        return (lambda: SqliteStore.open(tmp_path / "store.db", synchronous="OFF")), False
    url = request.getfixturevalue("postgres_cluster").database()
    return (lambda: PostgresStore.open(url, listen=False)), True


async def _coordinators(opener: Opener, own: bool, n: int) -> tuple[list[Store], list[Store]]:
    """(the stores to close, one store per coordinator)."""
    if own:
        opened = [await opener() for _ in range(n)]
        return opened, opened
    shared = await opener()
    return [shared], [shared] * n


async def _race(writers: list[Store], holds: list[tuple[str, dict[str, str], dict[str, dict[str, str]]]],
                amount: Decimal) -> list[Any]:
    """Each coordinator takes the first hold of one Job (uid, labels, the labels its cache knows) at once."""
    meet = asyncio.Barrier(len(writers))

    async def take(store: Store, uid: str, labels: dict[str, str], known: dict[str, dict[str, str]]) -> Any:
        ledger = Ledger(MeetAtCommit(store, meet))
        guard = await Budgets(ledger.store, ledger).guard(PROJECT, known, labels, f"the first hold of Job {uid}")
        request = Request(f"{uid}/hold/a0", Kind.HOLD, uid, amount, labels=labels)
        try:
            return (await ledger.post(PROJECT, request, NOW, guard))[0]
        except NodusError as e:
            return e

    return await asyncio.gather(*(take(s, *h) for s, h in zip(writers, holds)))


def _one_booked_one_refused(results: list[Any], budget: str) -> NodusError:
    booked = [r for r in results if not isinstance(r, NodusError)]
    refused = [r for r in results if isinstance(r, NodusError)]
    assert len(booked) == 1 and len(refused) == len(results) - 1, results
    err = refused[0]
    assert err.reason == "InsufficientCredits", err
    assert f'budget "{budget}" of project "{PROJECT}"' in err.message and err.extra["budget"] == budget
    return err


def test_two_coordinators_holding_at_once_cannot_overfill_a_budget(stores: tuple[Opener, bool]) -> None:
    opener, own = stores

    async def scenario() -> None:
        opened, writers = await _coordinators(opener, own, 2)
        try:
            ledger = Ledger(writers[0])
            await ledger.post(PROJECT, Request("grant/1", Kind.GRANT, amount=Decimal("100.00")), NOW)
            await Budgets(writers[0], ledger).set(PROJECT, "monthly", "15.00", {})
            labels = {"job-a": {}, "job-b": {}}
            results = await _race(writers, [("job-a", {}, labels), ("job-b", {}, labels)], Decimal("10.00"))
            err = _one_booked_one_refused(results, "monthly")
            assert "has used 10.00 USD of its 15.00 USD this month and leaves 5.00 USD" in err.message
            assert "needs 10.00 USD (5.00 USD more)" in err.message
            accounts = await ledger.accounts(PROJECT)
            assert (accounts.held, accounts.available) == (Decimal("10.00"), Decimal("90.00")), "the credits had room"
            [room] = await Budgets(writers[1], Ledger(writers[1])).report(PROJECT, NOW[:7])
            assert room.used == Decimal("10.00") <= room.budget.amount
        finally:
            for s in opened:
                await s.close()

    asyncio.run(scenario())


def test_a_hold_counts_towards_its_budget_by_the_labels_booked_with_it(stores: tuple[Opener, bool]) -> None:
    """The second coordinator's cache has not seen the first one's Job yet: the hold booked with the
    Job's labels still counts towards the team's Budget, so the team's second hold is refused."""
    opener, own = stores

    async def scenario() -> None:
        opened, writers = await _coordinators(opener, own, 2)
        try:
            ledger = Ledger(writers[0])
            await ledger.post(PROJECT, Request("grant/1", Kind.GRANT, amount=Decimal("100.00")), NOW)
            await Budgets(writers[0], ledger).set(PROJECT, "team-a", "6.00", {"team": "a"})
            team = {"team": "a"}
            results = await _race(writers, [("job-a", team, {"job-a": team}), ("job-b", team, {"job-b": team})],
                                  Decimal("4.00"))
            _one_booked_one_refused(results, "team-a")
            [room] = await Budgets(writers[0], ledger).report(PROJECT, NOW[:7])  # labels from the store: none
            assert room.used == Decimal("4.00") <= room.budget.amount, "counted by the labels of its hold"
            # A Job of another team is not held back by team a's Budget.
            other = await Budgets(writers[1], Ledger(writers[1])).guard(PROJECT, {}, {"team": "b"}, "Job c")
            await Ledger(writers[1]).post(PROJECT, Request("job-c/hold/a0", Kind.HOLD, "job-c", Decimal("50.00"),
                                                           labels={"team": "b"}), NOW, other)
        finally:
            for s in opened:
                await s.close()

    asyncio.run(scenario())


def test_a_replayed_hold_needs_no_room_and_a_renewal_is_checked_like_a_hold(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db", synchronous="OFF")
        try:
            ledger, budgets = Ledger(store), Budgets(store)
            await ledger.post(PROJECT, Request("grant/1", Kind.GRANT, amount=Decimal("100.00")), NOW)
            await budgets.set(PROJECT, "monthly", "5.00", {})
            guard = await budgets.guard(PROJECT, {}, {}, "the first hold of Job a")
            hold = Request("job-a/hold/a0", Kind.HOLD, "job-a", Decimal("5.00"), labels={})
            first, booked = await ledger.post(PROJECT, hold, NOW, guard)
            again, rebooked = await ledger.post(PROJECT, hold, NOW, guard)  # the budget is full now
            assert booked and not rebooked and again == first
            renew = Request("job-a/renew/1", Kind.RENEW, "job-a", Decimal("0.01"), labels={})
            with pytest.raises(NodusError, match='budget "monthly"') as refused:
                await ledger.post(PROJECT, renew, NOW, guard)
            assert refused.value.reason == "InsufficientCredits"
            charge = Request("a0/charge/1", Kind.CHARGE, "a0", Decimal("1.00"), payer="job-a")
            await ledger.post(PROJECT, charge, NOW, guard)  # a charge draws on the hold fitted before
            assert (await ledger.accounts(PROJECT)).seq == 3
        finally:
            await store.close()

    asyncio.run(scenario())
