"""Ray and Verl: the gang becomes one Ray cluster; the command runs once, on the head, as the driver.

Flags from ray/scripts/scripts.py (`ray start`; docs.ray.io "Cluster Management CLI"; checked
against ray 2.60): `ray start --head --port P --node-ip-address A --num-gpus G --temp-dir T`
starts the head and returns once it listens; `ray start --address A:P --num-gpus G --temp-dir T
--block` joins a worker and stays in the foreground until stopped. verl's multinode guide
(volcengine/verl docs/start/multinode.rst) starts its clusters the same way and checks
membership with `ray.nodes()` before it trains.

Rank 0 (head): setup starts the head, then waits until all `nodes` members are alive in the
cluster (the command would otherwise plan its placement on a partial cluster); the main step is
the command with RAY_ADDRESS pointing at the cluster (ray.init() reads it). Other ranks
(workers): wait for the head's port, then `ray start … --block` as a service; they run no command.

Every node gets a `--temp-dir` of its own under /tmp, named by a hash of the member (its launcher
directory, Job, epoch and rank). Ray otherwise puts its session under $TMPDIR, which the agent
points into the attempt directory, and its socket paths (`…/ray/session_<time>_<pid>/sockets/
plasma_store`) outgrow the 107 bytes of an AF_UNIX path there: `ray start` fails (seen with ray
2.60); a worker would otherwise take the head's temp dir, a path on the head's host.

The teardown is not `ray stop`, which ends every Ray process of the host, other attempts' clusters
included: it ends the processes that name this node's temp dir and their process groups (the
group `ray start` left them in; the dashboard agent hides its command line but shares the group),
then removes the dir.

Verl is the same cluster; the command also gets the Hydra overrides `trainer.nnodes=N
trainer.n_gpus_per_node=G` (verl/trainer/config/ppo_trainer.yaml), replacing any the Job set:
the topology the gang was placed on is the one verl must plan for.
"""
from __future__ import annotations

import hashlib
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

# Ends this node's Ray processes (argv: temp dir, grace seconds): every process whose command line
# names the temp dir, and its process group, SIGTERM and after the grace SIGKILL; then the dir goes.
# The step itself, its ancestors and their groups are spared (a wrapper's command line may name the
# dir too). Linux /proc and the standard library only: any interpreter runs it.
STOP_NODE = """\
import os, shutil, signal, sys, time
temp_dir, grace = sys.argv[1], float(sys.argv[2])
def lineage():
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids
spared = lineage()
mine = {os.getpgrp()}
for pid in spared:
    try:
        mine.add(os.getpgid(pid))
    except OSError:
        pass
def named():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if int(pid) not in spared and temp_dir.encode() in f.read():
                    found.add((int(pid), os.getpgid(int(pid))))
        except OSError:
            pass
    return found
def send(found, groups, sig):
    for pid, _ in found:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    for group in groups:
        try:
            os.killpg(group, sig)
        except OSError:
            pass
found = named()
groups = {group for _, group in found} - {0, 1} - mine
send(found, groups, signal.SIGTERM)
deadline = time.monotonic() + grace
while (found := named()) and time.monotonic() < deadline:
    time.sleep(0.2)
send(found, groups, signal.SIGKILL)
shutil.rmtree(temp_dir, ignore_errors=True)
"""
STOP_GRACE_S = 3
"""Seconds the node's Ray processes get after SIGTERM. Short: once the command is done the cluster
holds nothing worth a graceful end, and gcs_server and the autoscaler's monitor outlast a SIGTERM
that reaches them together with the raylet (seen with ray 2.60, 15 s and more)."""

_VERL_TOPOLOGY_KEYS = re.compile(r"\+{0,2}trainer\.(nnodes|n_gpus_per_node)=.*", re.DOTALL)


def _ray_env(plan: MemberPlan) -> dict[str, str]:
    # RAY_ADDRESS: ray.init() in the command (and in verl) joins this cluster instead of starting one.
    # RAY_USAGE_STATS_ENABLED=0: nothing about a customer's run leaves the host.
    # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0: on SIGTERM `ray start --block` first asks the GCS to
    # drain the node, for up to 30 s (ray/_private/node.py, `_drain_node_before_shutdown`); a worker
    # is stopped once the head's command is done and its GCS is gone, so the ask would only wait
    # out the whole 30 s and the stop would end in a SIGKILL.
    return member_env(plan, {"RAY_ADDRESS": plan.rendezvous.endpoint,
                             "RAY_USAGE_STATS_ENABLED": "0",
                             "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})


def _python_for(argv: tuple[str, ...]) -> str:
    """The interpreter that can import ray: the command's own when it is a Python program."""
    if argv and re.fullmatch(r"(.*/)?python(\d+(\.\d+)?)?", argv[0]):
        return argv[0]
    return "python3"


def temp_dir(plan: MemberPlan) -> str:
    """This node's Ray root: short enough for Ray's socket paths, one per member on a host.

    The launcher dir tells attempts apart on a host; the rest, attempts in containers that all
    see their launcher dir at the same path."""
    key = "\0".join((plan.launcher_dir, plan.project, plan.job, str(plan.rendezvous.epoch), str(plan.rank)))
    return "/tmp/nodus-ray-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def ray_launch(plan: MemberPlan, command: tuple[str, ...], name: str) -> Launch:
    topology, rendezvous = plan.topology, plan.rendezvous
    gpus = str(topology.gpus_per_node)
    root = temp_dir(plan)
    stop = ((_python_for(command), "-c", STOP_NODE, root, str(STOP_GRACE_S)),)
    env = _ray_env(plan)
    if plan.rank == 0:
        start = ("ray", "start", "--head", "--port", str(rendezvous.port),
                 "--node-ip-address", rendezvous.address, "--num-gpus", gpus, "--temp-dir", root)
        wait = (_python_for(command), "-c", WAIT_FOR_NODES, str(topology.nodes),
                str(plan.startup_timeout_s), rendezvous.endpoint)
        return Launch(name, 0, Role.HEAD, command, env, setup=(start, wait), teardown=stop)
    join = ["ray", "start", "--address", rendezvous.endpoint, "--num-gpus", gpus, "--temp-dir", root]
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
