"""The ledger: prepaid credits, holds and charges of one project, double-entry and exact to the cent.

Accounts of a project (amounts are Decimal USD, never negative except `funding`):

    funding          where grants come from; minus everything ever granted
    available        credits that no hold reserves
    held/<object>    what a hold reserves for one object (a Job, an Attempt)
    spent/<object>   what has been charged to one object

Every posting is a list of legs, each moving an amount from one account to another, so the sum over
all accounts is zero after every posting. Every posting carries an idempotency key
(`grant/<request id>`, `<attempt uid>/charge/<increment n>`): a posting whose key was used
before is never applied again, whoever retries it and however often.

This module is the pure core: `decide` turns a `Request` and the current `Accounts` into a `Posting`
(or refuses with InsufficientCredits naming the amounts and the fix), `Accounts.apply` books it.
`ledger_store.py` writes postings to the store.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from ..errors import NodusError, invalid_value
from .estimate import CENT

ZERO = Decimal("0.00")
FUNDING, AVAILABLE = "funding", "available"
MAX_AMOUNT = Decimal("1000000000")
"""A grant or hold above a billion USD is a typo, not a purchase."""


def held(obj: str) -> str:
    return f"held/{obj}"


def spent(obj: str) -> str:
    return f"spent/{obj}"


class Kind(enum.Enum):
    """What a posting does."""

    GRANT = "Grant"
    """An operator adds credits: funding → available."""
    HOLD = "Hold"
    """Credits are reserved for an object before it spends them: available → held/<object>."""
    RENEW = "Renew"
    """A hold grows as it is used, by the amount of the next increments: available → held/<object>."""
    RELEASE = "Release"
    """What a hold still reserves goes back: held/<object> → available (all of it unless an amount is given)."""
    CHARGE = "Charge"
    """Time used is charged: held/<payer> → spent/<object>, and from available what the hold does not
    cover (the payer is the object itself unless named: a Job's hold pays for its attempts)."""


class Segment(enum.Enum):
    """Which part of an allocation a charge is for (issue 12 part 4)."""

    NONE = ""
    """Not a charge."""
    BOOT = "Boot"
    """From allocation until the program started."""
    RUNNING = "Running"
    """The program ran."""
    RESTORE = "Restore"
    """A replacement brought its state back."""
    TEARDOWN = "Teardown"
    """From stop until the node was released."""
    STORAGE = "Storage"
    """Checkpoints and outputs above the free inclusion, by the GiB-month (money/storage.py)."""


def amount_of(value: Any, field_name: str = "amountUSD") -> Decimal:
    """A positive amount of whole cents from a decimal string (or a Decimal); floats are refused,
    since a float cannot say 0.10 exactly."""
    if isinstance(value, float) or isinstance(value, bool):
        raise _bad(field_name, value, "must be a decimal string such as \"25.00\", not a number")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise _bad(field_name, value, 'must be a decimal amount of USD such as "25.00"') from None
    if not amount.is_finite() or amount <= 0:
        raise _bad(field_name, value, "must be more than 0")
    if amount != amount.quantize(CENT):
        raise _bad(field_name, value, "must be whole cents (at most 2 decimal places)")
    if amount > MAX_AMOUNT:
        raise _bad(field_name, value, f"must be at most {MAX_AMOUNT}")
    return amount.quantize(CENT)


def _bad(field_name: str, value: Any, detail: str) -> NodusError:
    return NodusError("Invalid", f"{field_name}: Invalid value: {str(value)!r}: {detail}",
                      causes=(invalid_value(field_name, str(value), detail),))


@dataclass(frozen=True, slots=True)
class Leg:
    """One move of `amount` from account `source` to account `target`."""

    source: str
    target: str
    amount: Decimal


@dataclass(frozen=True, slots=True)
class Request:
    """What a caller asks the ledger to post; `key` makes it happen at most once."""

    key: str
    kind: Kind
    obj: str = ""
    """The object a hold or charge is for (its uid); empty for grants."""
    amount: Decimal | None = None
    """None only for a release of the whole hold."""
    segment: Segment = Segment.NONE
    note: str = ""
    """Who granted and why; shown in the posting list."""
    payer: str = ""
    """The object whose hold a charge draws on (a Job's hold pays for its attempts); empty: its own."""
    labels: Mapping[str, str] | None = None
    """A hold's or renewal's object's labels, booked with it so that every coordinator's Budget check
    knows which Budgets the hold counts towards (budgets.rooms), even for a Job its cache has not seen."""

    def same_as(self, posting: Posting) -> bool:
        """Whether `posting` was made for this request (a replay), not for another under the same key.
        A charge's segment may be named differently on a replay (a late report of the program's start),
        and the first naming stands (ledger_charges.py)."""
        return (posting.kind, posting.obj, posting.requested, posting.payer) == (
            self.kind, self.obj, self.amount, self.payer)


@dataclass(frozen=True, slots=True)
class Posting:
    """One booked change, append-only once written."""

    key: str
    kind: Kind
    obj: str
    requested: Decimal | None
    """The amount the request named (None: release everything held)."""
    legs: tuple[Leg, ...]
    time: str
    """RFC 3339, when it was booked; charges count to the calendar month (UTC) of this time."""
    segment: Segment = Segment.NONE
    note: str = ""
    seq: int = 0
    """Position in the project's ledger, from 1."""
    payer: str = ""
    """As in Request: whose hold a charge drew on, when not the object's own."""
    labels: Mapping[str, str] | None = None
    """As in Request: the labels of a hold's object when it was booked (None: not recorded)."""

    @property
    def owner(self) -> str:
        """The object this posting is listed under: the payer of a charge, else its object."""
        return self.payer or self.obj

    @property
    def amount(self) -> Decimal:
        return sum((leg.amount for leg in self.legs), ZERO)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "key": self.key, "kind": self.kind.value, "object": self.obj, "seq": self.seq, "time": self.time,
            "requestedUSD": None if self.requested is None else str(self.requested),
            "segment": self.segment.value, "note": self.note, "payer": self.payer,
            "legs": [{"from": leg.source, "to": leg.target, "amountUSD": str(leg.amount)} for leg in self.legs]}
        if self.labels is not None:
            doc["labels"] = dict(sorted(self.labels.items()))
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Posting:
        requested = doc.get("requestedUSD")
        return cls(doc["key"], Kind(doc["kind"]), doc["object"], None if requested is None else Decimal(requested),
                   tuple(Leg(leg["from"], leg["to"], Decimal(leg["amountUSD"])) for leg in doc["legs"]),
                   doc["time"], Segment(doc["segment"]), doc.get("note", ""), int(doc["seq"]),
                   doc.get("payer", ""), None if doc.get("labels") is None else dict(doc["labels"]))


