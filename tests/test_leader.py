"""The controllers' leader lease and the fence on controller writes (docs/adr/0043-leader-lease-and-fencing.md):
the store's lease API on both engines, a deposed holder's fenced write refused by the store (on
PostgreSQL after its connections were killed with pg_terminate_backend), and the leadership loop
starting and stopping the controllers."""
from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nodus.coordinator.controllers.leader import Answer, Decision, LeaderSettings, Leadership, Term, decide
from nodus.coordinator.errors import NodusError
from nodus.coordinator.store import SqliteStore, Store
from nodus.coordinator.store.lease import CONTROLLERS, FENCE, Fence, Lease
from nodus.coordinator.store.pg_lease import FENCE_EPOCHS
from nodus.coordinator.store.postgres import PostgresStore
from postgres import postgres_cluster  # noqa: F401 - the session fixture
from test_store import Backend, backend, run  # noqa: F401 - the two-engine fixture


async def fenced(fence: Fence, write: Any) -> Any:
    """Runs the write coroutine function in a task whose context carries `fence`, as a controller's."""
    context = contextvars.copy_context()
    context.run(FENCE.set, fence)
    return await asyncio.create_task(write(), context=context)


async def run_out(store: Store, name: str) -> None:
    """Waits until the lease `name` has run out on the store's clock."""
    while (lease := await store.read_lease(name)) is not None and lease.remaining > 0:
        await asyncio.sleep(0.02)


def test_a_takeover_raises_the_epoch_and_the_old_holders_fenced_writes_are_refused(backend: Backend) -> None:
    async def body() -> None:
        store = await backend.open()
        try:
            won = await store.claim_lease(CONTROLLERS, "a", 0.2)
            assert (won.holder, won.epoch) == ("a", 1)
            other = await store.claim_lease(CONTROLLERS, "b", 0.2)
            assert (other.holder, other.epoch) == ("a", 1)  # a holds it: b only sees who leads
            renewed = await store.claim_lease(CONTROLLERS, "a", 0.2)
            assert (renewed.holder, renewed.epoch) == ("a", 1)  # a renewal keeps the epoch
            a = Fence(CONTROLLERS, 1)
            assert (await fenced(a, lambda: store.create("jobs/p/one", b"1"))).revision == 1

            await run_out(store, CONTROLLERS)
            taken = await store.claim_lease(CONTROLLERS, "b", 30)
            assert (taken.holder, taken.epoch) == ("b", 2)
            with pytest.raises(NodusError) as refused:
                await fenced(a, lambda: store.create("jobs/p/two", b"2"))
            assert refused.value.reason == "LeaderDeposed"
            assert "epoch 1" in refused.value.message and "epoch 2" in refused.value.message
            with pytest.raises(NodusError) as refused:
                await fenced(a, lambda: store.update("jobs/p/one", b"x", None))
            assert refused.value.reason == "LeaderDeposed"
            with pytest.raises(NodusError) as refused:  # a Job and its first attempt (ADR 0108): refused whole
                await fenced(a, lambda: store.create_together([("jobs/p/two", b"2"), ("attempts/p/two-0-1", b"t")]))
            assert refused.value.reason == "LeaderDeposed"
            assert await store.get("jobs/p/two") is None and await store.get("attempts/p/two-0-1") is None
            assert (await store.get("jobs/p/one")).value == b"1"

            b = Fence(CONTROLLERS, 2)
            assert (await fenced(b, lambda: store.create("jobs/p/two", b"b"))).value == b"b"
            assert (await store.create("jobs/p/client", b"c")).value == b"c"  # unfenced: a client's write
            assert (await store.claim_lease(CONTROLLERS, "a", 30)).holder == "b"

            await store.release_lease(CONTROLLERS, "b")  # a graceful stop: the next claimant need not wait
            back = await store.claim_lease(CONTROLLERS, "a", 30)
            assert (back.holder, back.epoch) == ("a", 3)
        finally:
            await store.close()
    run(body)


