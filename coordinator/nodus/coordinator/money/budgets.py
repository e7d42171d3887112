"""Budgets: a project's limit per calendar month (UTC), optionally narrowed by a label selector, that
holds must fit as well as the credits (issue 12 part 4).

A Budget's *used* in a month is what was charged that month to the objects whose labels match its
selector (every object of the project when it has none) plus what their live holds reserve. A hold,
a renewal and admission's first-hold check must fit the room every matching Budget leaves (`Room`);
a charge never does: the hold it draws on was fitted when it was taken.

Pure: `rooms` folds the project's postings, its accounts (the live holds) and the labels of its
objects into the room each Budget leaves; `budget_store.py` keeps the Budgets in the store. A charge
or hold of an object whose labels are not known (a Job since deleted) counts only towards the
Budgets without a selector: which labels it had is no longer known.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

from ..errors import NodusError, invalid_value
from .ledger import ZERO, Accounts, Kind, Posting, amount_of

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL = re.compile(r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True, slots=True)
class Budget:
    """A monthly limit of one project's holds and charges."""

    project: str
    name: str
    amount: Decimal
    """USD per calendar month (UTC)."""
    selector: Mapping[str, str] = field(default_factory=dict)
    """Labels an object must carry (all of them) to count; empty: every object of the project."""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with `labels` counts (None: its labels are unknown, a deleted object)."""
        if not self.selector:
            return True
        return labels is not None and all(labels.get(k) == v for k, v in self.selector.items())

    def to_json(self) -> dict[str, Any]:
        return {"project": self.project, "name": self.name, "amountUSD": str(self.amount),
                "selector": dict(sorted(self.selector.items()))}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Budget:
        return cls(doc["project"], doc["name"], Decimal(doc["amountUSD"]), dict(doc.get("selector") or {}))

    @property
    def selector_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


def budget_of(project: str, name: str, amount: str, selector: Mapping[str, str]) -> Budget:
    """A Budget from an operator's request, each field checked with the fix named."""
    if not _NAME.match(name or ""):
        raise NodusError("Invalid", f"name: Invalid value: {name!r}: a budget's name is a DNS label "
                         "(lower-case letters, digits and '-', at most 63)",
                         causes=(invalid_value("name", name, "must be a DNS label"),),
                         fix="name the budget like a Kubernetes object, e.g. monthly or team-a")
    for key, value in selector.items():
        if not _LABEL.match(key) or not _VALUE.match(value):
            raise NodusError("Invalid", f"selector: Invalid value: {key}={value!r}: a selector is label=value "
                             "pairs of Kubernetes label syntax",
                             causes=(invalid_value("selector", f"{key}={value}", "must be label syntax"),),
                             fix="send --selector team=a,env=prod")
    return Budget(project, name, amount_of(amount), dict(selector))


@dataclass(frozen=True, slots=True)
class Room:
    """What one Budget has used this month and what it leaves."""

    budget: Budget
    used: Decimal
    """Charged this month to its objects, plus what their live holds reserve."""

    @property
    def left(self) -> Decimal:
        return max(self.budget.amount - self.used, ZERO)

    def to_json(self, month: str) -> dict[str, Any]:
        return {**self.budget.to_json(), "month": month, "usedUSD": str(self.used), "leftUSD": str(self.left)}


def rooms(budgets: Iterable[Budget], accounts: Accounts, postings: Sequence[Posting],
          labels: Mapping[str, Mapping[str, str]], month: str) -> list[Room]:
    """The room each Budget leaves in `month` ("2026-12"): `postings` are the project's (charges are
    counted by the object they are listed under, a Job for its attempts), `accounts` its balances (the
    live holds), `labels` the labels of the objects by uid as the caller knows them; an object it does
    not know counts with the labels its last hold was booked with (Request.labels)."""
    charged: dict[str, Decimal] = {}
    booked: dict[str, Mapping[str, str]] = {}
    for p in postings:
        if p.kind is Kind.CHARGE and p.time[:7] == month:
            charged[p.owner] = charged.get(p.owner, ZERO) + p.amount
        elif p.kind in (Kind.HOLD, Kind.RENEW) and p.labels is not None:
            booked[p.obj] = p.labels
    labels = {**booked, **labels}
    holding = {k[len("held/"):]: v for k, v in accounts.balances.items() if k.startswith("held/") and v > 0}
    out = []
    for budget in budgets:
        used = ZERO
        for owner in charged.keys() | holding.keys():
            if budget.matches(labels.get(owner)):
                used += charged.get(owner, ZERO) + holding.get(owner, ZERO)
        out.append(Room(budget, used))
    return out


def matching(all_rooms: Iterable[Room], labels: Mapping[str, str] | None) -> list[Room]:
    """The rooms of the Budgets an object with `labels` counts towards."""
    return [r for r in all_rooms if r.budget.matches(labels)]


def tightest(all_rooms: Iterable[Room]) -> Room | None:
    """The Budget that leaves the least room (None: no Budget applies)."""
    return min(all_rooms, key=lambda r: (r.left, r.budget.name), default=None)


def exhausted(room: Room, needed: Decimal, what: str) -> NodusError:
    """The refusal of a hold of `needed` USD that `room` cannot take: InsufficientCredits (the path
    every client and the Job controller already follow for money), naming the Budget and its fix."""
    b = room.budget
    narrowed = f" (objects labelled {b.selector_text})" if b.selector else ""
    command = f"nodus budgets set --project {b.project} --name {b.name} --amount AMOUNT" + (
        f" --selector {b.selector_text}" if b.selector else "")
    return NodusError(
        "InsufficientCredits",
        f'budget "{b.name}" of project "{b.project}"{narrowed} has used {room.used} USD of its {b.amount} USD '
        f"this month and leaves {room.left} USD; {what} needs {needed} USD ({needed - room.left} USD more)",
        fix=f"ask an operator to raise the budget to at least {room.used + needed} USD ({command}), wait for "
            "running work to release its holds or for the next calendar month, or lower maxCostUSD",
        extra={"neededUSD": str(needed), "availableUSD": str(room.left), "budget": b.name})


def refusal(all_rooms: Iterable[Room], needed: Decimal, what: str) -> NodusError | None:
    """The refusal of a hold of `needed` by the tightest matching Budget that cannot take it, or None."""
    short = [r for r in all_rooms if needed > r.left]
    room = tightest(short)
    return None if room is None else exhausted(room, needed, what)
