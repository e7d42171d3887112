"""`nodus token create|ls|revoke`: API tokens, over ProjectService with the kubeconfig's token
(docs/adr/0046-tokens-rate-limits-audit.md). Secrets are printed once, at create, and never listed."""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any

import orjson

from nodus.v1 import project_pb2

from .client import CliError
from .operator import call

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
ROLES = ("admin", "editor", "viewer", "metrics")


def parse_ttl(text: str) -> int:
    """A lifetime as a Go duration (`24h`, `1h30m`, `90s`) or whole seconds (`3600`), in whole seconds."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use one such as 24h, 90m, 1h30m or 3600")
    if total < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is shorter than a second")
    return int(total)


def cmd_create(args: argparse.Namespace) -> int:
    token = call(args, "CreateToken", project_pb2.CreateTokenRequest(project=args.project, role=args.role,
                                                                     subject=args.subject or "", ttl_seconds=args.ttl or 0))
    print(token["secret"])
    expires = f", expires {token['expire_time']}" if token.get("expire_time") else ""
    print(f'token {token["id"]} for role {token["role"]} in project {token["project"]}{expires} '
          "(shown once; keep it safe)", file=sys.stderr)
    return 0


def print_tokens(tokens: list[dict[str, Any]], revoked: bool) -> None:
    header = ["ID", "PROJECT", "ROLE", "SUBJECT", "CREATED", "EXPIRES", "LAST USED"] + (["REVOKED"] if revoked else [])
    rows = [header]
    for t in tokens:
        rows.append([t.get("id", ""), t.get("project", ""), t.get("role", ""), t.get("subject", ""),
                     t.get("create_time", "-"), t.get("expire_time", "never"), t.get("last_use_time", "never")]
                    + ([t.get("revoke_time", "-")] if revoked else []))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def cmd_ls(args: argparse.Namespace) -> int:
    reply = call(args, "ListTokens", project_pb2.ListTokensRequest(project=args.project or "",
                                                                   include_revoked=args.all))
    tokens = reply.get("tokens") or []
    if args.output == "json":
        sys.stdout.write(orjson.dumps(tokens, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_tokens(tokens, args.all)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    if args.id.startswith("nodus_"):
        raise CliError("that is a token's secret, not its id", "pass the ID column of `nodus token ls`")
    token = call(args, "RevokeToken", project_pb2.RevokeTokenRequest(id=args.id))
    print(f'token {token["id"]} ({token["subject"]}, {token["role"]} in project {token["project"]}) revoked: '
          "every request presenting it is refused from now on")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("token", help="operator: API tokens (create, ls, revoke)")
    p.add_argument("--coordinator", help="gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig "
                                         "names, else 127.0.0.1:7070)")
    actions = p.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="mint a token (its secret is printed once)")
    create.add_argument("--project", required=True, help="project, or * for every project")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--subject", help="who the token is for")
    create.add_argument("--ttl", type=parse_ttl, help="how long until it expires: 24h, 90m, or seconds (default: never)")
    create.set_defaults(func=cmd_create, operator=True)
    ls = actions.add_parser("ls", help="tokens: id, project, role, created, expires, last used (never the secret)")
    ls.add_argument("--project", help="one project's (default: every project for an operator token)")
    ls.add_argument("--all", action="store_true", help="revoked tokens too")
    ls.add_argument("-o", "--output", choices=["json"])
    ls.set_defaults(func=cmd_ls, operator=True)
    revoke = actions.add_parser("revoke", help="refuse a token from now on")
    revoke.add_argument("id", help="the token's id (`nodus token ls`), not its secret")
    revoke.set_defaults(func=cmd_revoke, operator=True)
