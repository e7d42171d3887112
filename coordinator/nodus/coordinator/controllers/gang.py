"""Gangs: a distributed Job's members decided as one, as a pure function.

A gang Job (spec.distributed) runs one index as `nodes` member attempts, one per node, created
together for an epoch (rank 0..n-1, attempt number = epoch). The Job's own rules — backoffLimit,
recovery.maxAttempts with minProgressDuration, timeout, queueTimeout, suspend, cancel, TTL — are the
Job controller's (`job.decide`), applied to the gang as if each epoch were one attempt: `epoch_view`
folds an epoch's members into that one AttemptView, `decide_gang` runs `decide` on those views and
turns its actions back into member actions. What only a gang has lives here:

- an epoch is all or nothing: when one member ends any other way than succeeding, the others are
  stopped (GangRestart) and the epoch ends as a whole; when every member that runs the command
  succeeded, the members that only serve it (a Ray worker) are stopped (GangCompleted);
- what an ended epoch counts as: Lost (infrastructure: recovery.maxAttempts) when any member was
  lost — a peer's crash after a lost node is the loss, not a customer failure — else Failed
  (backoffLimit) when a member failed, else Succeeded or Cancelled;
- assembly is bounded: an epoch whose members are all placed but not all started after
  distributed.startupTimeout is stopped (AssemblyTimeout) and placed again, at most
  maxAssemblyRetries times; then the Job fails with GangAssemblyTimeout and holds nothing;
- ranks keep their node across epochs unless that node is the one that was lost, or its member
  never assembled;
- the gang's steps: every member assembles (prepares and reserves ports), then meshes (the probe),
  then starts through the launcher; `gang_plan.plan` is the step each member is told, derived from what
  the members reported, so a resent report or a reconnect changes nothing;
- status.gang and status.topology.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from ..clock import parse, rfc3339
from .attempts import AttemptPhase
from .gang_phase import GangPhase
from .checkpoints import FREE_STORAGE_BYTES
from .job import Action, CreateAttempt, Decision, DeleteAttempt, JobPhase, StopAttempt, collect_orphans, decide
from .reasons import AttemptReason
from .views import DEFAULT_ASSEMBLY_RETRIES as DEFAULT_ASSEMBLY_RETRIES  # re-exported with the gang's names
from .views import DEFAULT_STARTUP_TIMEOUT as DEFAULT_STARTUP_TIMEOUT
from .views import AttemptView, JobView
from .views import topology as topology

VIRTUAL_PREFIX = "gang-epoch:"
ASSEMBLE, MESH, START = "Assemble", "Mesh", "Start"
STEPS = (ASSEMBLE, MESH, START)
SERVICE_LAUNCHERS = frozenset({"Ray", "Verl"})
"""Launchers whose ranks above 0 serve the head instead of running the command."""
PATH_ORDER = ("Private", "Direct", "Public", "Relayed")
"""Network paths, best first: the weakest of a gang is the last one any pair uses."""

RESTART_REASONS = frozenset({AttemptReason.GANG_RESTART, AttemptReason.GANG_COMPLETED, AttemptReason.ASSEMBLY_TIMEOUT})


@dataclass(frozen=True, slots=True)
class GangConfig:
    """Operator settings of gangs (coordinator flags)."""

    probe: bool = True
    """Run the mesh probe (phase Meshing) before the command starts."""
    probe_max_bytes: int = 16 << 20
    probe_budget_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class CreateMember:
    """Create the attempt of one rank of an epoch."""

    epoch: int
    rank: int
    size: int
    prefer_node: str = ""
    """The node the rank used in the previous epoch (ranks stay with their node)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes this rank must not use (its member there never assembled)."""


# -- what a member is ---------------------------------------------------------------------------------

def is_gang(spec: Mapping[str, Any]) -> bool:
    return isinstance(spec.get("distributed"), dict)


def epoch_of(view: AttemptView) -> int:
    return view.epoch


def rank_of(view: AttemptView) -> int:
    return view.rank


def done_step(report: Mapping[str, Any], epoch: int) -> str:
    """The last gang step a member's report (status.gang) says it did in `epoch`; "" for none."""
    return str(report.get("done") or "") if int(report.get("epoch") or 0) == epoch else ""


