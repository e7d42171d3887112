"""Ray and Verl: the gang becomes one Ray cluster; the command runs once, on the head, as the driver.

Flags from ray/scripts/scripts.py (`ray start`, `ray stop`; docs.ray.io "Cluster Management
CLI"; checked against ray 2.60): `ray start --head --port P --node-ip-address A --num-gpus G`
starts the head and returns once it listens; `ray start --address A:P --num-gpus G --block`
joins a worker and stays in the foreground until stopped; `ray stop` ends the Ray processes of
the host. verl's multinode guide (volcengine/verl docs/start/multinode.rst) starts its clusters
the same way and checks membership with `ray.nodes()` before it trains.

Rank 0 (head): setup starts the head, then waits until all `nodes` members are alive in the
cluster (the command would otherwise plan its placement on a partial cluster); the main step is
the command with RAY_ADDRESS pointing at the cluster (ray.init() reads it); teardown `ray stop`.
Other ranks (workers): wait for the head's port, then `ray start … --block` as a service; they
run no command, and teardown `ray stop`.

Verl is the same cluster; the command also gets the Hydra overrides `trainer.nnodes=N
trainer.n_gpus_per_node=G` (verl/trainer/config/ppo_trainer.yaml), replacing any the Job set:
the topology the gang was placed on is the one verl must plan for.
"""
from __future__ import annotations

import re

from .contract import member_env
from .model import Launch, MemberPlan, Role

# Joins a driver to the cluster and polls until `want` nodes are alive; argv: want, budget, address.
WAIT_FOR_NODES = """\
import sys, time
import ray
want, budget, address = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ray.init(address=address)
deadline = time.monotonic() + budget
while True:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    if alive >= want:
        break
    if time.monotonic() >= deadline:
        sys.exit(f"nodus: {alive} of {want} Ray nodes joined within {budget:.0f}s")
    time.sleep(1)
ray.shutdown()
"""

_VERL_TOPOLOGY_KEYS = re.compile(r"\+{0,2}trainer\.(nnodes|n_gpus_per_node)=.*", re.DOTALL)


def _ray_env(plan: MemberPlan) -> dict[str, str]:
    # RAY_ADDRESS: ray.init() in the command (and in verl) joins this cluster instead of starting one.
    # RAY_USAGE_STATS_ENABLED=0: nothing about a customer's run leaves the host.
    return member_env(plan, {"RAY_ADDRESS": plan.rendezvous.endpoint,
                             "RAY_USAGE_STATS_ENABLED": "0"})


def _python_for(argv: tuple[str, ...]) -> str:
    """The interpreter that can import ray: the command's own when it is a Python program."""
    if argv and re.fullmatch(r"(.*/)?python(\d+(\.\d+)?)?", argv[0]):
        return argv[0]
    return "python3"


def ray_launch(plan: MemberPlan, command: tuple[str, ...], name: str) -> Launch:
    topology, rendezvous = plan.topology, plan.rendezvous
    gpus = str(topology.gpus_per_node)
    stop = (("ray", "stop"),)
    env = _ray_env(plan)
    if plan.rank == 0:
        start = ("ray", "start", "--head", "--port", str(rendezvous.port),
                 "--node-ip-address", rendezvous.address, "--num-gpus", gpus)
        wait = (_python_for(command), "-c", WAIT_FOR_NODES, str(topology.nodes),
                str(plan.startup_timeout_s), rendezvous.endpoint)
        return Launch(name, 0, Role.HEAD, command, env, setup=(start, wait), teardown=stop)
    join = ["ray", "start", "--address", rendezvous.endpoint, "--num-gpus", gpus]
    if plan.address:
        join += ["--node-ip-address", plan.address]
    join.append("--block")
    return Launch(name, plan.rank, Role.WORKER, tuple(join), env, teardown=stop,
                  runs_command=False, waits_for_head=True)


def ray(plan: MemberPlan) -> Launch:
    return ray_launch(plan, plan.argv, "Ray")


def verl(plan: MemberPlan) -> Launch:
    topology = plan.topology
    kept = tuple(w for w in plan.argv[1:] if not _VERL_TOPOLOGY_KEYS.fullmatch(w))
    command = (*plan.argv[:1], *kept, f"trainer.nnodes={topology.nodes}",
               f"trainer.n_gpus_per_node={topology.gpus_per_node}")
    return ray_launch(plan, command, "Verl")
