"""The reason words the agent and its supervisors write, as one typed enum checked against common.proto.

Code names a reason as `Reason.AGENT_FAULT`, so a misspelt one fails mypy; its word is derived from the
member's name as the wire derives it (ATTEMPT_REASON_NODE_LOST is "NodeLost"). The agent cannot import
the coordinator's `controllers/reasons.py` (the layers forbid it); both follow the proto. This module
imports no protobuf, so the supervisor (forked from the zygote, kept small) stays without it; the
daemon runs `check_against_proto` when it imports attempts.py, so a member the proto lacks, or a proto
member missing here, fails the agent's start.
"""
from __future__ import annotations

import enum
from typing import Iterable

PROTO_PREFIX = "ATTEMPT_REASON_"


def reason_word(proto_name: str) -> str:
    """The wire's word for a common.proto AttemptReason name: ATTEMPT_REASON_NODE_LOST is "NodeLost"."""
    words = proto_name.removeprefix(PROTO_PREFIX).split("_")
    return "".join(w if w == "OOM" else w.capitalize() for w in words)


class Reason(enum.StrEnum):
    """Why an attempt ended or is stopped, as the agent reports it (AttemptUpdate.reason, status.json's
    reason). A StrEnum: a member is its word on the wire, in status.json and in f-strings. The comments
    are the proto's, shortened; the agent passes on reasons it is given (a Cancel's) as they come."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
        return reason_word(PROTO_PREFIX + name)

    COMPLETED = enum.auto()
    """Success: exit 0 and every output committed."""
    ERROR = enum.auto()
    """Customer failure: the command exited non-zero, or could not start."""
    OOM_KILLED = enum.auto()
    """Customer failure: the kernel's OOM killer ended the command."""
    INIT_FAILED = enum.auto()
    """Customer failure: the init command failed, timed out or could not start."""
    SIDECAR_FAILED = enum.auto()
    """Customer failure: a sidecar failed or did not become ready in its startupTimeout."""
    LAUNCH_FAILED = enum.auto()
    """Customer failure: a gang member's launcher step failed."""
    INPUT_FAILED = enum.auto()
    """Customer failure: an input could not be fetched, or its digest did not match."""
    IMAGE_UNSUPPORTED = enum.auto()
    """Customer failure: the node cannot run the attempt's image."""
    INVALID_ASSIGNMENT = enum.auto()
    """Customer failure: the coordinator could not build the Assignment."""
    NODE_LOST = enum.auto()
    """Lost capacity: the node stopped renewing its lease."""
    DRAINED = enum.auto()
    """Lost capacity: the node was drained."""
    PREEMPTED = enum.auto()
    """Lost capacity: the provider preempted the capacity (a reclaim notice)."""
    RECLAIMED = enum.auto()
    """Lost capacity: the provider reclaimed the capacity."""
    AGENT_FAULT = enum.auto()
    """Lost capacity: the agent or the attempt's supervisor ended the attempt unexpectedly."""
    RENDEZVOUS_TIMEOUT = enum.auto()
    """Lost capacity: a gang worker never reached rank 0's rendezvous."""
    GANG_MEMBER_EXITED = enum.auto()
    """Lost capacity: a gang epoch ended because a member was lost."""
    CANCELLED = enum.auto()
    """Cancel: stopped on purpose (a Cancel without a reason)."""
    TERMINATED = enum.auto()
    """Cancel: the supervisor was told to stop without a request."""
    SUSPENDED = enum.auto()
    """Cancel: the Job was suspended (checkpoint, then stop)."""
    UNASSIGNED = enum.auto()
    """Cancel: the coordinator no longer wants the attempt on this node."""
    JOB_DELETED = enum.auto()
    """Cancel: the Job was deleted."""
    GANG_RESTART = enum.auto()
    """Cancel: another member of the gang's epoch ended it."""
    GANG_COMPLETED = enum.auto()
    """Cancel: every rank that runs the command succeeded; the serving ranks stop."""
    ASSEMBLY_TIMEOUT = enum.auto()
    """Cancel: the gang did not assemble within spec.distributed.startupTimeout."""
    DEADLINE_EXCEEDED = enum.auto()
    """Cancel: the Job's spec.timeout passed."""
    BACKOFF_LIMIT_EXCEEDED = enum.auto()
    """Cancel: the Job failed, spec.backoffLimit was reached."""
    MAX_ATTEMPTS_EXCEEDED = enum.auto()
    """Cancel: the Job failed, recovery.maxAttempts was reached."""
    CAPACITY_UNAVAILABLE = enum.auto()
    """Cancel: the Job failed, no capacity within its queue timeout."""
    GANG_ASSEMBLY_TIMEOUT = enum.auto()
    """Cancel: the Job failed, its gang did not assemble in maxAssemblyRetries tries."""
    MAX_COST_REACHED = enum.auto()
    """Cancel: the Job reached spec.maxCostUSD."""
    WAITING_FOR_CAPACITY = enum.auto()
    """No end: the attempt waits, nothing fits it now."""
    SUSPEND_FAILED = enum.auto()
    """No end: a suspend's checkpoint failed; the attempt keeps running."""
    OUTPUT_MISSING = enum.auto()
    """Customer failure: the command exited 0 but a declared output path does not exist."""
    RESTORE_FAILED = enum.auto()
    """Customer failure: the checkpoint to resume from could not be fetched or restored."""
    LEASE_EXPIRED = enum.auto()
    """Lost capacity: the lease ran out unrenewed; the agent stops its attempts before a
    replacement runs elsewhere."""
    IMAGE_PULL_FAILED = enum.auto()
    """Customer failure: the image or its credentials are wrong (not found, unauthorized, digest mismatch)."""
    IMAGE_PULL_NODE_FAULT = enum.auto()
    """Lost capacity: the node could not pull the image (disk full, registry unreachable from it)."""
    INSUFFICIENT_CREDITS = enum.auto()
    """Cancel: the project's credits cannot renew the Job's hold (a grant resumes it)."""
    WAITING_FOR_INPUT = enum.auto()
    """No end: the Job waits for an output input its producer has not committed yet."""


def check_against_proto(proto_names: Iterable[str]) -> None:
    """Raises unless Reason is exactly the proto's members (UNSPECIFIED aside)."""
    proto = {name.removeprefix(PROTO_PREFIX) for name in proto_names} - {"UNSPECIFIED"}
    ours = {r.name for r in Reason}
    if proto != ours:
        raise ImportError(f"the agent's Reason differs from common.proto: only here {sorted(ours - proto)}, "
                          f"only in the proto {sorted(proto - ours)}")