def test_a_leader_cut_off_from_postgresql_cannot_commit_after_its_epoch_moved(postgres_cluster: Any) -> None:  # noqa: F811
    url = postgres_cluster.database()

    async def body() -> None:
        a = await PostgresStore.open(url, application_name="nodus-test-a")
        b = await PostgresStore.open(url, application_name="nodus-test-b")
        try:
            lease = await a.claim_lease(CONTROLLERS, "a", 0.3)
            fence = Fence(CONTROLLERS, lease.epoch)
            await fenced(fence, lambda: a.create("attempts/p/before", b"1"))
            with psycopg.connect(postgres_cluster.url("postgres"), autocommit=True) as admin:
                killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE application_name = 'nodus-test-a'").fetchone()
            assert killed is not None and killed[0] >= 2  # its writer, its pool, its LISTEN
            await run_out(b, CONTROLLERS)
            taken = await b.claim_lease(CONTROLLERS, "b", 30)
            assert taken.epoch == lease.epoch + 1
            head = (await b.list("")).revision

            # a still believes it leads: its next controller write reconnects and is refused in the
            # write's own transaction.
            with pytest.raises(NodusError) as refused:
                await fenced(fence, lambda: a.create("attempts/p/after", b"2"))
            assert refused.value.reason == "LeaderDeposed", refused.value.message
            with pytest.raises(NodusError) as refused:
                await fenced(fence, lambda: a.update("attempts/p/before", b"3", None))
            assert refused.value.reason == "LeaderDeposed"
            assert await b.get("attempts/p/after") is None
            assert (await b.get("attempts/p/before")).value == b"1"  # type: ignore[union-attr]
            with psycopg.connect(url, autocommit=True) as check:
                late = check.execute("SELECT count(*) FROM log WHERE revision > %s AND epoch = %s",
                                     (head, lease.epoch)).fetchone()
                first = check.execute("SELECT epoch FROM log WHERE key = 'attempts/p/before'").fetchone()
            assert late == (0,)
            assert first == (lease.epoch,)  # fenced writes record the epoch they committed under
            # Unfenced writes (a client's, an agent's report) through the cut-off replica still commit.
            assert (await a.create("jobs/p/client", b"c")).value == b"c"
        finally:
            await a.close()
            await b.close()
    run(body)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def lead(self, fence: Fence) -> None:
        self.calls.append(f"lead {fence.epoch}")

    async def abdicate(self) -> None:
        self.calls.append("abdicate")


