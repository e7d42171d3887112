"""The gang variables every launcher sets (DESIGN.md, "Inside an attempt")."""
from __future__ import annotations

from .model import MemberPlan

GANG_VARIABLES = (
    "NODUS_RANK", "NODUS_NODES", "NODUS_GPUS_PER_NODE", "NODUS_WORLD_SIZE",
    "NODUS_RENDEZVOUS", "NODUS_GANG_EPOCH", "MASTER_ADDR", "MASTER_PORT",
)


def gang_env(plan: MemberPlan) -> dict[str, str]:
    """The contract's gang variables for one member.

    NODUS_RANK is the node rank (not a process rank: a launcher may start several processes).
    NODUS_WORLD_SIZE is nodes × max(gpus_per_node, 1): the worker processes a per-GPU launcher
    starts across the gang, one per node on a CPU-only gang. NODUS_RENDEZVOUS is host:port with
    IPv6 literals in brackets; MASTER_ADDR is the bare address, as torch's env:// reads it.
    """
    topology, rendezvous = plan.topology, plan.rendezvous
    return {
        "NODUS_RANK": str(plan.rank),
        "NODUS_NODES": str(topology.nodes),
        "NODUS_GPUS_PER_NODE": str(topology.gpus_per_node),
        "NODUS_WORLD_SIZE": str(topology.world_size),
        "NODUS_RENDEZVOUS": rendezvous.endpoint,
        "NODUS_GANG_EPOCH": str(rendezvous.epoch),
        "MASTER_ADDR": rendezvous.address,
        "MASTER_PORT": str(rendezvous.port),
    }


def member_env(plan: MemberPlan, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The attempt's environment, then the gang variables, then the launcher's own.

    Later layers win: a Job cannot point NODUS_RANK or MASTER_PORT somewhere else by accident.
    """
    env = dict(plan.env)
    env.update(gang_env(plan))
    env.update(extra or {})
    return env
