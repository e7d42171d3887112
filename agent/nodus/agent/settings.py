"""The agent's settings (main.py builds them from flags, the config file and NODUS_* variables).

Kept import-light: main.py validates the flags before the daemon (grpc, psutil) is imported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    reconnect_base: float = 0.2
    reconnect_max: float = 10.0
    workload_user: str = ""
    zygote: bool = True
