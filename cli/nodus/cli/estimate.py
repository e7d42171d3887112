"""`nodus estimate -f FILE`: a dry run (?dryRun=All) of each Job in FILE, its status.estimate as a
table and the ETag that binds a later create to it (`nodus apply -f FILE --if-match ETAG`)."""
from __future__ import annotations

import argparse
from typing import Any

from .client import Client, CliError

ROWS = (("cost (p50 / p90)", "costUSD"), ("overhead (p50 / p90)", "overheadUSD"), ("rate per hour", "rateUSDPerHour"),
        ("first hold", "holdUSD"), ("holds at once", "concurrentHoldUSD"), ("gang hold", "gangHoldUSD"),
        ("assembly bound", "assemblyBoundUSD"), ("minimum charge", "minimumChargeUSD"))


def _amount(value: Any) -> str:
    if isinstance(value, dict):
        return f'${value.get("p50", "")} / ${value.get("p90", "")}'
    return f"${value}" if value else "-"


def _durations(band: dict[str, Any]) -> str:
    return band.get("message") or f'{band.get("p50", "")} / {band.get("p90", "")}'


def rows(estimate: dict[str, Any]) -> list[tuple[str, str]]:
    """The estimate as (label, value) lines, in the order a customer reads them."""
    out = [(label, _amount(estimate.get(key))) for label, key in ROWS]
    preview = estimate.get("placementPreview") or {}
    where = preview.get("offering") or "no priced offering"
    if preview.get("interruptible"):
        where += " (interruptible)"
    if preview.get("warmReuse"):
        where += " (warm)"
    startup = estimate.get("startup") or {}
    out += [("offering", where), ("region class", preview.get("regionClass") or "-"),
            ("startup cold", _durations(startup.get("cold") or {})),
            ("startup warm", _durations(startup.get("warm") or {})),
            ("price book", estimate.get("pricebookVersion") or "none (unpriced)"),
            ("valid until", estimate.get("validUntil", ""))]
    if estimate.get("topology"):
        out.append(("topology", estimate["topology"]))
    return out


def print_estimate(name: str, estimate: dict[str, Any], etag: str) -> None:
    lines = rows(estimate)
    width = max(len(label) for label, _ in lines)
    print(f"job/{name}")
    for label, value in lines:
        print(f"  {label.ljust(width)}   {value}")
    for w in estimate.get("warnings") or []:
        print(f'  warning {w.get("code")}: {w.get("message")}')
    for b in estimate.get("blockingReasons") or []:
        print(f'  blocked {b.get("code")}: {b.get("message")} (fix: {b.get("fix")})')
    explain = (estimate.get("placementPreview") or {}).get("explain")
    if explain:
        print(f"  placement: {explain}")
    print(f"  etag {etag}")


def cmd_estimate(client: Client, args: argparse.Namespace) -> int:
    from .main import _documents
    found = 0
    for doc in _documents(args.filename):
        if doc.get("kind") != "Job":
            continue
        found += 1
        r = client.for_kind("Job", doc.get("apiVersion", ""))
        namespace = (doc.get("metadata") or {}).get("namespace") or client.namespace
        resp = client.request("POST", client.collection(r, namespace), body=doc,
                              params={"dryRun": "All", "fieldValidation": "Strict"})
        obj = resp.json()
        print_estimate(obj["metadata"]["name"], (obj.get("status") or {}).get("estimate") or {},
                       resp.headers.get("ETag", ""))
    if not found:
        raise CliError(f"{args.filename} holds no Job to estimate", "pass a file with a kind: Job document")
    return 0


def add_parser(sub: Any) -> None:
    e = sub.add_parser("estimate", help="what a Job would cost, before it is created (a dry run)")
    e.add_argument("-f", "--filename", required=True, help="YAML or JSON file, or - for stdin")
    e.set_defaults(func=cmd_estimate)
