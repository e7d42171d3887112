"""The ledger in the store: append-only postings, one balance record per project, each posting at most once.

    _ledger/<project>/accounts          balances after `seq` postings, and the posting not yet appended
    _ledger/<project>/postings/<seq>    each posting, written once, never changed (seq zero-padded)
    _ledger/<project>/keys/<key>        which seq an idempotency key was booked as
    _ledger/<project>/objects/<owner>/<seq>   a copy of each posting of one object (a Job: its holds
                                        and the charges of its attempts), for its status.cost

The store changes one key atomically (create, or update compare-and-swapped on the revision), and a
posting touches three keys. So the commit point is one write: the CAS of the accounts record that
sets the new balances together with the posting itself as `pending`. Before it nothing is booked;
after it the balance change and the posting are both durable, in the same record. Only then are the
posting and its key appended (creates of new keys, so a repeat is harmless) and `pending` cleared.

A kill -9 at any point therefore leaves one of two states: nothing booked (a retry books it once), or
booked with the append possibly unfinished. Every writer and reader that finds `pending` finishes
the append first, and no writer commits while a posting is pending, so every booked key is appended
before the next commit. A writer checks its key after reading an accounts record without `pending`,
and commits with that record's revision: a concurrent commit of the same key changes the record and
fails the CAS, and the retry then finds the key. So a retried or replayed posting is never booked twice.

A hold may have to fit more than the credits: a `Guard` (budget_store.BudgetGuard: every Budget the
object counts towards) is checked inside the same loop, on the accounts record the commit is
compare-and-swapped on and the postings through its seq. Whatever another writer books in between
changes that record, fails the CAS, and the retry checks again on the new state: two coordinators
taking holds at once can never both fit a room that takes only one (ADR 0031).
"""
from __future__ import annotations

from typing import Protocol

import orjson

from ..errors import NodusError
from ..store.base import Record, Store
from .ledger import Accounts, Posting, Request, decide

PREFIX = "_ledger/"


def _accounts_key(project: str) -> str:
    return f"{PREFIX}{project}/accounts"


def _posting_key(project: str, seq: int) -> str:
    return f"{PREFIX}{project}/postings/{seq:012d}"


def _idempotency_key(project: str, key: str) -> str:
    return f"{PREFIX}{project}/keys/{key}"


def _owner_prefix(project: str, owner: str) -> str:
    return f"{PREFIX}{project}/objects/{owner}/"


class Guard(Protocol):
    """A limit besides the credits that a posting must fit, checked on the state it commits on."""

    async def check(self, ledger: Ledger, accounts: Accounts, request: Request, now: str) -> None:
        """Raises (InsufficientCredits, naming the limit) when `request` does not fit `accounts`, the
        project's balances after its first `accounts.seq` postings (`ledger.postings_through`)."""