def runs_command(launcher: str, rank: int) -> bool:
    """Whether this rank's exit is the gang's result (a Ray/Verl worker only serves the head)."""
    return rank == 0 or launcher not in SERVICE_LAUNCHERS


# -- one epoch seen as one attempt --------------------------------------------------------------------

def _latest(times: Iterable[float | None]) -> float | None:
    found = [t for t in times if t is not None]
    return max(found) if found else None


def _earliest(times: Iterable[float | None]) -> float | None:
    found = [t for t in times if t is not None]
    return min(found) if found else None


def _finished(view: AttemptView) -> float:
    return view.finished or float("inf")


def broken(members: Sequence[AttemptView]) -> AttemptView | None:
    """The member whose end ends the epoch early (lost or failed, or a service that quit), or None."""
    ended = sorted((m for m in members if m.phase in (AttemptPhase.FAILED, AttemptPhase.LOST)), key=_finished)
    lost = [m for m in ended if m.phase is AttemptPhase.LOST]
    if lost:
        return lost[0]
    if ended:
        return ended[0]
    early = [m for m in members if m.phase is AttemptPhase.CANCELLED and m.reason not in RESTART_REASONS
             and not m.stop_requested]
    return early[0] if early else None


def completed(members: Sequence[AttemptView], launcher: str, size: int) -> bool:
    """Every rank that runs the command succeeded."""
    by_rank = {rank_of(m): m for m in members}
    return all(r in by_rank and by_rank[r].phase is AttemptPhase.SUCCEEDED
               for r in range(size) if runs_command(launcher, r))


def epoch_view(job_uid: str, epoch: int, members: Sequence[AttemptView], launcher: str, size: int) -> AttemptView:
    """The epoch as one attempt of index 0 numbered `epoch`, for `job.decide`."""
    live = [m for m in members if not m.phase.terminal]
    first = broken(members)
    full = len({rank_of(m) for m in members}) >= size
    all_placed = full and all(m.placed for m in members)
    all_started = full and all(m.started is not None for m in members)
    by_rank = sorted(members, key=rank_of)
    rank0 = next((m for m in by_rank if rank_of(m) == 0), by_rank[0])
    exit_code: int | None = None
    reason, message, oom = "", "", False
    if not live:
        if completed(members, launcher, size):
            phase, reason = AttemptPhase.SUCCEEDED, AttemptReason.COMPLETED
        elif first is not None:
            phase = first.phase if first.phase in (AttemptPhase.FAILED, AttemptPhase.LOST) else AttemptPhase.LOST
            lost = phase is AttemptPhase.LOST
            reason = first.reason or (AttemptReason.GANG_MEMBER_EXITED if lost else AttemptReason.ERROR)
            message = f"rank {rank_of(first)} on node {first.node or '?'}: {first.message or first.reason}".strip()
            exit_code, oom = first.exit_code, first.oom_killed
        else:
            timed_out = any(m.reason == AttemptReason.ASSEMBLY_TIMEOUT for m in members)
            phase = AttemptPhase.CANCELLED
            reason = AttemptReason.ASSEMBLY_TIMEOUT if timed_out else (rank0.reason or AttemptReason.CANCELLED)
    elif first is not None or completed(members, launcher, size):
        phase = AttemptPhase.STOPPING
    elif all_started and all(m.phase in (AttemptPhase.RUNNING, AttemptPhase.CHECKPOINTING) for m in live):
        phase = AttemptPhase.RUNNING
    elif all_placed:
        phase = AttemptPhase.PROVISIONING
    else:
        phase = AttemptPhase.PENDING
    # Placed: every member is, or the epoch is being stopped with some of them on nodes.
    placed = all_placed or (phase is AttemptPhase.STOPPING and any(m.placed for m in live))
    node = rank0.node if placed else ""
    if not live and first is not None and first.node:
        node = first.node  # where the epoch broke: the Job's message names that node
    started = _latest(m.started for m in members) if all_started else None
    status: dict[str, Any] = {"phase": phase.value}
    for key, value in (("reason", reason), ("message", message)):
        if value:
            status[key] = value
    if exit_code is not None:
        status["exitCode"] = exit_code
    if started is not None:
        status["startTime"] = rfc3339(started)
    if not live:
        end = _latest(m.finished for m in members)
        if end is not None:
            status["finishTime"] = rfc3339(end)
            if phase is AttemptPhase.LOST:
                status["lostTime"] = rfc3339(end)
    provisioned = _latest(m.provisioned for m in members) if all_placed else None
    if provisioned is not None:
        status["provisioningTime"] = rfc3339(provisioned)
    explain = next((m.placement_explain for m in members if not m.placed and m.placement_explain), "")
    if explain:
        status["placement"] = {"explain": explain}
    for key, fact in (("progress", rank0.progress), ("unitSamplesMs", list(rank0.unit_samples_ms)),
                      ("restoredFromSeq", rank0.restored_from_seq)):
        if fact:
            status[key] = fact
    ready = _latest(parse(m.inputs_ready_time) for m in members)
    if ready is not None and all(m.inputs_ready_time for m in members):
        status["inputsReadyTime"] = rfc3339(ready)
    outputs = [o for m in by_rank for o in m.outputs]
    if outputs:
        status["outputs"] = outputs
    checkpoints = sorted((c for m in members for c in m.checkpoints),
                         key=lambda c: int(c.get("seq", 0)))
    if checkpoints:
        status["checkpoints"] = checkpoints
    failed_suspends = [m.suspend_failed for m in members if m.suspend_failed]
    if failed_suspends:
        status["suspendFailed"] = max(failed_suspends, key=lambda f: int(f.get("tries") or 0))
    stop = next((m.stop for m in live if m.stop), None)
    if not (live and all(m.stop for m in live)):
        stop = None  # the epoch is stopped once every live member is
    name = f"{VIRTUAL_PREFIX}{epoch}"
    created = _earliest(m.created for m in members)
    return AttemptView(name=name, project=rank0.project, job=rank0.job, job_uid=job_uid, index=0, number=epoch, phase=phase, reason=reason,
                       message=message, exit_code=exit_code, oom_killed=oom, node=node, created=created,
                       provisioned=provisioned, started=started,
                       stop_requested=bool(live) and all(m.stop_requested for m in live),
                       finished=parse(status.get("finishTime")), lost_at=parse(status.get("lostTime")),
                       placement_explain=explain, progress=rank0.progress, unit_samples_ms=rank0.unit_samples_ms,
                       outputs=tuple(outputs), checkpoints=tuple(checkpoints),
                       inputs_ready_time=status.get("inputsReadyTime", ""), id="", offering="", region_class="",
                       epoch=epoch, rank=0, in_gang=False, gang_size=0, gang_report={}, stop=stop,
                       suspend_failed=status.get("suspendFailed"), restored_from_seq=rank0.restored_from_seq,
                       inputs=rank0.inputs)


