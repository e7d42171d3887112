"""How an agent's report folds into an Attempt's status (the phases and their legal moves are
`attempt_machine.py`'s; a report's move goes through its `transition`).

Pure: a report and the stored object in, the next status out (or None: nothing changes). The agent
stream (`agent_session.py`) performs the write. Folding is idempotent and order-safe, because reconnects
resend everything (Hello carries every attempt the agent knows): the same report twice, or an older
report after a newer one, changes nothing. Nothing here counts anything; the Job controller derives
its counts from the set of Attempt objects, so a resent report can never be counted twice.

A report the machine refuses (backwards, after the end, older than the latest) changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..clock import parse, rfc3339
from .reasons import AttemptReason
from .attempt_machine import (LOST_CAPACITY_STOPS, PHASE_NUMBERS, TERMINAL, AttemptPhase, Refusal, Reported, phase_of,
                              transition)

__all__ = ["AttemptPhase", "PHASE_NUMBERS", "TERMINAL", "phase_of", "Report", "ProgressReport", "fold_report", "fold_gang",
           "fold_probe", "fold_progress", "scrub", "GANG_STEPS"]


MAX_UNIT_SAMPLES = 64
MAX_MESSAGE_LINES = 3


@dataclass(frozen=True, slots=True)
class Report:
    """One AttemptUpdate from an agent, decoded from the wire (times as Unix seconds, None if unset)."""

    phase: AttemptPhase
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    start_time: float | None = None
    finish_time: float | None = None
    oom_killed: bool = False
    time: float | None = None
    """Agent clock when observed: orders reports from one agent."""
    inputs_ready_time: float | None = None
    inputs: tuple[tuple[str, str], ...] = ()
    """(name, sha256) of each input as the agent materialized it."""
    restored_from_seq: int = 0
    outputs: tuple[dict[str, Any], ...] = ()
    """{name, path, rank, uri, sha256, size} per committed output."""
    gang: dict[str, Any] | None = None
    """{epoch, done, address, port, probePort}: the gang step a member finished (GangMemberReport)."""
    image_pull: tuple[int, int] | None = None
    """(bytes done, bytes total) of the attempt's image pulls; None without an image."""
    egress_denied: int = 0
    """Connections the attempt's pod tried and its network.egress rules refused, so far."""


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One Progress line from an agent."""

    stage: str = ""
    units_completed: int = 0
    units_total: int = 0
    metrics: dict[str, str] = field(default_factory=dict)
    step: int = 0
    total_steps: int = 0
    tokens_per_second: str = ""
    gpu_memory_bytes: int = 0
    time: float | None = None


def scrub(message: str, lines: int = MAX_MESSAGE_LINES) -> str:
    """At most the last `lines` non-empty lines: a customer exit's message is a log tail, not a log."""
    kept = [line.rstrip() for line in (message or "").splitlines() if line.strip()]
    return "\n".join(kept[-lines:])[:2048]


def fold_report(attempt: dict[str, Any], report: Report, now: float) -> dict[str, Any] | None:
    """The attempt's next status after `report`, or None when the report changes nothing."""
    status = dict(attempt.get("status") or {})
    phase = report.phase
    reason = report.reason
    stop = (attempt.get("spec") or {}).get("stop") or {}
    if phase is AttemptPhase.FAILED and stop:
        # A program that exits non-zero on the SIGTERM we sent was stopped, not failed: it must not
        # count against backoffLimit.
        phase, reason = AttemptPhase.CANCELLED, ""
    if phase is AttemptPhase.CANCELLED:
        if not stop:
            # Nobody asked for the stop: the capacity went away under the attempt.
            phase, reason = AttemptPhase.LOST, reason or AttemptReason.AGENT_FAULT
        elif stop.get("reason") in LOST_CAPACITY_STOPS:
            phase, reason = AttemptPhase.LOST, stop["reason"]
        else:
            reason = reason or stop.get("reason") or AttemptReason.CANCELLED
    elif phase is AttemptPhase.FAILED:
        reason = reason or (AttemptReason.OOM_KILLED if report.oom_killed else AttemptReason.ERROR)
    elif phase is AttemptPhase.SUCCEEDED:
        reason = reason or AttemptReason.COMPLETED
    elif phase is AttemptPhase.LOST:
        reason = reason or AttemptReason.AGENT_FAULT
    status["reason"] = reason
    if report.message:
        status["message"] = scrub(report.message)
    if report.exit_code is not None:
        status["exitCode"] = report.exit_code
    if report.oom_killed:
        status["oomKilled"] = True
    for key, value in (("startTime", report.start_time), ("inputsReadyTime", report.inputs_ready_time)):
        if value is not None and key not in status:
            status[key] = rfc3339(value)
    if phase is AttemptPhase.RUNNING and "startTime" not in status:
        status["startTime"] = rfc3339(report.time if report.time is not None else now)
    if phase.terminal:
        status["finishTime"] = rfc3339(report.finish_time if report.finish_time is not None else now)
        if phase is AttemptPhase.LOST:
            status.setdefault("lostTime", rfc3339(now))
    if report.inputs and "inputs" not in status:
        status["inputs"] = [{"name": name, "sha256": sha} for name, sha in report.inputs]
    if report.restored_from_seq:
        status["restoredFromSeq"] = report.restored_from_seq
    if report.outputs:
        merged = {(o.get("name"), o.get("rank", 0)): o for o in status.get("outputs") or []}
        merged.update({(o.get("name"), o.get("rank", 0)): dict(o) for o in report.outputs})
        status["outputs"] = sorted(merged.values(), key=lambda o: (str(o.get("name")), o.get("rank", 0)))
    if report.image_pull is not None:
        status["imagePull"] = {"bytesDone": report.image_pull[0], "bytesTotal": report.image_pull[1]}
    if report.egress_denied:
        # the count only grows: a report that arrives late never lowers it
        denied = max(report.egress_denied, int((status.get("network") or {}).get("deniedConnections") or 0))
        status["network"] = {"deniedConnections": denied}
    if report.gang:
        status["gang"] = fold_gang(status.get("gang") or {}, report.gang)
    if report.time is not None:
        status["reportTime"] = rfc3339(report.time, precise=True)
    # The machine refuses a move backwards, past an end, or a report older than the latest one.
    moved = transition(attempt, Reported(phase, status, report.time))
    if isinstance(moved, Refusal):
        return None
    return None if moved == (attempt.get("status") or {}) else moved