@dataclass(frozen=True, slots=True)
class Accounts:
    """A project's balances after its first `seq` postings."""

    project: str
    balances: Mapping[str, Decimal] = field(default_factory=dict)
    seq: int = 0
    spent_by_month: Mapping[str, Decimal] = field(default_factory=dict)
    """Charges per calendar month (UTC, "2026-12"), for `nodus credits`."""

    def balance(self, account: str) -> Decimal:
        return self.balances.get(account, ZERO)

    @property
    def available(self) -> Decimal:
        return self.balance(AVAILABLE)

    @property
    def granted(self) -> Decimal:
        return -self.balance(FUNDING)

    @property
    def held(self) -> Decimal:
        return sum((v for k, v in self.balances.items() if k.startswith("held/")), ZERO)

    @property
    def spent(self) -> Decimal:
        return sum((v for k, v in self.balances.items() if k.startswith("spent/")), ZERO)

    def spent_in(self, month: str) -> Decimal:
        return self.spent_by_month.get(month, ZERO)

    def apply(self, posting: Posting) -> Accounts:
        """The balances after `posting`, which must be the next one and leave nothing negative."""
        if posting.seq != self.seq + 1:
            raise ValueError(f"posting {posting.seq} applied after {self.seq}")
        balances = dict(self.balances)
        for leg in posting.legs:
            balances[leg.source] = balances.get(leg.source, ZERO) - leg.amount
            balances[leg.target] = balances.get(leg.target, ZERO) + leg.amount
        negative = [k for k, v in balances.items() if v < 0 and k != FUNDING]
        if negative:
            raise ValueError(f"posting {posting.key} leaves {negative} negative")
        # An empty hold account is closed, so a project's record does not grow with every object it ran.
        balances = {k: v for k, v in balances.items() if v != 0 or not k.startswith("held/")}
        months = dict(self.spent_by_month)
        if posting.kind is Kind.CHARGE:
            month = posting.time[:7]
            months[month] = months.get(month, ZERO) + posting.amount
        return replace(self, balances=balances, seq=posting.seq, spent_by_month=months)

    def to_json(self) -> dict[str, Any]:
        return {"project": self.project, "seq": self.seq,
                "balances": {k: str(v) for k, v in sorted(self.balances.items())},
                "spentByMonth": {k: str(v) for k, v in sorted(self.spent_by_month.items())}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Accounts:
        return cls(doc["project"], {k: Decimal(v) for k, v in doc["balances"].items()}, int(doc["seq"]),
                   {k: Decimal(v) for k, v in doc.get("spentByMonth", {}).items()})


def insufficient(project: str, needed: Decimal, available: Decimal, what: str) -> NodusError:
    return NodusError(
        "InsufficientCredits",
        f'project "{project}" has {available} USD of credits available; {what} needs {needed} USD '
        f"({needed - available} USD more)",
        fix=f"ask an operator to grant at least {needed - available} USD "
            f"(nodus credits grant --project {project} AMOUNT), wait for running work to release its holds, "
            "or lower maxCostUSD", extra={"neededUSD": str(needed), "availableUSD": str(available)})


def decide(accounts: Accounts, request: Request, now: str) -> Posting:
    """The posting that carries out `request` against `accounts` (seq is the next one), or the refusal."""
    project, obj, amount = accounts.project, request.obj, request.amount
    if request.kind is not Kind.GRANT and not obj:
        raise ValueError(f"a {request.kind.value} names the object it is for")
    if amount is not None and (amount <= 0 or amount != amount.quantize(CENT)):
        raise ValueError(f"amount {amount} is not a positive number of cents")
    if amount is None and request.kind is not Kind.RELEASE:
        raise ValueError(f"a {request.kind.value} names its amount")
    legs: tuple[Leg, ...]
    if request.kind is Kind.GRANT:
        assert amount is not None
        legs = (Leg(FUNDING, AVAILABLE, amount),)
    elif request.kind in (Kind.HOLD, Kind.RENEW):
        assert amount is not None
        if amount > accounts.available:
            raise insufficient(project, amount, accounts.available, f"a hold for {obj}")
        legs = (Leg(AVAILABLE, held(obj), amount),)
    elif request.kind is Kind.RELEASE:
        reserved = accounts.balance(held(obj))
        back = reserved if amount is None else min(amount, reserved)
        legs = (Leg(held(obj), AVAILABLE, back),) if back > 0 else ()
    else:
        assert amount is not None
        hold = held(request.payer or obj)
        from_hold = min(amount, accounts.balance(hold))
        rest = amount - from_hold
        if rest > accounts.available:
            raise insufficient(project, rest, accounts.available, f"a charge of {amount} USD to {obj} beyond its hold")
        legs = tuple(leg for leg in (Leg(hold, spent(obj), from_hold), Leg(AVAILABLE, spent(obj), rest))
                     if leg.amount > 0)
    labels = None if request.labels is None else dict(request.labels)
    return Posting(request.key, request.kind, obj, amount, legs, now, request.segment, request.note, accounts.seq + 1,
                   request.payer, labels)


def fold(project: str, postings: list[Posting]) -> Accounts:
    """The balances that `postings` (in seq order) leave; what a reader recomputes to check the record."""
    accounts = Accounts(project)
    for posting in postings:
        accounts = accounts.apply(posting)
    return accounts
