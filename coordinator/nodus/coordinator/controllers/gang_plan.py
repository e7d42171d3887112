"""The step each gang member is told (its GangPlan), derived from what its epoch's members reported,
so a resent report or a reconnect changes nothing (the gang's decisions are `gang.py`'s)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..clock import seconds
from .gang import ASSEMBLE, DEFAULT_STARTUP_TIMEOUT, MESH, START, GangConfig, done_step, report_of, topology


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


def plan_for(attempt: Mapping[str, Any], siblings: Sequence[Mapping[str, Any]], job: Mapping[str, Any],
             config: GangConfig) -> Plan | None:
    """The step `attempt` (a gang member) should take now, from what its epoch's members reported."""
    gang = (attempt.get("spec") or {}).get("gang") or {}
    if not gang:
        return None
    epoch, rank = int(gang.get("epoch") or 0), int(gang.get("rank") or 0)
    spec = job.get("spec") or {}
    topo = topology(spec, (job.get("status") or {}).get("topology"))
    size = int(gang.get("size") or topo["nodes"])
    dist = spec.get("distributed") or {}
    same = [s for s in siblings if int(((s.get("spec") or {}).get("gang") or {}).get("epoch") or 0) == epoch
            and (s.get("spec") or {}).get("jobUID") == (attempt.get("spec") or {}).get("jobUID")]
    by_rank = {int(((s.get("spec") or {}).get("gang") or {}).get("rank") or 0): s for s in same}
    base = Plan(attempt_id=(attempt.get("spec") or {}).get("id", ""), gang_id=f"{(job.get('metadata') or {}).get('uid', '')}",
                epoch=epoch, rank=rank, size=size, gpus_per_node=int(topo.get("gpusPerNode") or 0),
                launcher=dist.get("launcher") or "Plain", step=ASSEMBLE,
                startup_timeout=seconds(dist.get("startupTimeout")) or DEFAULT_STARTUP_TIMEOUT)
    if len(by_rank) < size:
        return base
    steps = [done_step(report_of(by_rank[r]), epoch) for r in range(size)]
    if any(s == "" for s in steps):
        return base
    peers = []
    for r in range(size):
        report = report_of(by_rank[r])
        peers.append((r, str(report.get("address") or ""), int(report.get("port") or 0),
                      int(report.get("probePort") or 0)))
    rank0 = peers[0]
    step = MESH if config.probe and any(s == ASSEMBLE for s in steps) else START
    return replace(base, step=step, rendezvous_address=rank0[1], rendezvous_port=rank0[2], peers=tuple(peers))
