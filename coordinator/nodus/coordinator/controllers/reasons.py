"""The reasons of an Attempt (and of its Job), as one typed vocabulary read from common.proto.

Code names a reason as `AttemptReason.NODE_LOST`, so a misspelt member fails mypy; each member's
word is derived from its name exactly as the wire derives it (ATTEMPT_REASON_NODE_LOST is
"NodeLost"), and the class checks at import that its members are the proto's, no more and no less,
so a member the proto lacks (or one added to the proto and not here) fails the import. Stored
objects and the wire carry the word (`.value`); what a reason counts as is the proto's `counts_as`.
"""
from __future__ import annotations

import enum
from typing import Iterable, Mapping

from nodus.v1 import common_pb2

PROTO_PREFIX = "ATTEMPT_REASON_"


def reason_word(proto_name: str) -> str:
    """The wire's word for a common.proto AttemptReason name: ATTEMPT_REASON_NODE_LOST is "NodeLost"."""
    words = proto_name.removeprefix(PROTO_PREFIX).split("_")
    return "".join(w if w == "OOM" else w.capitalize() for w in words)


class AttemptReason(enum.StrEnum):
    """Why an attempt is where it is (status.reason, spec.stop.reason); the Job's status.reason uses
    the same words. A StrEnum: a member is its word in stored objects, f-strings and the wire. The
    comments are the proto's, shortened."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
        return reason_word(PROTO_PREFIX + name)

    COMPLETED = enum.auto()
    """Success: exit 0 and every output committed (also the stop of the rest once a Job is done)."""
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
    """Customer failure: the coordinator could not build the Assignment (a missing Secret or reference)."""
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
    """Cancel: stopped on purpose (spec.state Cancelled, or a stop without a reason)."""
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
    """Cancel: the Job failed, no capacity within spec.placement.queueTimeout."""
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
    """Lost capacity: the node's lease ran out unrenewed and its agent stopped the attempt."""
    IMAGE_PULL_FAILED = enum.auto()
    """Customer failure: the image or its credentials are wrong (not found, unauthorized, digest mismatch)."""
    IMAGE_PULL_NODE_FAULT = enum.auto()
    """Lost capacity: the node could not pull the image (disk full, registry unreachable from it)."""
    INSUFFICIENT_CREDITS = enum.auto()
    """Cancel: the project's credits cannot renew the Job's hold (a grant resumes it)."""
    WAITING_FOR_INPUT = enum.auto()
    """No end: the Job waits for an output input its producer has not committed yet."""

    @property
    def proto(self) -> common_pb2.AttemptReason:
        """The common.proto member, found by name."""
        return common_pb2.AttemptReason.Value(PROTO_PREFIX + self.name)  # type: ignore[return-value]

    @property
    def counts_as(self) -> common_pb2.ReasonClass:
        """What the reason counts as (common.proto's ReasonClass, the member's counts_as option)."""
        options = common_pb2.AttemptReason.DESCRIPTOR.values_by_name[PROTO_PREFIX + self.name].GetOptions()
        return options.Extensions[common_pb2.counts_as]  # type: ignore[index]


def check_against_proto(names: Iterable[str]) -> None:
    """Raises unless `names` are exactly the proto's members (UNSPECIFIED aside): run on AttemptReason at
    import, so a misspelt member, or a proto member missing here, fails the import."""
    proto = {v.name.removeprefix(PROTO_PREFIX) for v in common_pb2.AttemptReason.DESCRIPTOR.values if v.number}
    ours = set(names)
    if proto != ours:
        raise ImportError(f"AttemptReason differs from common.proto: only here {sorted(ours - proto)}, "
                          f"only in the proto {sorted(proto - ours)}")


check_against_proto(AttemptReason.__members__)

REASON_CLASSES: Mapping[str, common_pb2.ReasonClass] = {r.value: r.counts_as for r in AttemptReason}
"""Each reason word and what it counts as (common.proto's ReasonClass)."""
LOST_CAPACITY_STOPS = frozenset(r.value for r in AttemptReason if r.counts_as == common_pb2.REASON_CLASS_LOST_CAPACITY)
"""Stops the coordinator asks for because capacity goes away: the attempt is recorded Lost and replaced."""
