"""DeepSpeed: one `deepspeed` runner per node, started by us instead of over ssh.

`--no_ssh` with `--node_rank` first shipped in deepspeed 0.14.5 (deepspeedai/DeepSpeed#5728;
0.14.4's runner.py has neither flag), and is checked against deepspeed 0.19.8's runner.py. Even
without ssh the runner reads the node list from a hostfile (`fetch_hostfile`): with none it falls
back to the local GPUs, forces master_addr to 127.0.0.1 and refuses `--num_nodes` > 1. So every
member gets the same generated hostfile (`node-<rank> slots=<procs>`, MPI style, parsed by
`_parse_hostfile`); the names are keys of the world info, never dialled. The flags:
`--hostfile`, `--no_ssh`, `--node_rank`, `--master_addr`, `--master_port`, `--num_nodes`,
`--num_gpus`, `--module`, `--no_python`, `--no_local_rank` (underscores only: the runner has
no hyphenated spellings).

DeepSpeed passes `--local_rank=N` as the first argument after the program (launch.py). A Python
script written for DeepSpeed expects it, so it stays; any other program would get it as its own
first argument (`env --local_rank=0 …` fails), so `--no_python` comes with `--no_local_rank`, and
such programs read LOCAL_RANK from the environment. The runner hands the script's arguments to
deepspeed.launcher.launch without a `--`, so an argument that abbreviates one of launch.py's
options (`--m`, `--node`) still fails there; that is DeepSpeed's parsing and cannot be fixed by
flags (seen with 0.19.8).
"""
from __future__ import annotations

from .contract import member_env
from .model import Launch, MemberPlan, Role
from .pycommand import script_argv

HOSTFILE = "deepspeed-hostfile"


def hostfile_text(plan: MemberPlan) -> str:
    slots = plan.topology.procs_per_node
    return "".join(f"node-{rank} slots={slots}\n" for rank in range(plan.topology.nodes))


def deepspeed(plan: MemberPlan) -> Launch:
    topology, rendezvous = plan.topology, plan.rendezvous
    hostfile = f"{plan.launcher_dir.rstrip('/')}/{HOSTFILE}"
    argv = ["deepspeed", "--hostfile", hostfile, "--no_ssh", "--node_rank", str(plan.rank),
            "--master_addr", rendezvous.address, "--master_port", str(rendezvous.port),
            "--num_nodes", str(topology.nodes), "--num_gpus", str(topology.procs_per_node)]
    tail = script_argv(plan.argv, "--module", "--no_python")
    if tail[0] == "--no_python":
        argv.append("--no_local_rank")
    argv += tail
    return Launch("Deepspeed", plan.rank, Role.MEMBER, tuple(argv), member_env(plan),
                  files={hostfile: hostfile_text(plan)})
