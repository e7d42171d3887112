"""`nodus describe job NAME [-n PROJECT]`: a Job's status, conditions, attempts and events on one screen.

The attempts are the Job's by the label every Attempt carries (attempts.for_job); the events are the
core v1 Events about it (ADR 0034), oldest first, as `kubectl describe` lists them.
"""
from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

from . import attempts
from .client import CliError, Client


def _age(stamp: Any, now: float) -> str:
    if not stamp:
        return ""
    try:
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return str(stamp)
    s = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    return ["  " + "   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows]]


def render(job: dict[str, Any], attempt_list: list[dict[str, Any]], events: list[dict[str, Any]],
           now: float) -> list[str]:
    """The lines `nodus describe job` prints (pure: what the server answered in, text out)."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    progress = status.get("progress") or {}
    cost = status.get("cost") or {}
    lines = [f"Name:         {meta.get('name')}", f"Project:      {meta.get('namespace')}",
             f"Phase:        {status.get('phase') or 'Pending'}"
             + (f" ({status['reason']})" if status.get("reason") else "")]
    if status.get("message"):
        lines.append(f"Message:      {status['message']}")
    lines.append(f"Completions:  {status.get('succeeded') or 0}/{spec.get('completions') or 1}")
    if progress:
        units = progress.get("units") or {}
        total = f"/{units['total']}" if units.get("total") else ""
        lines.append(f"Progress:     {units.get('completed', 0)}{total} units {progress.get('stage') or ''}".rstrip())
    if cost:
        lines.append(f"Cost:         ${cost.get('totalUSD', '0')}" + (f" (held ${cost['heldUSD']})" if cost.get("heldUSD")
                                                                    else ""))
    for label, key in (("Created", None), ("Started", "startTime"), ("Completed", "completionTime")):
        stamp = meta.get("creationTimestamp") if key is None else status.get(key)
        if stamp:
            lines.append(f"{label + ':':<14}{stamp} ({_age(stamp, now)} ago)")
    lines += ["", "Conditions:"]
    conditions = status.get("conditions") or []
    lines += _table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                    [[str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason", "")),
                      _age(c.get("lastTransitionTime"), now), str(c.get("message", ""))] for c in conditions]) \
        if conditions else ["  <none>"]
    lines += ["", "Attempts:"]
    rows = [[a["metadata"]["name"], str((a.get("spec") or {}).get("node") or ""),
             str((a.get("status") or {}).get("phase") or "Pending"), str((a.get("status") or {}).get("reason") or ""),
             str((a.get("status") or {}).get("exitCode", "")), _age((a.get("status") or {}).get("startTime"), now)]
            for a in sorted(attempt_list, key=lambda a: ((a.get("spec") or {}).get("index", 0),
                                                         (a.get("spec") or {}).get("number", 0), a["metadata"]["name"]))]
    lines += _table(["ATTEMPT", "NODE", "PHASE", "REASON", "EXIT", "STARTED"], rows) if rows else ["  <none>"]
    lines += ["", "Events:"]
    ordered = sorted(events, key=lambda e: (e.get("lastTimestamp") or "", e.get("reason") or ""))
    lines += _table(["TYPE", "REASON", "AGE", "MESSAGE"],
                    [[str(e.get("type", "")), str(e.get("reason", "")), _age(e.get("lastTimestamp"), now),
                      str(e.get("message", ""))] for e in ordered]) if ordered else ["  <none>"]
    return lines


def cmd_describe(client: Client, args: argparse.Namespace) -> int:
    r = client.resolve(args.kind)
    if r.plural != "jobs":
        raise CliError(f"nodus describe shows Jobs, not {r.plural}",
                       f"use `nodus get {r.singular} NAME -o yaml` or `kubectl describe {r.plural}.nodus.dev NAME`")
    namespace = args.namespace or client.namespace
    job = client.request("GET", client.item(r, namespace, args.name)).json()
    attempt_list = client.request("GET", client.collection(client.resolve("attempts"), namespace),
                                  params={"labelSelector": attempts.for_job(args.name, None)}).json().get("items", [])
    events = client.request("GET", f"/api/v1/namespaces/{namespace}/events", params={
        "fieldSelector": f"involvedObject.kind=Job,involvedObject.name={args.name}"}).json().get("items", [])
    print("\n".join(render(job, attempt_list, events, time.time())))
    return 0


def add_parser(sub: Any) -> None:
    d = sub.add_parser("describe", help="a Job's status, conditions, attempts and events")
    d.add_argument("kind", help="job")
    d.add_argument("name")
    d.add_argument("-n", "--namespace", "--project", dest="namespace", default=argparse.SUPPRESS,
                   help="project (namespace)")
    d.set_defaults(func=cmd_describe)