# -- decide --------------------------------------------------------------------------------------------

def decide_gang(job: JobView, attempts: Sequence[AttemptView], now: float,
                config: GangConfig = GangConfig(), mtbi: float | None = None,
                free_storage: int = FREE_STORAGE_BYTES, *, prev: Mapping[str, Any]) -> Decision:
    """`job.decide` for a gang Job, over its epochs; `prev` is the Job's stored status (decide's)."""
    uid, launcher = job.uid, job.launcher
    startup, retries = job.startup_timeout, job.max_assembly_retries
    topo = dict(job.topology)
    size = int(topo["nodes"])

    mine = [a for a in attempts if a.job_uid == uid]
    actions: list[Action | CreateMember] = list(collect_orphans([a for a in attempts if a.job_uid != uid]))
    epochs: dict[int, list[AttemptView]] = {}
    for a in mine:
        epochs.setdefault(epoch_of(a), []).append(a)
    views = {e: epoch_view(uid, e, members, launcher, size) for e, members in sorted(epochs.items())}
    current = max(epochs, default=0)
    wake: list[float] = []

    # The gang's own stops, before the Job's rules see the epoch.
    members = epochs.get(current, [])
    live = [m for m in members if not m.phase.terminal]
    missing = sorted(set(range(size)) - {rank_of(m) for m in members}) if members else []
    if members and missing and live:
        # A crash between creating the ranks of an epoch: create the rest (same epoch).
        actions.extend(CreateMember(current, r, size) for r in missing)
    elif live:
        first = broken(members)
        if first is not None:
            actions.extend(StopAttempt(m.name, AttemptReason.GANG_RESTART) for m in live if not m.stop_requested)
        elif completed(members, launcher, size):
            actions.extend(StopAttempt(m.name, AttemptReason.GANG_COMPLETED) for m in live if not m.stop_requested)
        elif all(m.placed for m in members) and not all(m.started is not None for m in members):
            since = _latest(m.provisioned for m in members)
            if since is not None:
                if now >= since + startup:
                    actions.extend(StopAttempt(m.name, AttemptReason.ASSEMBLY_TIMEOUT)
                                   for m in live if not m.stop_requested)
                else:
                    wake.append(since + startup)

    timeouts = [e for e, v in views.items()
                if v.phase is AttemptPhase.CANCELLED and v.reason == AttemptReason.ASSEMBLY_TIMEOUT]
    verdict = None
    if len(timeouts) > retries:
        last = epochs[timeouts[-1]]
        stuck = sorted(rank_of(m) for m in last if done_step(m.gang_report, timeouts[-1]) == "")
        verdict = (JobPhase.FAILED, AttemptReason.GANG_ASSEMBLY_TIMEOUT,
                   f"the gang did not assemble within spec.distributed.startupTimeout {job.startup_timeout_text} "
                   f"{len(timeouts)} times (the first placement and {len(timeouts) - 1} re-placements; "
                   f"maxAssemblyRetries {retries}); the last time rank(s) {', '.join(map(str, stuck)) or '?'} never "
                   f"became ready")
    decision = decide(job, list(views.values()), now, extra_verdict=verdict, mtbi=mtbi, free_storage=free_storage,
                      prev=prev)
    for action in decision.actions:
        if isinstance(action, CreateAttempt):
            actions.extend(_new_epoch(action.number, size, epochs, views))
        elif isinstance(action, StopAttempt) and action.name.startswith(VIRTUAL_PREFIX):
            epoch = int(action.name[len(VIRTUAL_PREFIX):])
            stoppers = [m for m in epochs.get(epoch, []) if not m.phase.terminal and not m.stop_requested]
            dcp = job.checkpoint_format == "Dcp"
            for m in sorted(stoppers, key=rank_of):
                # A suspend's checkpoint: every rank's part (Dcp), or rank 0's state (Snapshot).
                seq = action.checkpoint_seq if rank_of(m) == 0 or dcp else 0
                actions.append(replace(action, name=m.name, checkpoint_seq=seq))
        elif isinstance(action, DeleteAttempt) and action.name.startswith(VIRTUAL_PREFIX):
            epoch = int(action.name[len(VIRTUAL_PREFIX):])
            actions.extend(DeleteAttempt(m.name) for m in epochs.get(epoch, []))
        else:
            actions.append(action)
    status = dict(decision.status if decision.status is not None else prev)
    status["topology"] = topo
    gang = gang_status(status, epochs, views, current, size, launcher, config, job.gang_status)
    status["gang"] = gang
    wake_at = min([t for t in ([decision.wake_at] if decision.wake_at else []) + wake if t > now], default=None)
    return Decision(None if status == prev else status, tuple(actions), wake_at)  # type: ignore[arg-type]


