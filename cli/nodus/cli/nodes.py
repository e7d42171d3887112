"""`nodus node ls|revoke|readmit` and `nodus join-token rotate`: the operators' hand on node identity,
over NodeService with the kubeconfig's token (docs/adr/0039-grpc-tls-and-node-identity.md)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from nodus.v1 import node_pb2, node_pb2_grpc

from .operator import call

_PHASES = {v.number: v.name[len("NODE_PHASE_"):].replace("_", "") for v in node_pb2.NodePhase.DESCRIPTOR.values}
_NAMES = {v.name: _PHASES[v.number] for v in node_pb2.NodePhase.DESCRIPTOR.values}


def _node_call(args: argparse.Namespace, method: str, request: Any) -> dict[str, Any]:
    return call(args, method, request, stub_class=node_pb2_grpc.NodeServiceStub)


def _identity(node: dict[str, Any]) -> str:
    if node.get("revoked"):
        return "Revoked"
    return "Enrolled" if node.get("enrolled") else "-"


def print_nodes(nodes: list[dict[str, Any]]) -> None:
    rows = [["NAME", "PHASE", "IDENTITY", "CERTIFICATE EXPIRES", "ACTIVE", "GPUS"]]
    for n in nodes:
        rows.append([n.get("name", ""), _NAMES.get(str(n.get("phase", "")), str(n.get("phase", ""))), _identity(n),
                     n.get("certificate_expire_time", "-"), str(n.get("active_attempts", 0)), _gpus(n)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _gpus(node: dict[str, Any]) -> str:
    """How many GPUs, and the GpusHealthy condition's reason when it is False (the message has the detail)."""
    count = len((node.get("inventory") or {}).get("gpus") or [])
    bad = next((c for c in node.get("conditions") or [] if c.get("type") == "GpusHealthy" and c.get("status") == "False"),
               None)
    if bad is None:
        return str(count) if count else "-"
    return f"{count} ({bad.get('reason', '')}: {bad.get('message', '')})"


def cmd_ls(args: argparse.Namespace) -> int:
    nodes = _node_call(args, "ListNodes", node_pb2.ListNodesRequest()).get("nodes") or []
    if args.output == "json":
        sys.stdout.write(orjson.dumps(nodes, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_nodes(nodes)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    _node_call(args, "RevokeNode", node_pb2.RevokeNodeRequest(name=args.name, message=args.message or ""))
    print(f"node {args.name} revoked: its stream is closed and its certificate refused; its attempts are replaced "
          f"once its lease runs out (`nodus node readmit {args.name}` lets it enrol again)")
    return 0


def cmd_readmit(args: argparse.Namespace) -> int:
    _node_call(args, "ReadmitNode", node_pb2.ReadmitNodeRequest(name=args.name))
    print(f"node {args.name} re-admitted: the next enrolment under its name, with the join token, takes it")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    reply = _node_call(args, "RotateJoinToken", node_pb2.RotateJoinTokenRequest())
    print(reply["join_token"])
    print(f"{reply.get('retired', 0)} old join token(s) retired; enrolled nodes keep their certificates",
          file=sys.stderr)
    return 0


def add_parsers(sub: Any) -> None:
    coordinator_help = ("gRPC HOST:PORT (default $NODUS_COORDINATOR, else the address the kubeconfig names, else "
                        "127.0.0.1:7070)")
    p = sub.add_parser("node", help="operator: nodes, their identity, revocation and re-admission")
    p.add_argument("--coordinator", help=coordinator_help)
    p.add_argument("-o", "--output", choices=["json"])
    p.set_defaults(func=cmd_ls, operator=True)
    actions = p.add_subparsers(dest="action")
    ls = actions.add_parser("ls", help="every node, its phase and whether it is enrolled or revoked")
    ls.add_argument("-o", "--output", choices=["json"], default=argparse.SUPPRESS)  # `node ls -o json` as `node -o json`
    ls.set_defaults(func=cmd_ls, operator=True)
    revoke = actions.add_parser("revoke", help="cut a node off at once; its attempts are replaced elsewhere")
    revoke.add_argument("name")
    revoke.add_argument("--message", help="why, kept on the node")
    revoke.set_defaults(func=cmd_revoke, operator=True)
    readmit = actions.add_parser("readmit", help="forget a node's enrolment so the join token can enrol it again")
    readmit.add_argument("name")
    readmit.set_defaults(func=cmd_readmit, operator=True)
    j = sub.add_parser("join-token", help="operator: the agents' join token")
    j.add_argument("--coordinator", help=coordinator_help)
    jactions = j.add_subparsers(dest="action", required=True)
    rotate = jactions.add_parser("rotate", help="issue a new join token (printed once) and retire the old ones")
    rotate.set_defaults(func=cmd_rotate, operator=True)