class Ledger:
    """Postings of every project in `store`; safe to use from several coordinators at once."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def _head(self, project: str) -> tuple[Record | None, Accounts, Posting | None]:
        rec = await self.store.get(_accounts_key(project))
        if rec is None:
            return None, Accounts(project), None
        doc = orjson.loads(rec.value)
        pending = doc.get("pending")
        return rec, Accounts.from_json(doc["accounts"]), None if pending is None else Posting.from_json(pending)

    async def _append(self, project: str, posting: Posting) -> None:
        """Writes the booked `posting` and its key (each a create, so finishing twice changes nothing)."""
        writes = [(_posting_key(project, posting.seq), posting.to_json())]
        if posting.owner:
            writes.append((f"{_owner_prefix(project, posting.owner)}{posting.seq:012d}", posting.to_json()))
        writes.append((_idempotency_key(project, posting.key), {"seq": posting.seq}))  # last: it marks the append done
        for key, value in writes:
            try:
                await self.store.create(key, orjson.dumps(value))
            except NodusError as e:
                if e.reason != "AlreadyExists":
                    raise

    async def _finish(self, project: str, rec: Record, accounts: Accounts, pending: Posting) -> None:
        """Appends `pending` and clears it. A Conflict means another writer finished it: it must have,
        since nothing commits while a posting is pending."""
        await self._append(project, pending)
        value = orjson.dumps({"accounts": accounts.to_json(), "pending": None})
        try:
            await self.store.update(rec.key, value, rec.revision)
        except NodusError as e:
            if e.reason != "Conflict":
                raise

    async def accounts(self, project: str) -> Accounts:
        """The project's balances (a posting still pending is booked already, so it counts)."""
        return (await self._head(project))[1]

    async def find(self, project: str, key: str) -> Posting | None:
        """The posting booked under idempotency key `key`, or None."""
        rec, _, pending = await self._head(project)
        if pending is not None and pending.key == key:
            return pending
        index = await self.store.get(_idempotency_key(project, key))
        if index is None:
            return None
        posting = await self.store.get(_posting_key(project, int(orjson.loads(index.value)["seq"])))
        assert posting is not None  # a key is appended after its posting
        return Posting.from_json(orjson.loads(posting.value))

    async def postings(self, project: str, owner: str = "") -> list[Posting]:
        """Every posting of the project (or only those listed under `owner`), in the order booked."""
        rec, accounts, pending = await self._head(project)
        if rec is not None and pending is not None:
            await self._finish(project, rec, accounts, pending)
        prefix = _owner_prefix(project, owner) if owner else f"{PREFIX}{project}/postings/"
        out, after = [], None
        while True:
            page = await self.store.list(prefix, limit=500, start_after=after)
            out += [Posting.from_json(orjson.loads(r.value)) for r in page.records]
            if not page.more:
                return out
            after = page.records[-1].key

    async def postings_through(self, project: str, seq: int) -> list[Posting]:
        """The project's first `seq` postings (all appended once its accounts record at `seq` has no
        posting pending), for a Guard checking against that record."""
        out: list[Posting] = []
        after = None
        while len(out) < seq:
            page = await self.store.list(f"{PREFIX}{project}/postings/", limit=min(500, seq - len(out)),
                                         start_after=after)
            out += [Posting.from_json(orjson.loads(r.value)) for r in page.records]
            if not page.more:
                break
            after = page.records[-1].key
        return [p for p in out if p.seq <= seq]

    async def post(self, project: str, request: Request, now: str, guard: Guard | None = None) -> tuple[Posting, bool]:
        """Books `request` once: (the posting, True) when booked now, (the earlier posting, False) when
        its key was booked before. A key booked for a different request is refused (AlreadyExists);
        a hold or charge the credits cannot cover, or that `guard` refuses on the state it would commit
        on, is refused (InsufficientCredits) and books nothing. A replay needs no room."""
        while True:
            rec, accounts, pending = await self._head(project)
            if rec is not None and pending is not None:
                await self._finish(project, rec, accounts, pending)
                continue
            earlier = await self.find(project, request.key)
            if earlier is not None:
                if not request.same_as(earlier):
                    raise NodusError(
                        "AlreadyExists", f'ledger key "{request.key}" of project "{project}" was used for a '
                        f"{earlier.kind.value} of {earlier.requested} USD for {earlier.obj or project!r}; "
                        "a key names one posting forever", name=request.key, kind="postings",
                        fix="retry with exactly the same request, or use a new request id for a new posting")
                return earlier, False
            posting = decide(accounts, request, now)
            if guard is not None:
                await guard.check(self, accounts, request, now)
            booked = accounts.apply(posting)
            value = orjson.dumps({"accounts": booked.to_json(), "pending": posting.to_json()})
            try:
                committed = (await self.store.create(_accounts_key(project), value) if rec is None
                             else await self.store.update(rec.key, value, rec.revision))
            except NodusError as e:
                if e.reason in ("Conflict", "AlreadyExists"):
                    continue
                raise
            await self._finish(project, committed, booked, posting)
            return posting, True

