"""The agent's settings (main.py builds them from flags, the config file and NODUS_* variables).

Kept import-light: main.py validates the flags before the daemon (grpc, psutil) is imported.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .gpu_health import DEFAULT_MAX_TEMPERATURE_C

_SIZE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_SIZES = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12}


CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""The CDI spec directories a host's toolkit writes to (oci/cdi.py's SPEC_DIRS; here so main.py stays light)."""

DEFAULT_ATTEMPT_UIDS = "200000:65536"
"""--attempt-uids: the uids (gids) the agent gives attempts, one each (uids.py, ADR 0040)."""

RUNTIME_TOOLS = ("runc", "skopeo", "umoci")
"""What the node needs on its PATH to run images (Debian packages of the same names)."""


def choose_runtime(asked: str) -> str:
    """`--runtime process|oci|auto` -> the runtime this node runs; oci without its tools is an error."""
    missing = [tool for tool in RUNTIME_TOOLS if shutil.which(tool) is None]
    if asked == "auto":
        return "oci" if not missing else "process"
    if asked == "oci" and missing:
        raise ValueError(f"the oci runtime needs {', '.join(RUNTIME_TOOLS)} on the PATH and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing; install the Debian packages "
                         f"{' '.join(missing)} or run --runtime process")
    if asked not in ("process", "oci"):
        raise ValueError(f"{asked!r} is not process, oci or auto")
    return asked


def parse_size(text: str) -> int:
    """A byte count such as 20Gi, 500M or 1024."""
    m = _SIZE.match(str(text).strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size such as 20Gi, 500Mi or 10G")
    return int(m.group(1)) * _SIZES[m.group(2)]


@dataclass(frozen=True, slots=True)
class SimulatedGpus:
    """`--simulate-gpus MODEL:COUNT[:MEMORY]`: GPUs the agent pretends to have, for development and tests."""

    model: str
    """The product name reported, for example H100 (placement reads its family from it)."""
    count: int
    memory_bytes: int = 0
    """Per GPU; 0 when MEMORY is left out (it then fits no offering that sells GPU memory)."""

    @classmethod
    def parse(cls, text: str) -> "SimulatedGpus":
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0].strip():
            raise ValueError(f"{text!r} is not MODEL:COUNT[:MEMORY], for example H100:8:80Gi")
        model, count = parts[0].strip(), parts[1].strip()
        if not count.isdigit() or not 1 <= int(count) <= 64:
            raise ValueError(f"COUNT {count!r} must be a whole number from 1 to 64, for example H100:8:80Gi")
        memory = 0
        if len(parts) == 3:
            m = _SIZE.match(parts[2].strip())
            if m is None or int(m.group(1)) == 0:
                raise ValueError(f"MEMORY {parts[2]!r} must be a size such as 80Gi or 24G")
            memory = int(m.group(1)) * _SIZES[m.group(2)]
        return cls(model, int(count), memory)


@dataclass(slots=True)
class AgentConfig:
    coordinator: str
    node: str
    work_dir: Path
    token: str
    runtime: str = "process"
    region: str = ""
    offering: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    advertise_address: str = ""
    interruptible: bool = False
    cgroup_root: str = "nodus"
    cgroups: bool = True
    stop_grace: float = 10.0
    poll_interval: float = 0.5
    input_ca_file: str | None = None
    coordinator_ca: bytes | None = None
    """The CA the coordinator's gRPC certificate is verified with; None: the system's roots."""
    coordinator_ca_file: Path | None = None
    """--coordinator-ca's file, re-read on every reconnect: a coordinator with a new CA is noticed."""
    join_token_file: Path | None = None
    """--join-token-file, re-read before every enrolment: an operator replaces a rotated token in place."""
    coordinator_insecure: bool = False
    """Plaintext gRPC, for a coordinator run with --grpc-insecure (loopback only)."""
    reconnect_base: float = 0.2
    reconnect_max: float = 10.0
    clock_offset_file: str = ""
    """--clock-offset-file: seconds added to every reported time (clock.agent_clock); empty: none."""
    workload_user: str = ""
    attempt_uids: str = DEFAULT_ATTEMPT_UIDS
    """START:COUNT, or "off"; not used with workload_user, nor when the agent is not root."""
    zygote: bool = True
    warm_probe: bool = True
    """Keep a probe process ready (torch imported) once this host has run a probed gang member."""
    simulate_gpus: SimulatedGpus | None = None
    """Report these GPUs, marked simulated, instead of what NVML sees."""
    simulate_gpu_faults: Path | None = None
    """--simulate-gpu-faults: readings the simulated GPUs report (nvml.SimulatedNvml), read at every reading."""
    gpu_max_temperature: int = DEFAULT_MAX_TEMPERATURE_C
    """A GPU at or above this many °C takes no new work (gpu_health)."""
    image_cache: Path | None = None
    """The oci runtime's image store; None is images/ under the work dir."""
    image_disk_budget: int = 20 << 30
    """Bytes the image store may hold before it collects unused images."""
    insecure_registries: tuple[str, ...] = ()
    """Registries (host:port) reached over plain HTTP or unverified TLS."""
    cdi_dirs: tuple[Path, ...] = CDI_DIRS
    """Where the host's CDI specs are, lowest priority first (tests point it at a test spec)."""
    egress_presets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The operator's `network.egress` presets (name -> DNS names or *.suffix patterns) over the built-in ones."""
    egress_range: str = "10.213.0.0/16"
    """IPv4 range the pods' routed links take a /30 of each (Open and AllowList)."""
    egress_interface_prefix: str = "nodus"
    """Host-side veth names: this plus the pod's id slot."""
    egress_uplinks: tuple[str, ...] | None = None
    """Interfaces the pods' traffic leaves by, whose forwarding is turned on; None turns on ip_forward."""