GANG_STEPS = ("", "Assemble", "Mesh", "Start")


def fold_gang(before: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A member's gang report folded in: a newer epoch replaces the record; within an epoch the
    finished step only moves forward and the addresses stay as first reported (ports are reserved)."""
    epoch = int(report.get("epoch") or 0)
    if epoch < int(before.get("epoch") or 0):
        return before
    out = dict(before) if epoch == int(before.get("epoch") or 0) else {}
    out["epoch"] = epoch
    done = report.get("done") or ""
    if GANG_STEPS.index(done) > GANG_STEPS.index(out.get("done") or ""):
        out["done"] = done
    for key in ("address", "port", "probePort"):
        if report.get(key) and not out.get(key):
            out[key] = report[key]
    return out


def fold_probe(attempt: dict[str, Any], epoch: int, probe: dict[str, Any]) -> dict[str, Any] | None:
    """A member's probe result recorded in status.gang.probe (only for the member's current epoch)."""
    status = dict(attempt.get("status") or {})
    gang = dict(status.get("gang") or {})
    if AttemptPhase.parse(status.get("phase")).terminal or epoch != int(((attempt.get("spec") or {}).get("gang") or {})
                                                                          .get("epoch") or 0):
        return None
    if int(gang.get("epoch") or 0) not in (0, epoch):
        return None
    gang["epoch"] = epoch
    gang["probe"] = probe
    status["gang"] = gang
    return None if status == (attempt.get("status") or {}) else status


def fold_progress(attempt: dict[str, Any], report: ProgressReport) -> dict[str, Any] | None:
    """The attempt's next status after a progress line, or None when it is not newer.

    Successive lines give unit timings: when `units.completed` grows by n over t seconds (agent
    clock), each of those units took t/n; the newest MAX_UNIT_SAMPLES timings are kept, so the Job's
    unitMetrics p50/p95 come from what the program actually did. A resent line has the same time
    and is ignored, so nothing is sampled twice.
    """
    status = dict(attempt.get("status") or {})
    previous = status.get("progress") or {}
    before = parse(previous.get("time"))
    if report.time is not None and before is not None and report.time <= before:
        return None
    progress: dict[str, Any] = {}
    if report.stage:
        progress["stage"] = report.stage
    units: dict[str, int] = {"completed": report.units_completed}
    if report.units_total:
        units["total"] = report.units_total
    progress["units"] = units
    if report.metrics:
        progress["metrics"] = dict(sorted(report.metrics.items()))
    for key, value in (("step", report.step), ("totalSteps", report.total_steps),
                       ("tokensPerSecond", report.tokens_per_second), ("gpuMemoryBytes", report.gpu_memory_bytes)):
        if value:
            progress[key] = value
    if report.time is not None:
        progress["time"] = rfc3339(report.time, precise=True)
    done_before = (previous.get("units") or {}).get("completed")
    if (report.time is not None and before is not None and isinstance(done_before, int)
            and report.units_completed > done_before):
        per_unit_ms = int(round((report.time - before) * 1000 / (report.units_completed - done_before)))
        samples = list(status.get("unitSamplesMs") or []) + [per_unit_ms]
        status["unitSamplesMs"] = samples[-MAX_UNIT_SAMPLES:]
    status["progress"] = progress
    return None if status == (attempt.get("status") or {}) else status
