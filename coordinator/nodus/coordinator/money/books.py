"""Price book versions in the store: every version kept, one of them active.

    _pricebooks/versions/<version>   the operator's document as applied, its digest and apply time
    _pricebooks/active               which version is active, and since when

A version is written once and never changes (a charge names the version it was priced by, so the
book must still say what it said then): applying a version that exists with other content is refused,
applying the same content again only makes it active (so an operator can go back to an older one).
The store is the only shared memory, so every coordinator reading it sees the same active book.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import NodusError
from ..store.base import Store
from .pricebook import PriceBook, no_price_book, parse

VERSIONS, ACTIVE = "_pricebooks/versions/", "_pricebooks/active"


class Outcome(enum.Enum):
    """What applying a price book did."""

    CREATED = "created"
    """A new version, stored and made active."""
    ACTIVATED = "activated"
    """The version was stored already with this content; it is active again."""
    UNCHANGED = "unchanged"
    """The version was already the active one."""


@dataclass(frozen=True, slots=True)
class StoredBook:
    book: PriceBook
    apply_time: str
    """When the version was first stored (RFC 3339)."""
    active: bool


class PriceBooks:
    """The versions in `store`. Parsed versions are memoized: a stored version never changes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._parsed: dict[str, PriceBook] = {}

    def book_of(self, record: dict[str, Any]) -> PriceBook:
        """The parsed book of a stored version record (memoized: a version never changes)."""
        version = record["version"]
        if version not in self._parsed:
            self._parsed[version] = parse(record["document"])
        return self._parsed[version]

    async def _record(self, version: str) -> dict[str, Any] | None:
        rec = await self.store.get(VERSIONS + version)
        return None if rec is None else dict(orjson.loads(rec.value))

    async def active_version(self) -> str:
        rec = await self.store.get(ACTIVE)
        return str(orjson.loads(rec.value)["version"]) if rec is not None else ""

    async def active(self) -> PriceBook | None:
        """The active book, or None: no price book, no money."""
        version = await self.active_version()
        record = await self._record(version) if version else None
        return None if record is None else self.book_of(record)

    async def get(self, version: str = "") -> StoredBook:
        """A version (the active one when `version` is empty); NotFound when there is none."""
        active = await self.active_version()
        record = await self._record(version or active) if (version or active) else None
        if record is None:
            if not version:
                raise no_price_book()
            raise NodusError("NotFound", f'price book version "{version}" not found', name=version,
                             kind="pricebooks", fix="list the versions with PriceBookService.ListPriceBookVersions")
        return StoredBook(self.book_of(record), record["applyTime"], record["version"] == active)

    async def versions(self) -> list[StoredBook]:
        """Every stored version, in the order they were first applied."""
        active = await self.active_version()
        page = await self.store.list(VERSIONS)
        records = sorted((orjson.loads(r.value) for r in page.records), key=lambda r: (r["applyTime"], r["version"]))
        return [StoredBook(self.book_of(r), r["applyTime"], r["version"] == active) for r in records]

    async def apply(self, document: Any, now: str) -> tuple[StoredBook, Outcome]:
        """Stores `document` as its version (unless the same content is stored) and makes it active."""
        book = parse(document)
        record = {"version": book.version, "digest": book.digest, "document": document, "applyTime": now}
        outcome = Outcome.CREATED
        try:
            await self.store.create(VERSIONS + book.version, orjson.dumps(record))
        except NodusError as e:
            if e.reason != "AlreadyExists":
                raise
            stored = await self._record(book.version)
            assert stored is not None  # versions are never deleted
            if stored["digest"] != book.digest:
                raise NodusError(
                    "AlreadyExists", f'price book version "{book.version}" is stored with other content; a version '
                    "never changes, so that charges made under it stay explainable", name=book.version,
                    kind="pricebooks", fix="give the changed book a new pricebookVersion and apply it") from None
            record = stored
            outcome = Outcome.ACTIVATED
        if await self._activate(book.version, now):
            return StoredBook(book, record["applyTime"], True), outcome
        return StoredBook(book, record["applyTime"], True), Outcome.UNCHANGED

    async def _activate(self, version: str, now: str) -> bool:
        """Points ACTIVE at `version` (compare-and-swap); False when it already did."""
        value = orjson.dumps({"version": version, "activateTime": now})
        while True:
            rec = await self.store.get(ACTIVE)
            if rec is None:
                try:
                    await self.store.create(ACTIVE, value)
                    return True
                except NodusError as e:
                    if e.reason != "AlreadyExists":
                        raise
                    continue
            if orjson.loads(rec.value)["version"] == version:
                return False
            try:
                await self.store.update(ACTIVE, value, rec.revision)
                return True
            except NodusError as e:
                if e.reason != "Conflict":
                    raise
