"""Accelerate: one `accelerate launch` per node.

Flags from accelerate/commands/launch.py (`launch_command_parser`; checked against accelerate
1.15): `--num_machines`, `--machine_rank`, `--main_process_ip`, `--main_process_port`,
`--num_processes` (the total over all machines), `--multi_gpu`, `--cpu`, `--rdzv_backend`,
`-m`, `--no_python`.

With GPUs and more than one process in all, `--multi_gpu` hands the node to torchrun
(`multi_gpu_launcher`), which sets RANK, WORLD_SIZE and LOCAL_RANK per worker. With `--cpu`
accelerate's `simple_launcher` starts one process and sets only MASTER_ADDR/MASTER_PORT
(`prepare_simple_launcher_cmd_env`), and Accelerator treats a process as part of a MULTI_CPU
run only when WORLD_SIZE > 1 or LOCAL_RANK is set (`PartialState._prepare_backend`); without
them every machine trains alone. So a CPU-only gang gets RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE from us, one process per node (checked: a two-machine CPU launch on loopback
all-reduces across both with them, and runs two single-process trainings without).
"""
from __future__ import annotations

from .contract import member_env
from .model import Launch, MemberPlan, Role
from .pycommand import script_argv


def accelerate(plan: MemberPlan) -> Launch:
    topology, rendezvous = plan.topology, plan.rendezvous
    argv = ["accelerate", "launch"]
    extra: dict[str, str] = {}
    if topology.gpus_per_node == 0:
        argv.append("--cpu")
        extra = {"RANK": str(plan.rank), "WORLD_SIZE": str(topology.nodes),
                 "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    elif topology.world_size > 1:
        argv.append("--multi_gpu")
    argv += ["--num_machines", str(topology.nodes), "--machine_rank", str(plan.rank),
             "--main_process_ip", rendezvous.address, "--main_process_port", str(rendezvous.port),
             "--num_processes", str(topology.world_size)]
    if rendezvous.backend == "c10d":
        argv += ["--rdzv_backend", "c10d"]
    argv += script_argv(plan.argv, "-m", "--no_python")
    return Launch("Accelerate", plan.rank, Role.MEMBER, tuple(argv), member_env(plan, extra))
