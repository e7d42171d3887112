"""Budgets in the store, and the room they leave, read from the ledger (budgets.py is the pure part).

    _budgets/<project>/<name>    one Budget (amountUSD, selector), written by operators

Everything a controller needs is in the store. A hold or a renewal is checked against the Budgets
inside the ledger's compare-and-swap (`BudgetGuard`, passed to Ledger.post), so holds taken at once
by several coordinators never overfill one; admission reads the rooms here before a create.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Mapping

import orjson

from ..errors import NodusError
from ..store.base import Store
from .budgets import Budget, Room, budget_of, matching, refusal, rooms
from .ledger import Accounts, Kind, Request
from .ledger_store import Ledger

PREFIX = "_budgets/"


def _key(project: str, name: str) -> str:
    return f"{PREFIX}{project}/{name}"


@dataclass(frozen=True, slots=True)
class BudgetGuard:
    """The Budgets one object counts towards, checked by Ledger.post on the state a hold or renewal
    of it commits on (charges and releases pass: the hold a charge draws on was fitted when taken)."""

    budgets: tuple[Budget, ...]
    labels: Mapping[str, Mapping[str, str]]
    """The labels of the project's objects by uid, as the caller knows them (budgets.rooms)."""
    what: str
    """The hold, in the refusal's words ("the first hold of Job train")."""

    async def check(self, ledger: Ledger, accounts: Accounts, request: Request, now: str) -> None:
        if not self.budgets or request.kind not in (Kind.HOLD, Kind.RENEW) or request.amount is None:
            return
        postings = await ledger.postings_through(accounts.project, accounts.seq)
        found = rooms(self.budgets, accounts, postings, self.labels, now[:7])
        over = refusal(found, request.amount, self.what)
        if over is not None:
            raise over


class Budgets:
    """The Budgets of every project in `store`."""

    def __init__(self, store: Store, ledger: Ledger | None = None) -> None:
        self.store = store
        self.ledger = ledger or Ledger(store)

    async def set(self, project: str, name: str, amount: str, selector: Mapping[str, str]) -> Budget:
        """Creates or replaces Budget `name` of `project` (the last write wins: it is an operator's limit)."""
        budget = budget_of(project, name, amount, selector)
        value = orjson.dumps(budget.to_json())
        while True:
            rec = await self.store.get(_key(project, name))
            try:
                if rec is None:
                    await self.store.create(_key(project, name), value)
                else:
                    await self.store.update(rec.key, value, rec.revision)
                return budget
            except NodusError as e:
                if e.reason not in ("Conflict", "AlreadyExists"):
                    raise

    async def delete(self, project: str, name: str) -> Budget:
        rec = await self.store.get(_key(project, name))
        if rec is None:
            raise NodusError("NotFound", f'budget "{name}" of project "{project}" not found', name=name,
                             kind="budgets", fix=f"list the project's budgets: nodus budgets ls --project {project}")
        await self.store.delete(rec.key, rec.revision)
        return Budget.from_json(orjson.loads(rec.value))

    async def of_project(self, project: str) -> list[Budget]:
        """The Budgets of `project` ("": of every project), ordered by project and name."""
        prefix = f"{PREFIX}{project}/" if project else PREFIX
        out, after = [], None
        while True:
            page = await self.store.list(prefix, limit=500, start_after=after)
            out += [Budget.from_json(orjson.loads(r.value)) for r in page.records]
            if not page.more:
                return out
            after = page.records[-1].key

    async def guard(self, project: str, labels: Mapping[str, Mapping[str, str]], of: Mapping[str, str],
                    what: str) -> BudgetGuard:
        """The check a hold or renewal of an object labelled `of` must pass inside the ledger's CAS
        (Ledger.post's guard): the room of every Budget it counts towards. The Budgets themselves are
        read here, once: an operator's change to one applies from the next hold."""
        return BudgetGuard(tuple(b for b in await self.of_project(project) if b.matches(of)), labels, what)

    async def rooms(self, project: str, labels: Mapping[str, Mapping[str, str]], month: str,
                    of: Mapping[str, str] | None = None, *, only_matching: bool = True) -> list[Room]:
        """The room each Budget of `project` leaves in `month`; with `only_matching`, only those an
        object labelled `of` counts towards. No Budget: no ledger read."""
        budgets = await self.of_project(project)
        if only_matching:
            budgets = [b for b in budgets if b.matches(of)]
        if not budgets:
            return []
        accounts = await self.ledger.accounts(project)
        postings = await self.ledger.postings(project)
        found = rooms(budgets, accounts, postings, labels, month)
        return matching(found, of) if only_matching else found

    async def first_hold_refusal(self, project: str, labels: Mapping[str, Mapping[str, str]], month: str,
                                 of: Mapping[str, str], hold: Decimal, what: str) -> dict[str, str] | None:
        """The entry of status.estimate.blockingReasons when a Budget an object labelled `of` counts
        towards cannot take `hold`, the first hold of `what` (None when all can): admission shows it on
        a dry run and refuses a real create with the same words (as credits.first_hold_refusal)."""
        over = refusal(await self.rooms(project, labels, month, of), hold, f"the first hold of {what}")
        if over is None:
            return None
        return {"code": over.reason, "message": over.message, "fix": over.effective_fix, "budget": over.extra["budget"]}

    async def labels_in_store(self, project: str) -> dict[str, dict[str, str]]:
        """The labels of the project's Jobs by uid, read from the store (for a reader without the
        controllers' cache: the operator API)."""
        out: dict[str, dict[str, str]] = {}
        after = None
        while True:
            page = await self.store.list(f"jobs/{project}/", limit=500, start_after=after)
            for r in page.records:
                meta = orjson.loads(r.value).get("metadata") or {}
                if meta.get("uid"):
                    out[meta["uid"]] = dict(meta.get("labels") or {})
            if not page.more:
                return out
            after = page.records[-1].key

    async def report(self, project: str, month: str) -> list[Room]:
        """Every Budget of `project` ("": of every project) with what it used in `month`."""
        budgets = await self.of_project(project)
        out: list[Room] = []
        for name in sorted({b.project for b in budgets}):
            out += await self.rooms(name, await self.labels_in_store(name), month, only_matching=False)
        return out
