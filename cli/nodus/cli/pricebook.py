"""`nodus pricebook apply -f FILE | get [VERSION] | versions`: the operator's price book over gRPC
(PriceBookService), authenticated with the kubeconfig's token."""
from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import yaml

from nodus.v1 import pricebook_pb2, pricebook_pb2_grpc

from .client import CliError
from .operator import call

_OUTCOMES = {"APPLY_OUTCOME_CREATED": "created", "APPLY_OUTCOME_ACTIVATED": "activated again",
             "APPLY_OUTCOME_UNCHANGED": "unchanged"}


def _call(args: argparse.Namespace, method: str, request: Any) -> dict[str, Any]:
    return call(args, method, request, pricebook_pb2_grpc.PriceBookServiceStub)


def _size(n: Any) -> str:
    value = Decimal(int(n or 0))
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if value >= size:
            return f"{value / size:.4g}{unit}"
    return str(value)


def _seconds(duration: Any) -> str:
    """A proto Duration as MessageToDict writes it ("60s"); unset is 0s."""
    return str(duration or "0s")


def cmd_apply(args: argparse.Namespace) -> int:
    path = args.filename
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}", "pass the price book YAML with -f FILE") from None
    reply = _call(args, "ApplyPriceBook", pricebook_pb2.ApplyPriceBookRequest(document=text))
    book = reply["price_book"]
    print(f'pricebook/{book["version"]} {_OUTCOMES.get(reply.get("outcome", ""), "applied")} '
          f'({len(book.get("offerings", []))} offerings, active)')
    return 0


def _print_book(book: dict[str, Any]) -> None:
    state = "active" if book.get("active") else "inactive"
    print(f'price book {book["version"]} ({state}, applied {book.get("apply_time", "?")}; storage '
          f'{book.get("storage_usd_per_gib_month", "0")} USD/GiB-month)')
    header = ["OFFERING", "GPUS", "VCPU", "MEMORY", "REGION", "INTERRUPTIBLE", "USD/HOUR", "INCREMENT", "MINIMUM"]
    rows = [header]
    for o in book.get("offerings", []):
        acc = o.get("accelerator")
        gpus = f'{acc.get("gpus_per_node", 0)}x {acc.get("family", "")} {_size(acc.get("memory_bytes"))}' if acc \
            else "-"
        spot = f'yes ({o.get("interruptions_per_hour", "0")}/h)' if o.get("interruptible") else "no"
        rows.append([o["id"], gpus, str(o.get("vcpus", 0)), _size(o.get("memory_bytes")),
                     f'{o.get("region_class", "")} ({o.get("provider", "")} {o.get("region", "")})', spot,
                     o.get("rate_usd_per_hour", ""), _seconds(o.get("billing_increment")),
                     _seconds(o.get("minimum_charge"))])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def cmd_get(args: argparse.Namespace) -> int:
    book = _call(args, "GetPriceBook", pricebook_pb2.GetPriceBookRequest(version=args.version or ""))
    if args.output == "json":
        sys.stdout.write(orjson.dumps(book, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(book, sort_keys=False))
    else:
        _print_book(book)
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    books = _call(args, "ListPriceBookVersions", pricebook_pb2.ListPriceBookVersionsRequest()).get("price_books", [])
    if not books:
        print("No price book was ever applied: Nodus charges nothing.", file=sys.stderr)
        return 0
    rows = [["VERSION", "APPLIED", "OFFERINGS", "ACTIVE"]] + [
        [b["version"], b.get("apply_time", ""), str(len(b.get("offerings", []))), "yes" if b.get("active") else ""]
        for b in books]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pricebook", help="operator: the price book (offerings and customer rates)")
    p.add_argument("--coordinator", help="gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig names, else 127.0.0.1:7070)")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("apply", help="store a price book version and make it active")
    a.add_argument("-f", "--filename", required=True, help="price book YAML, or - for stdin")
    a.set_defaults(func=cmd_apply, operator=True)
    g = actions.add_parser("get", help="show the active price book (or VERSION)")
    g.add_argument("version", nargs="?")
    g.add_argument("-o", "--output", choices=["json", "yaml"])
    g.set_defaults(func=cmd_get, operator=True)
    v = actions.add_parser("versions", help="list every stored version")
    v.set_defaults(func=cmd_versions, operator=True)