def _new_epoch(epoch: int, size: int, epochs: Mapping[int, Sequence[AttemptView]],
               views: Mapping[int, AttemptView]) -> list[CreateMember]:
    """The ranks of a new epoch: each keeps its previous node unless that node lost it or its member
    never assembled there (then it avoids that node)."""
    before = max((e for e in epochs if e < epoch), default=0)
    prev = {rank_of(m): m for m in epochs.get(before, [])}
    out = []
    for rank in range(size):
        m = prev.get(rank)
        prefer = ""
        avoid: tuple[str, ...] = ()
        if m is not None and m.node:
            if m.phase is AttemptPhase.LOST:
                avoid = (m.node,)
            elif m.reason == AttemptReason.ASSEMBLY_TIMEOUT and done_step(m.gang_report, before) == "":
                avoid = (m.node,)
            else:
                prefer = m.node
        out.append(CreateMember(epoch, rank, size, prefer, avoid))
    return out


# -- status.gang ------------------------------------------------------------------------------------------

def gang_status(job_status: Mapping[str, Any], epochs: Mapping[int, Sequence[AttemptView]],
                views: Mapping[int, AttemptView], current: int, size: int, launcher: str, config: GangConfig,
                prev: Mapping[str, Any]) -> dict[str, Any]:
    members = sorted(epochs.get(current, []), key=rank_of)
    live = [m for m in members if not m.phase.terminal]
    job_phase = JobPhase.parse(job_status.get("phase"))
    restarts = sum(1 for e, v in views.items() if e < current
                   and (v.phase in (AttemptPhase.LOST, AttemptPhase.FAILED) or v.reason == AttemptReason.ASSEMBLY_TIMEOUT))
    assembled = [m for m in members if done_step(m.gang_report, current) in (ASSEMBLE, MESH, START)]
    meshed = [m for m in members if done_step(m.gang_report, current) in (MESH, START)]
    started = [m for m in members if m.started is not None]
    ready = meshed if config.probe else assembled
    view = views.get(current)
    if not members:
        phase = GangPhase.DONE if job_phase.terminal else GangPhase.QUEUED
    elif job_phase.terminal or job_phase is JobPhase.SUSPENDED or (view is not None and view.stop_requested):
        if not live:
            phase = GangPhase.DONE
        elif all(m.phase is AttemptPhase.STOPPING for m in live):
            phase = GangPhase.RELEASING
        else:
            phase = GangPhase.STOPPING
    elif view is not None and (view.phase is AttemptPhase.STOPPING or (view.phase.terminal and view.phase is not AttemptPhase.SUCCEEDED)):
        phase = GangPhase.RECOVERING
    elif view is not None and view.phase is AttemptPhase.SUCCEEDED:
        phase = GangPhase.DONE
    elif not all(m.placed for m in members) or len(members) < size:
        phase = GangPhase.QUEUED
    elif len(assembled) < size:
        phase = GangPhase.ASSEMBLING
    elif config.probe and len(meshed) < size:
        phase = GangPhase.MESHING
    elif len(started) < size or not all(m.phase in (AttemptPhase.RUNNING, AttemptPhase.CHECKPOINTING) for m in live):
        phase = GangPhase.STARTING
    else:
        phase = GangPhase.RUNNING
    out: dict[str, Any] = {"epoch": current, "phase": phase.value, "size": size, "ready": len(ready),
                           "started": len(started), "restarts": restarts}
    rank0 = next((m for m in members if rank_of(m) == 0), None)
    if rank0 is not None and len(assembled) == size:
        report = rank0.gang_report
        if report.get("address") and report.get("port"):
            out["rendezvous"] = f"{_host(str(report['address']))}:{report['port']}"
    rows = []
    probes = []
    for m in members:
        report = m.gang_report
        row: dict[str, Any] = {"rank": rank_of(m), "attempt": m.id, "phase": m.phase.value}
        if m.offering:
            row["offering"] = m.offering
        if m.region_class:
            row["regionClass"] = m.region_class
        probe = report.get("probe") or {}
        if int(report.get("epoch") or 0) == current and probe:
            probes.append(probe)
            if probe.get("path"):
                row["path"] = probe["path"]
        rows.append(row)
    out["members"] = rows
    if probes:
        out["probe"] = weakest(probes)
        out["transport"] = out["probe"].get("path", "")
        if not out["transport"]:
            del out["transport"]
    elif prev.get("epoch") == current and prev.get("probe"):
        out["probe"] = prev["probe"]
    return out


def weakest(probes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The gang's probe: the slowest pair's RTT, the lowest bus bandwidth and the weakest path."""
    rtts = [float(p["rttMs"]) for p in probes if _number(p.get("rttMs"))]
    buses = [float(p["busGbps"]) for p in probes if _number(p.get("busGbps"))]
    paths = [p.get("path") for p in probes if p.get("path") in PATH_ORDER]
    times: list[str] = [p["measuredTime"] for p in probes if p.get("measuredTime")]
    out: dict[str, Any] = {}
    if rtts:
        out["rttMs"] = f"{max(rtts):.3f}"
    if buses:
        out["busGbps"] = f"{min(buses):.3f}"
    if paths:
        out["path"] = max(paths, key=PATH_ORDER.index)
    if times:
        out["measuredTime"] = max(times)
    return out


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
