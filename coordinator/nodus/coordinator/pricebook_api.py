"""PriceBookService, the operators' gRPC API over the price book versions (money/books.py): it parses
the request's YAML, translates the stored versions to the proto, and leaves the rules to books.py."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import duration_pb2, timestamp_pb2

from nodus.v1 import pricebook_pb2, pricebook_pb2_grpc

from .clock import Clock, rfc3339
from .errors import NodusError, invalid_value
from .grpc_api import rpc
from .identity import Caller, Identity, require_operator
from .money.books import Outcome, PriceBooks, StoredBook
from .money.pricebook import KIND, Offering
from .store.base import Store

log = logging.getLogger("nodus.pricebook")

_OUTCOMES = {Outcome.CREATED: pricebook_pb2.APPLY_OUTCOME_CREATED,
             Outcome.ACTIVATED: pricebook_pb2.APPLY_OUTCOME_ACTIVATED,
             Outcome.UNCHANGED: pricebook_pb2.APPLY_OUTCOME_UNCHANGED}
MAX_DOCUMENT_BYTES = 1 << 20


def _duration(seconds: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds)


def _decimal(d: Any) -> str:
    return format(d, "f")


def offering_proto(o: Offering) -> pricebook_pb2.Offering:
    acc = o.accelerator
    return pricebook_pb2.Offering(
        id=o.id, vcpus=o.vcpus, memory_bytes=o.memory_bytes, disk_bytes=o.disk_bytes, region_class=o.region_class,
        provider=o.provider, region=o.region, rate_usd_per_hour=_decimal(o.rate_usd_per_hour),
        interruptible=o.interruptible, interruptions_per_hour=_decimal(o.interruptions_per_hour),
        billing_increment=_duration(o.billing_increment_s), minimum_charge=_duration(o.minimum_charge_s),
        relative_speed=_decimal(o.relative_speed),
        accelerator=None if acc is None else pricebook_pb2.Accelerator(
            id=acc.id, family=acc.family, gpus_per_node=acc.gpus_per_node, memory_bytes=acc.memory_bytes,
            interconnect=acc.interconnect.value))


def book_proto(stored: StoredBook) -> pricebook_pb2.PriceBook:
    book = stored.book
    applied = timestamp_pb2.Timestamp()
    applied.FromJsonString(stored.apply_time)
    return pricebook_pb2.PriceBook(version=book.version, digest=book.digest, apply_time=applied, active=stored.active,
                                   storage_usd_per_gib_month=_decimal(book.storage_usd_per_gib_month),
                                   offerings=[offering_proto(o) for o in book.offerings])


def load_document(text: str) -> Any:
    """The request's YAML (JSON is YAML too); a syntax error is an Invalid naming `document`."""
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise NodusError("RequestEntityTooLarge", f"the price book is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise NodusError("Invalid", f"{KIND} document is not YAML: {e}", causes=(
            invalid_value("document", "...", f"must be YAML or JSON ({str(e).splitlines()[0]})"),)) from None


class PriceBookServicer(pricebook_pb2_grpc.PriceBookServiceServicer):
    """Applying takes an operator token; any valid token reads (customers choose offerings by price)."""

    def __init__(self, books: PriceBooks, identity: Identity, clock: Clock) -> None:
        self.books, self.identity, self.clock = books, identity, clock

    @rpc("applypricebook")
    async def ApplyPriceBook(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        stored, outcome = await self.books.apply(load_document(request.document), rfc3339(self.clock.now()))
        return pricebook_pb2.ApplyPriceBookResponse(price_book=book_proto(stored), outcome=_OUTCOMES[outcome])

    @rpc("getpricebook")
    async def GetPriceBook(self, caller: Caller, request: Any, context: Any) -> Any:
        return book_proto(await self.books.get(request.version))

    @rpc("listpricebookversions")
    async def ListPriceBookVersions(self, caller: Caller, request: Any, context: Any) -> Any:
        return pricebook_pb2.ListPriceBookVersionsResponse(
            price_books=[book_proto(s) for s in await self.books.versions()])


def add_to_server(server: grpc.aio.Server, books: PriceBooks, identity: Identity, clock: Clock) -> None:
    pricebook_pb2_grpc.add_PriceBookServiceServicer_to_server(PriceBookServicer(books, identity, clock), server)


async def apply_file(store: Store, path: Path, clock: Clock) -> None:
    """`nodus-coordinator --price-book FILE`: applies FILE before serving; a bad book stops the start
    with every bad field named (SystemExit), as a bad flag does."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SystemExit(f"--price-book {path}: {e.strerror or e}") from None
    try:
        stored, outcome = await PriceBooks(store).apply(load_document(text), rfc3339(clock.now()))
    except NodusError as e:
        lines = [f"  {c.field}: {c.message}" for c in e.causes]
        raise SystemExit("\n".join([f"--price-book {path}: {e.message}", *lines, f"  fix: {e.effective_fix}"])) \
            from None
    log.info("price book %s %s from %s (%d offerings)", stored.book.version, outcome.value, path,
             len(stored.book.offerings))
