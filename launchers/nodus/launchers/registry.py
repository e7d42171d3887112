"""The launchers by their spec names (`distributed.launcher`), and the checks that apply to all of them."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from .accelerate import accelerate
from .contract import member_env
from .deepspeed import deepspeed
from .model import Launch, MemberPlan, Rendezvous, Role, Topology
from .ray_cluster import ray, verl
from .torchrun import torchrun


def plain(plan: MemberPlan) -> Launch:
    """The command as it is, with the gang variables; an empty command keeps the image's entrypoint."""
    return Launch("Plain", plan.rank, Role.MEMBER, plan.argv, member_env(plan))


BUILDERS: dict[str, Callable[[MemberPlan], Launch]] = {
    "Plain": plain,
    "Torchrun": torchrun,
    "Ray": ray,
    "Verl": verl,
    "Accelerate": accelerate,
    "Deepspeed": deepspeed,
}
LAUNCHERS: tuple[str, ...] = tuple(BUILDERS)
"""The values of `spec.distributed.launcher`, in the spec's order."""


def check(launcher: str, topology: Topology) -> None:
    """Refuse a launcher this gang cannot use; admission may call it before anything is placed."""
    if launcher not in BUILDERS:
        raise ValueError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    if launcher == "Verl" and topology.gpus_per_node == 0:
        raise ValueError("launcher Verl needs GPUs: verl places its workers on GPUs "
                         "(trainer.n_gpus_per_node), and this gang has gpus_per_node 0")


def launch(launcher: str, plan: MemberPlan) -> Launch:
    """One member's steps and environment under `launcher`. Pure: the same plan gives the same Launch."""
    check(launcher, plan.topology)
    if launcher != "Plain" and not plan.argv:
        raise ValueError(f"launcher {launcher} needs a command to run: the Job has no command or args")
    return BUILDERS[launcher](plan)


def launch_gang(launcher: str, topology: Topology, rendezvous: Rendezvous,
                command: tuple[str, ...], args: tuple[str, ...] = (),
                env: Mapping[str, str] | None = None, *, job: str = "", project: str = "",
                launcher_dir: str = "/nodus/launcher",
                startup_timeout_s: int = 900) -> tuple[Launch, ...]:
    """Every member's Launch, rank 0 first, for members that share one environment."""
    return tuple(
        launch(launcher, MemberPlan(rank, topology, rendezvous, tuple(command), tuple(args),
                                    dict(env or {}), job=job, project=project,
                                    launcher_dir=launcher_dir,
                                    startup_timeout_s=startup_timeout_s))
        for rank in range(topology.nodes))
