"""`nodus-coordinator audit query`: an operator's question to DATA_DIR/audit.log and its rotations.

Prints the matching entries (one JSON object a line, oldest first, across audit.log.N … audit.log),
filtered by token, project, verb, resource, name, a start time and refused writes only; the file is
read as it is, so it answers while the coordinator runs (docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import orjson

_ROTATED = re.compile(r"^audit\.log\.(\d+)$")


def entries(data_dir: Path) -> Iterator[dict[str, Any]]:
    """Every entry, oldest first: the highest-numbered rotation first, the live file last."""
    rotated = sorted(((int(m.group(1)), p) for p in data_dir.glob("audit.log.*")
                      if (m := _ROTATED.match(p.name))), reverse=True)
    for path in [p for _, p in rotated] + [data_dir / "audit.log"]:
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:  # rotated away while we read
            continue
        for line in lines:
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:  # a line being written
                continue


def _time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)


def _since(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time such as 2026-12-03T17:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def refused(entry: dict[str, Any]) -> bool:
    code = str(entry.get("code", ""))
    return code != "OK" and not (code.isdigit() and int(code) < 400)


def matches(entry: dict[str, Any], args: argparse.Namespace) -> bool:
    for field, wanted in (("tokenId", args.token), ("project", args.project), ("verb", args.verb),
                          ("resource", args.resource), ("name", args.name)):
        if wanted is not None and entry.get(field) != wanted:
            return False
    if args.since is not None and _time(str(entry.get("time", ""))) < args.since:
        return False
    return not args.refused or refused(entry)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="nodus-coordinator audit query",
                                description="Print the audit log's entries that match, oldest first (JSON lines).")
    p.add_argument("--data-dir", default=os.environ.get("NODUS_DATA_DIR", "/var/lib/nodus/coordinator"),
                   help="the coordinator's data dir (default $NODUS_DATA_DIR, else /var/lib/nodus/coordinator)")
    p.add_argument("--token", help="a token id (`nodus token ls`)")
    p.add_argument("--project")
    p.add_argument("--verb", help="create, update, patch, delete, createtoken, revoketoken, …")
    p.add_argument("--resource", help="jobs, secrets, … (REST), Job, CreateTokenRequest, … (gRPC)")
    p.add_argument("--name")
    p.add_argument("--since", type=_since, help="RFC 3339 UTC time, e.g. 2026-12-03T17:00:00Z")
    p.add_argument("--refused", action="store_true", help="only writes that were refused (HTTP >= 400, gRPC not OK)")
    args = p.parse_args(argv)
    data_dir = Path(args.data_dir)
    if not (data_dir / "audit.log").exists() and not any(data_dir.glob("audit.log.*")):
        raise SystemExit(f"audit query: no audit log in {data_dir}: pass the coordinator's --data-dir")
    out = sys.stdout.buffer
    for entry in entries(data_dir):
        if matches(entry, args):
            out.write(orjson.dumps(entry) + b"\n")
    out.flush()
