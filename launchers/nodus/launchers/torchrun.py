"""Torchrun: one `torchrun` per node, which starts one worker per GPU (one on a CPU-only node).

Flags from torch/distributed/run.py (`get_args_parser`; checked against torch 2.13's
`torchrun --help`): `--nnodes`, `--nproc_per_node`, `--node_rank`, `--master_addr`,
`--master_port` for the static rendezvous; `--rdzv_backend c10d --rdzv_endpoint HOST:PORT
--rdzv_id ID` for the elastic one, where torch assigns node ranks itself and ignores
`--node_rank`. We write the underscore spellings: every torchrun release accepts them, while
the hyphenated ones the docs now show (`--nproc-per-node`) are later aliases
(pytorch/pytorch#65052) that older releases reject (huggingface/pytorch-image-models#1742).
`-m` runs a module, `--no_python` runs any other program as it is.
"""
from __future__ import annotations

from .contract import member_env
from .model import Launch, MemberPlan, Role
from .pycommand import script_argv


def rdzv_id(plan: MemberPlan) -> str:
    """The same on every member of one epoch, different across epochs and Jobs."""
    parts = [p for p in (plan.project, plan.job) if p] or ["nodus"]
    return "-".join([*parts, f"e{plan.rendezvous.epoch}"])


def torchrun(plan: MemberPlan) -> Launch:
    topology, rendezvous = plan.topology, plan.rendezvous
    argv = ["torchrun", "--nnodes", str(topology.nodes),
            "--nproc_per_node", str(topology.procs_per_node)]
    if rendezvous.backend == "c10d":
        argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", rendezvous.endpoint,
                 "--rdzv_id", rdzv_id(plan)]
    else:
        # torchrun's help: an IPv6 master address goes in brackets.
        argv += ["--node_rank", str(plan.rank), "--master_addr", rendezvous.host,
                 "--master_port", str(rendezvous.port)]
    argv += script_argv(plan.argv, "-m", "--no_python")
    return Launch("Torchrun", plan.rank, Role.MEMBER, tuple(argv), member_env(plan))
