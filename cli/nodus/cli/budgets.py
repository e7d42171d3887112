"""`nodus budgets set|ls|rm`: a project's monthly Budgets (operators set and remove them; any token of
the project lists them), over ProjectService with the kubeconfig's token."""
from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from nodus.v1 import project_pb2

from .client import CliError
from .credits import _project
from .operator import call


def _selector(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise CliError(f"--selector: {pair!r} is not label=value", "send --selector team=a,env=prod")
        out[key] = value
    return out


def print_budgets(budgets: list[dict[str, Any]]) -> None:
    """The table `nodus budgets ls` and `nodus credits` print."""
    rows = [["PROJECT", "BUDGET", "SELECTOR", "MONTH", "AMOUNT", "USED", "LEFT"]]
    for b in budgets:
        selector = ",".join(f"{k}={v}" for k, v in sorted((b.get("selector") or {}).items())) or "(all)"
        rows.append([b.get("project", ""), b.get("name", ""), selector, b.get("month", ""),
                     b.get("amount_usd", "0.00") + " USD", b.get("used_usd", "0.00") + " USD",
                     b.get("left_usd", "0.00") + " USD"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _out(args: argparse.Namespace, budgets: list[dict[str, Any]]) -> None:
    if args.output == "json":
        sys.stdout.write(orjson.dumps(budgets, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_budgets(budgets)


def cmd_set(args: argparse.Namespace) -> int:
    reply = call(args, "SetBudget", project_pb2.SetBudgetRequest(
        project=args.budget_project, name=args.name, amount_usd=args.amount, selector=_selector(args.selector)))
    _out(args, [reply])
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    project = args.budget_project or _project(args)
    reply = call(args, "ListBudgets", project_pb2.ListBudgetsRequest(project=project))
    _out(args, reply.get("budgets") or [])
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    reply = call(args, "DeleteBudget", project_pb2.DeleteBudgetRequest(project=args.budget_project, name=args.name))
    print(f'budget {reply["name"]} of project {reply["project"]} removed')
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("budgets", help="a project's monthly budgets (operators: set and remove them)")
    p.add_argument("--coordinator", help="gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig names, else 127.0.0.1:7070)")
    p.add_argument("-o", "--output", choices=["json"])
    p.set_defaults(func=cmd_ls, operator=True, budget_project="")
    actions = p.add_subparsers(dest="action")
    s = actions.add_parser("set", help="operator: create or replace a budget")
    s.add_argument("--project", dest="budget_project", required=True)
    s.add_argument("--name", required=True, help="the budget's name, a DNS label")
    s.add_argument("--amount", required=True, help='USD per calendar month (UTC), a decimal such as "500.00"')
    s.add_argument("--selector", default="", help="k=v,… : only objects with all these labels count")
    s.set_defaults(func=cmd_set, operator=True)
    ls = actions.add_parser("ls", help="a project's budgets and what each used this month")
    ls.add_argument("--project", dest="budget_project", default="", help="default: the kubeconfig's namespace")
    ls.set_defaults(func=cmd_ls, operator=True)
    rm = actions.add_parser("rm", help="operator: remove a budget")
    rm.add_argument("--project", dest="budget_project", required=True)
    rm.add_argument("--name", required=True)
    rm.set_defaults(func=cmd_rm, operator=True)
