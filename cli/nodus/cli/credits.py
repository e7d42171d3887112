"""`nodus credits` (a project's balance, held and spent this month) and, for operators,
`nodus credits grant --project P AMOUNT`, over ProjectService with the kubeconfig's token."""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import yaml

from nodus.v1 import project_pb2

from .client import CliError, default_kubeconfig
from .operator import call


def _project(args: argparse.Namespace) -> str:
    """-n/--project, else the kubeconfig context's namespace; empty lets the server use the token's project."""
    if args.namespace:
        return str(args.namespace)
    path = Path(args.kubeconfig) if args.kubeconfig else default_kubeconfig()
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise CliError(f"cannot read kubeconfig {path}: {e.strerror}",
                       "pass --kubeconfig DATA_DIR/kubeconfig or set NODUS_KUBECONFIG") from None
    ctx: dict[str, Any] = next((c.get("context", {}) for c in config.get("contexts", []) if c.get("name") == config.get("current-context")),
               {})
    return str(ctx.get("namespace", ""))


def _print(credits: dict[str, Any]) -> None:
    rows = [["PROJECT", "AVAILABLE", "HELD", f'SPENT {credits.get("month", "")}'.rstrip(), "GRANTED"],
            [credits.get("project", ""), credits.get("available_usd", "0.00") + " USD",
             credits.get("held_usd", "0.00") + " USD", credits.get("spent_this_month_usd", "0.00") + " USD",
             credits.get("granted_usd", "0.00") + " USD"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def cmd_show(args: argparse.Namespace) -> int:
    credits = call(args, "GetCredits", project_pb2.GetCreditsRequest(project=_project(args)))
    if args.output == "json":
        sys.stdout.write(orjson.dumps(credits, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print(credits)
        if credits.get("budgets"):
            from .budgets import print_budgets  # it imports this module's _project
            print()
            print_budgets(credits["budgets"])
    return 0


def cmd_grant(args: argparse.Namespace) -> int:
    request_id = args.request_id or f"cli-{uuid.uuid4().hex}"
    reply = call(args, "GrantCredits", project_pb2.GrantCreditsRequest(
        project=args.grant_project, amount_usd=args.amount, request_id=request_id, note=args.note or ""))
    credits = reply["credits"]
    if reply.get("granted"):
        print(f'granted {args.amount} USD to project {credits["project"]} (request {request_id})')
    else:
        print(f'request {request_id} was granted before; nothing added now')
    print(f'available {credits.get("available_usd", "0.00")} USD, held {credits.get("held_usd", "0.00")} USD',
          file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("credits", help="a project's prepaid credits (operators: grant them)")
    p.add_argument("--coordinator", help="gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig names, else 127.0.0.1:7070)")
    p.add_argument("-o", "--output", choices=["json"])
    p.set_defaults(func=cmd_show, operator=True)
    actions = p.add_subparsers(dest="action")
    g = actions.add_parser("grant", help="operator: add credits to a project")
    g.add_argument("--project", dest="grant_project", required=True, help="the project to credit")
    g.add_argument("amount", help='USD, a decimal such as "100.00"')
    g.add_argument("--request-id", help="makes the grant happen once: send the same id to retry a grant whose "
                                        "answer was lost (default: a new one, printed)")
    g.add_argument("--note", help="why (an invoice or contract number), kept with the posting")
    g.set_defaults(func=cmd_grant, operator=True)
