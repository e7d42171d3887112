"""A Job's story as Kubernetes Events (core v1 Event): pure, from the state of a Job and its Attempts.

Level-triggered like every controller here: the events an object implies are a function of what it is
now (an attempt with a node was Placed, one with a startTime Started, one Lost lost its node …), each
with a name derived from what it records, so writing them again after a restart or a missed watch
event creates nothing twice (the store refuses the second create). `kubectl describe job.nodus.dev`
finds them by involvedObject (the Job), `kubectl get events` lists them.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from .attempt_machine import AttemptPhase

COMPONENT = "nodus-coordinator"
"""source.component: the From column of kubectl describe."""
CONTROLLER = "nodus.dev/job-controller"
"""reportingController (events.k8s.io's name for the same)."""


class EventType(str, enum.Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class Reason(str, enum.Enum):
    PLACED = "Placed"
    STARTED = "Started"
    CHECKPOINTED = "Checkpointed"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    NODE_LOST = "NodeLost"
    REPLACED = "Replaced"
    FAILED = "Failed"
    SUCCEEDED = "Succeeded"
    ATTEMPT_FAILED = "AttemptFailed"


@dataclass(frozen=True, slots=True)
class Happened:
    """One thing that happened to a Job: its Event, before it has a name or a namespace."""

    reason: Reason
    type: EventType
    message: str
    time: str
    """RFC 3339, when it happened (firstTimestamp and lastTimestamp)."""
    key: str
    """What makes it unique within its Job (an attempt name, a checkpoint seq, a transition time)."""


def _s(obj: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    value = obj.get(section)
    return value if isinstance(value, Mapping) else {}


def of_attempt(attempt: Mapping[str, Any]) -> list[Happened]:
    """What an Attempt's state says happened to it, in order."""
    spec, status = _s(attempt, "spec"), _s(attempt, "status")
    name = str(_s(attempt, "metadata").get("name") or "")
    node = str(spec.get("node") or "")
    created = str(_s(attempt, "metadata").get("creationTimestamp") or "")
    out: list[Happened] = []
    number, index = int(spec.get("number") or 1), int(spec.get("index") or 0)
    if number > 1 and created:
        out.append(Happened(Reason.REPLACED, EventType.NORMAL,
                            f"attempt {name} replaces attempt {number - 1} of index {index}", created, name))
    if node and status.get("provisioningTime"):
        where = f"node {node}" + (f" ({spec['offering']})" if spec.get("offering") else "")
        out.append(Happened(Reason.PLACED, EventType.NORMAL, f"attempt {name} placed on {where}",
                            str(status["provisioningTime"]), name))
    if status.get("startTime"):
        out.append(Happened(Reason.STARTED, EventType.NORMAL, f"attempt {name} started on node {node}",
                            str(status["startTime"]), name))
    for c in status.get("checkpoints") or []:
        if isinstance(c, Mapping) and c.get("time"):
            why = f" ({c['reason']})" if c.get("reason") else ""
            out.append(Happened(Reason.CHECKPOINTED, EventType.NORMAL,
                                f"attempt {name} saved checkpoint {c.get('seq')}{why}, {c.get('size', 0)} bytes",
                                str(c["time"]), f"{name}/{c.get('seq')}"))
    phase = AttemptPhase.parse(status.get("phase"))
    finished = str(status.get("finishTime") or status.get("lostTime") or "")
    detail = f": {status['message']}" if status.get("message") else ""
    if phase is AttemptPhase.LOST and finished:
        out.append(Happened(Reason.NODE_LOST, EventType.WARNING,
                            f"attempt {name} lost node {node} ({status.get('reason') or 'Lost'}){detail}",
                            finished, name))
    elif phase is AttemptPhase.FAILED and finished:
        code = f" with exit code {status['exitCode']}" if status.get("exitCode") is not None else ""
        out.append(Happened(Reason.ATTEMPT_FAILED, EventType.WARNING,
                            f"attempt {name} failed{code} ({status.get('reason') or 'Failed'}){detail}",
                            finished, name))
    return out


def of_job(job: Mapping[str, Any]) -> list[Happened]:
    """What a Job's own status says happened: suspends and resumes, and how it ended."""
    status = _s(job, "status")
    out: list[Happened] = []
    for c in status.get("conditions") or []:
        if not isinstance(c, Mapping) or c.get("type") != "Suspended" or not c.get("lastTransitionTime"):
            continue
        when = str(c["lastTransitionTime"])
        if c.get("status") == "True":
            out.append(Happened(Reason.SUSPENDED, EventType.NORMAL,
                                f"suspended ({c.get('reason') or 'Suspended'}){_colon(c.get('message'))}", when, when))
        elif c.get("reason") == "Resumed":
            out.append(Happened(Reason.RESUMED, EventType.NORMAL, "resumed", when, when))
    phase, when = status.get("phase"), str(status.get("completionTime") or "")
    if phase in ("Succeeded", "Failed") and when:
        reason = Reason.SUCCEEDED if phase == "Succeeded" else Reason.FAILED
        kind = EventType.NORMAL if phase == "Succeeded" else EventType.WARNING
        why = f" ({status['reason']})" if status.get("reason") else ""
        out.append(Happened(reason, kind, f"Job {phase.lower()}{why}{_colon(status.get('message'))}", when, ""))
    return out


def _colon(message: Any) -> str:
    return f": {message}" if message else ""


def event_name(job: Mapping[str, Any], happened: Happened) -> str:
    """The name of the Event about `job` for `happened`: the Job's plus a digest of what it records."""
    meta = _s(job, "metadata")
    digest = hashlib.sha256(f"{meta.get('uid')}/{happened.reason.value}/{happened.key}".encode()).hexdigest()[:16]
    return f"{meta.get('name')}.{digest}"


def event(job: Mapping[str, Any], happened: Happened, uid: str) -> dict[str, Any]:
    """The core v1 Event about `job` for `happened`, named by `event_name`."""
    meta = _s(job, "metadata")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(job, happened), "namespace": meta.get("namespace"), "uid": uid,
                     "creationTimestamp": happened.time},
        "involvedObject": {"apiVersion": str(job.get("apiVersion") or "nodus.dev/v1"), "kind": "Job",
                           "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "reason": happened.reason.value, "message": happened.message, "type": happened.type.value,
        "source": {"component": COMPONENT}, "reportingComponent": CONTROLLER, "reportingInstance": COMPONENT,
        "firstTimestamp": happened.time, "lastTimestamp": happened.time, "count": 1,
    }
