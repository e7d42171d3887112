"""The values a launcher reads (Topology, Rendezvous, MemberPlan) and the one it returns (Launch).

Every value checks itself when it is made, so a launcher never sees a gang that cannot exist:
an impossible topology, rank or port is a ValueError naming the field, not a strange argv.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

RENDEZVOUS_BACKENDS = ("static", "c10d")
"""static: every member is told rank 0's address and its own rank; c10d: torch's elastic store."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class Topology:
    """The resolved shape of a gang (`status.topology`); it never changes across epochs."""

    nodes: int
    """Members in the gang, one per node."""
    gpus_per_node: int
    """GPUs each member drives; 0 for a CPU-only gang."""
    accelerator: str = ""
    """The resolved accelerator id; informational for launchers."""
    network: str = ""
    """Colocated, Regional or Global; informational for launchers."""

    def __post_init__(self) -> None:
        _require(isinstance(self.nodes, int) and self.nodes >= 1,
                 f"topology.nodes must be an integer of at least 1, got {self.nodes!r}")
        _require(isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 0,
                 f"topology.gpus_per_node must be an integer of at least 0, got {self.gpus_per_node!r}")

    @property
    def procs_per_node(self) -> int:
        """Worker processes a launcher starts on each node: one per GPU, one on a CPU-only node."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        """Worker processes in the whole gang: nodes × max(gpus_per_node, 1) (NODUS_WORLD_SIZE)."""
        return self.nodes * self.procs_per_node


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the gang meets in one epoch: rank 0's advertised address and a port the coordinator chose."""

    address: str
    """Rank 0's advertised address (IPv4, IPv6 or a host name)."""
    port: int
    """A free port on rank 0: torch's store, Ray's GCS, Accelerate's and DeepSpeed's master port."""
    epoch: int
    """The gang epoch, from 1; the fencing token of a restart."""
    backend: str = "static"
    """static or c10d; only Torchrun and Accelerate distinguish them."""

    def __post_init__(self) -> None:
        _require(isinstance(self.address, str) and self.address.strip() != ""
                 and not any(c.isspace() for c in self.address),
                 f"rendezvous.address must be a host or IP without spaces, got {self.address!r}")
        _require(isinstance(self.port, int) and not isinstance(self.port, bool)
                 and 1 <= self.port <= 65535,
                 f"rendezvous.port must be in 1..65535, got {self.port!r}")
        _require(isinstance(self.epoch, int) and self.epoch >= 1,
                 f"rendezvous.epoch must be an integer of at least 1, got {self.epoch!r}")
        _require(self.backend in RENDEZVOUS_BACKENDS,
                 f"rendezvous.backend must be one of {', '.join(RENDEZVOUS_BACKENDS)}, "
                 f"got {self.backend!r}")

    @property
    def host(self) -> str:
        """The address as it goes before `:port`: IPv6 literals in brackets."""
        if ":" in self.address and not self.address.startswith("["):
            return f"[{self.address}]"
        return self.address

    @property
    def endpoint(self) -> str:
        """host:port (NODUS_RENDEZVOUS, torch's rdzv endpoint, Ray's GCS address)."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class MemberPlan:
    """Everything a launcher needs to start one member (one node) of a gang."""

    rank: int
    """The member's node rank, 0 ≤ rank < topology.nodes; rank 0 hosts the rendezvous."""
    topology: Topology
    rendezvous: Rendezvous
    command: tuple[str, ...]
    """The Job's command (its entrypoint), as a list of words; never run through a shell."""
    args: tuple[str, ...] = ()
    """The Job's args, appended to command."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment the agent built for the attempt; the launch adds to it."""
    job: str = ""
    """The Job's name; names torchrun's c10d rendezvous id."""
    project: str = ""
    """The Job's project; names torchrun's c10d rendezvous id."""
    address: str = ""
    """This member's own advertised address, when known (Ray workers bind to it)."""
    launcher_dir: str = "/nodus/launcher"
    """A directory private to the attempt where the agent writes `Launch.files` (DeepSpeed's hostfile)."""
    startup_timeout_s: int = 900
    """How long a head may wait for the other members to join (Ray); the gang's startupTimeout."""

    def __post_init__(self) -> None:
        _require(isinstance(self.rank, int) and 0 <= self.rank < self.topology.nodes,
                 f"rank must be in 0..{self.topology.nodes - 1} for a gang of "
                 f"{self.topology.nodes} nodes, got {self.rank!r}")
        _require(all(isinstance(w, str) for w in (*self.command, *self.args)),
                 "command and args must be strings")
        _require(self.launcher_dir.startswith("/"),
                 f"launcher_dir must be an absolute path, got {self.launcher_dir!r}")
        _require(isinstance(self.startup_timeout_s, int) and self.startup_timeout_s >= 1,
                 f"startup_timeout_s must be a positive integer, got {self.startup_timeout_s!r}")

    @property
    def argv(self) -> tuple[str, ...]:
        """command + args: what the member would run without a launcher."""
        return (*self.command, *self.args)


class Role(StrEnum):
    """What a member's main step is for."""

    MEMBER = "member"
    """Every member runs the command (Plain, Torchrun, Accelerate, Deepspeed)."""
    HEAD = "head"
    """Rank 0 of a Ray cluster: starts the cluster, then runs the command as the driver."""
    WORKER = "worker"
    """Any other rank of a Ray cluster: joins the head and serves it until the head is done."""


@dataclass(frozen=True, slots=True)
class Launch:
    """One member's process steps. The agent runs them without knowing which launcher made them:

    1. write every entry of `files` (absolute path → content);
    2. if `waits_for_head`, wait until the rendezvous endpoint (rank 0's address:port) accepts
       TCP connections, within the gang's startup budget;
    3. run each `setup` step in order; a non-zero exit is a failure to start;
    4. run `argv`, the main step. Where `runs_command` is true its exit status is this rank's
       result. Where it is false the step is a service: the member is done when the gang's
       command is done, and the agent then stops it (SIGTERM) without counting its exit;
       an exit of its own before that is a lost member;
    5. run each `teardown` step in order once the main step has ended, however it ended
       (also on cancel); their failures are logged, never the member's result.

    `env` is the whole environment of every step.
    """

    launcher: str
    rank: int
    role: Role
    argv: tuple[str, ...]
    """The main step."""
    env: dict[str, str]
    setup: tuple[tuple[str, ...], ...] = ()
    teardown: tuple[tuple[str, ...], ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    """Absolute path → text the agent writes before the first step."""
    runs_command: bool = True
    """The main step runs the Job's command, and its exit status is this rank's result."""
    waits_for_head: bool = False
    """Start only once rank 0 listens on the rendezvous endpoint (rank 0's setup opens it)."""

    @property
    def steps(self) -> tuple[tuple[str, ...], ...]:
        """setup, main and teardown in the order they run."""
        return (*self.setup, self.argv, *self.teardown)