class Clock:
    """The leadership's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Unreachable(SqliteStore):
    """A store whose lease claims fail while `down` (the database unreachable)."""

    down = False

    async def claim_lease(self, name: str, holder: str, duration: float) -> Lease:
        if self.down:
            raise NodusError("ServiceUnavailable", "cannot reach the store")
        return await super().claim_lease(name, holder, duration)


def test_the_leadership_loop_starts_the_controllers_once_and_stops_them_when_the_lease_is_lost(tmp_path: Path) -> None:
    async def body() -> None:
        store: Any = await Unreachable.open(tmp_path / "store.db")
        settings = LeaderSettings(duration=0.2, renew_interval=0.1)
        first, second = Recorder(), Recorder()
        clock = Clock()
        a = Leadership(store, settings, first.lead, first.abdicate, holder="a", clock=clock)
        b = Leadership(store, settings, second.lead, second.abdicate, holder="b", clock=clock)
        try:
            await a.tick()
            await a.tick()  # a renewal starts nothing again
            await b.tick()
            assert (a.role, a.epoch, first.calls) == ("leader", 1, ["lead 1"])
            assert (b.role, b.epoch, second.calls) == ("follower", 1, [])

            store.down = True  # a renewal fails: a leads on while the lease it renewed holds
            await a.tick()
            assert (a.role, first.calls) == ("leader", ["lead 1"])
            # ... and stops its controllers once it ran out, with no renewal answered (0.21: the store's 0.2 s left is
            # monotonic-clock arithmetic, a hair over or under 0.2)
            clock.now += 0.21
            await a.tick()
            assert (a.role, first.calls) == ("follower", ["lead 1", "abdicate"])
            store.down = False
            await run_out(store, CONTROLLERS)
            await b.tick()
            assert (b.role, b.epoch, second.calls) == ("leader", 2, ["lead 2"])
            await a.tick()
            assert (a.role, a.epoch, first.calls) == ("follower", 2, ["lead 1", "abdicate"])

            await b.stop()  # a graceful stop releases the lease: a takes over on its next claim
            assert second.calls == ["lead 2", "abdicate"]
            await a.tick()
            assert (a.role, a.epoch, first.calls) == ("leader", 3, ["lead 1", "abdicate", "lead 3"])
        finally:
            await store.close()
    run(body)


def test_the_renew_interval_must_fit_twice_in_the_lease(tmp_path: Path) -> None:
    async def body() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            recorder = Recorder()
            with pytest.raises(ValueError, match="at most half"):
                Leadership(store, LeaderSettings(duration=2, renew_interval=1.5), recorder.lead, recorder.abdicate)
        finally:
            await store.close()
    run(body)


class _GatedClaims:
    """A store double whose lease claim waits on `gate`: the test decides when the claim answers."""

    def __init__(self) -> None:
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.claimed = asyncio.Event()

    async def claim_lease(self, name: str, holder: str, duration: float) -> Lease:
        self.claimed.set()
        await self.gate
        return Lease(name, "another-replica", 7, duration)


def test_stopping_while_a_lease_claim_answers_still_stops_the_loop() -> None:
    """SIGTERM's stop() cancels the leadership loop; a claim answered in the same loop iteration must
    not swallow that cancellation (asyncio.wait_for on Python 3.11 returns the result instead), or the
    coordinator never exits (test_durability's SIGTERM test on PostgreSQL under load)."""
    async def main() -> None:
        store = _GatedClaims()
        noop = Recorder()
        leadership = Leadership(store, LeaderSettings(duration=10, renew_interval=2), noop.lead,  # type: ignore[arg-type]
                                noop.abdicate, holder="me")
        leadership.start()
        await store.claimed.wait()
        store.gate.set_result(None)  # the claim resumes first in the next iteration, then the cancel lands
        await asyncio.wait_for(leadership.stop(), 5)
        assert leadership.role == "follower"

    asyncio.run(main())


def test_a_slow_or_failed_renewal_keeps_the_term_until_its_lease_runs_out() -> None:
    """The decision alone (ADR 0110): the lease claimed at `sent` for `remaining` seconds holds until
    sent + remaining by this replica's clock, whatever the renewals since do."""
    term = Term(Fence(CONTROLLERS, 4), valid_until=110.0)
    mine = Lease(CONTROLLERS, "me", 4, 10.0)

    assert decide("me", term, None, now=109.9) == Decision(term)  # a renewal slower than the interval
    assert decide("me", term, Answer(None, 100.0, "timeout"), now=105.0) == Decision(term)
    lost = decide("me", term, None, now=110.0)
    assert (lost.term, lost.start) == (None, False) and "no renewal answered" in lost.stop
    failed = decide("me", term, Answer(None, 100.0, "connection refused"), now=110.5)
    assert failed.term is None and "connection refused" in failed.stop

    renewed = decide("me", term, Answer(mine, sent=103.0), now=109.0)  # answered late, still in time
    assert renewed == Decision(Term(Fence(CONTROLLERS, 4), 113.0))
    late = decide("me", term, Answer(mine, sent=103.0), now=113.0)
    assert late.term is None and "after the lease ran out" in late.stop

    other = decide("me", term, Answer(Lease(CONTROLLERS, "b", 5, 9.0), 104.0), now=104.1)
    assert other.term is None and "b holds it at epoch 5" in other.stop
    moved = decide("me", term, Answer(Lease(CONTROLLERS, "me", 6, 10.0), 104.0), now=104.1)
    assert moved == Decision(Term(Fence(CONTROLLERS, 6), 114.0), "the epoch moved to 6", start=True)

    assert decide("me", None, Answer(mine, 100.0), now=100.2) == Decision(Term(Fence(CONTROLLERS, 4), 110.0),
                                                                           start=True)
    assert decide("me", None, Answer(Lease(CONTROLLERS, "b", 5, 9.0), 100.0), now=100.2) == Decision(None)
    assert decide("me", None, None, now=100.2) == Decision(None)


class _HeldRenewals:
    """A store double that grants the first claim and holds every later one until the test lets it go."""

    def __init__(self) -> None:
        self.claims = 0
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def claim_lease(self, name: str, holder: str, duration: float) -> Lease:
        self.claims += 1
        if self.claims > 1:
            await self.gate
        return Lease(name, holder, 1, duration)


def test_a_leader_whose_renewal_hangs_stops_only_once_its_lease_ran_out() -> None:
    async def main() -> None:
        store = _HeldRenewals()
        clock = Clock()
        recorder = Recorder()
        stopped = asyncio.Event()

        async def abdicate() -> None:
            await recorder.abdicate()
            stopped.set()
        leadership = Leadership(store, LeaderSettings(duration=10, renew_interval=0.01), recorder.lead,  # type: ignore[arg-type]
                                abdicate, holder="me", clock=clock)
        await leadership.tick()
        assert (leadership.role, recorder.calls) == ("leader", ["lead 1"])
        renewal = asyncio.create_task(leadership.tick())  # held: the renewal does not answer
        while store.claims < 2:
            await asyncio.sleep(0)
        clock.now += 9.9
        assert leadership.role == "leader"
        clock.now += 0.1  # the lease the first claim won has run out by this clock
        await asyncio.wait_for(stopped.wait(), 30)
        assert (leadership.role, recorder.calls) == ("follower", ["lead 1", "abdicate"])
        store.gate.set_result(None)  # the renewal answers after all: a new term at the same epoch
        await asyncio.wait_for(renewal, 30)
        assert leadership.role == "follower"  # it answered after the lease it renewed ran out
        await leadership.tick()
        assert (leadership.role, recorder.calls) == ("leader", ["lead 1", "abdicate", "lead 1"])

    asyncio.run(main())


def test_a_renewal_does_not_wait_for_a_fenced_batch_but_a_takeover_does(postgres_cluster: Any) -> None:  # noqa: F811
    """A write batch holds the fence's lock on the lease row until it commits; the holder's renewal goes
    through meanwhile (it used to wait for it, and on a busy host that outlasted the renew interval),
    while a takeover waits for the batch, so the batch commits under the epoch it read (ADR 0110)."""
    url = postgres_cluster.database()

    async def body() -> None:
        a = await PostgresStore.open(url, application_name="nodus-test-a")
        b = await PostgresStore.open(url, application_name="nodus-test-b")
        batch = await psycopg.AsyncConnection.connect(url)
        try:
            won = await a.claim_lease(CONTROLLERS, "a", 30)
            await batch.execute("BEGIN")  # a write batch mid-transaction, as the store's writer reads the fence
            read = await (await batch.execute(FENCE_EPOCHS, ([CONTROLLERS],))).fetchall()
            assert read == [(CONTROLLERS, won.epoch)]

            renewed = await asyncio.wait_for(a.claim_lease(CONTROLLERS, "a", 30), 30)
            assert (renewed.holder, renewed.epoch) == ("a", won.epoch)
            assert batch.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still holding

            await a.release_lease(CONTROLLERS, "a")
            takeover = asyncio.create_task(b.claim_lease(CONTROLLERS, "b", 30))
            with psycopg.connect(url, autocommit=True) as admin:
                while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                    "'nodus-test-b' AND wait_event_type = 'Lock'").fetchone() != (1,):
                    assert not takeover.done(), takeover
                    await asyncio.sleep(0.01)
            assert not takeover.done()
            await batch.execute("COMMIT")
            taken = await asyncio.wait_for(takeover, 30)
            assert (taken.holder, taken.epoch) == ("b", won.epoch + 1)
        finally:
            await batch.close()
            await a.close()
            await b.close()
    run(body)
