"""`nodus cancel JOB [-n PROJECT]`: sets the Job's spec.state to Cancelled, the cancel state that stops
it for good (its attempts are stopped; unlike Suspended, a later Running does not start it again)."""
from __future__ import annotations

import argparse
from typing import Any

from .client import Client

CANCELLED = "Cancelled"
"""api/job.py STATES: the desired state that stops a Job for good."""


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    r = client.resolve("jobs")
    namespace = args.namespace or client.namespace
    path = client.item(r, namespace, args.name)
    current = client.request("GET", path).json()  # a missing Job fails here with the server's reason and fix
    label = f'{r.singular}.{r.api_version.split("/")[0]} "{args.name}"'
    if (current.get("spec") or {}).get("state") == CANCELLED:
        print(f"{label} already cancelled (phase {(current.get('status') or {}).get('phase') or 'unknown'})")
        return 0
    # No resourceVersion precondition: the controller writes a running Job's status all the time, and
    # setting the state is the same patch whatever else changed.
    client.request("PATCH", path, body={"spec": {"state": CANCELLED}}, content_type="application/merge-patch+json")
    print(f"{label} cancelled: its attempts are being stopped (`nodus get job {args.name}` shows when it ends)")
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser("cancel", help="stop a Job for good (spec.state: Cancelled)")
    c.add_argument("name", help="the Job's name")
    # SUPPRESS keeps a top-level `nodus -n P cancel JOB` from being reset to None by this subcommand.
    c.add_argument("-n", "--namespace", "--project", dest="namespace", default=argparse.SUPPRESS,
                   help="project (namespace)")
    c.set_defaults(func=cmd_cancel)
