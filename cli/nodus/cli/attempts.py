"""`nodus get attempts JOB`: a Job's attempts, by the label every Attempt carries.

Attempts are named `<job>-<index>-<number>`, so the name a customer knows is the Job's. `cmd_get`
turns `nodus get attempts JOB` into a list filtered by `nodus.dev/job=JOB` (kept together with any
`-l` selector); a single attempt is shown with its full name through `kubectl get attempt NAME`.

Wiring, in `main.cmd_get`, before the path is built:

    if r.plural == "attempts" and args.name:
        args.selector, args.name = attempts.for_job(args.name, args.selector), None
"""
from __future__ import annotations

JOB_LABEL = "nodus.dev/job"


def for_job(job: str, selector: str | None) -> str:
    """The label selector listing `job`'s attempts, combined with the caller's own selector."""
    mine = f"{JOB_LABEL}={job}"
    return f"{selector},{mine}" if selector else mine
