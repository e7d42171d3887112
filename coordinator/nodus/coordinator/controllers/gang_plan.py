"""The step each gang member is told (its GangPlan), derived from what its epoch's members reported,
so a resent report or a reconnect changes nothing (the gang's decisions are `gang.py`'s)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .gang import ASSEMBLE, DEFAULT_STARTUP_TIMEOUT, MESH, START, GangConfig, done_step
from .views import AttemptView, JobView


@dataclass(frozen=True, slots=True)
class Plan:
    """The GangPlan of one member, as plain values (agent_session.py turns it into the proto)."""

    attempt_id: str
    gang_id: str
    epoch: int
    rank: int
    size: int
    gpus_per_node: int
    launcher: str
    step: str
    rendezvous_address: str = ""
    rendezvous_port: int = 0
    peers: tuple[tuple[int, str, int, int], ...] = ()
    """(rank, address, port, probe port) of every member, rank 0 first."""
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT


def plan(attempt: AttemptView, siblings: Sequence[AttemptView], job: JobView, config: GangConfig) -> Plan | None:
    """The step `attempt` (a gang member) should take now, from what its epoch's members reported."""
    if not attempt.in_gang:
        return None
    epoch, rank = attempt.epoch, attempt.rank
    size = attempt.gang_size or int(job.topology.get("nodes") or 0)
    by_rank = {s.rank: s for s in siblings if s.epoch == epoch and s.job_uid == attempt.job_uid}
    base = Plan(attempt_id=attempt.id, gang_id=job.uid, epoch=epoch, rank=rank, size=size,
                gpus_per_node=int(job.topology.get("gpusPerNode") or 0), launcher=job.launcher, step=ASSEMBLE,
                startup_timeout=job.startup_timeout)
    if len(by_rank) < size:
        return base
    steps = [done_step(by_rank[r].gang_report, epoch) for r in range(size)]
    if any(s == "" for s in steps):
        return base
    peers = []
    for r in range(size):
        report = by_rank[r].gang_report
        peers.append((r, str(report.get("address") or ""), int(report.get("port") or 0),
                      int(report.get("probePort") or 0)))
    rank0 = peers[0]
    step = MESH if config.probe and any(s == ASSEMBLE for s in steps) else START
    return replace(base, step=step, rendezvous_address=rank0[1], rendezvous_port=rank0[2], peers=tuple(peers))

