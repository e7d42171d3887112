"""What the host is: CPUs, memory and disk (psutil) and GPUs (NVML), as NodeInventory."""
from __future__ import annotations

import socket
from pathlib import Path

import psutil

from nodus.v1 import common_pb2

from .nvml import Nvml

try:
    from importlib.metadata import version as _dist_version

    AGENT_VERSION = _dist_version("nodus")
except Exception:  # noqa: BLE001 - running from a tree without metadata
    AGENT_VERSION = "0.0.0"


def host(work_dir: Path, nvml: Nvml) -> common_pb2.HostInventory:
    disk = psutil.disk_usage(str(work_dir))
    return common_pb2.HostInventory(cpus=psutil.cpu_count(logical=True) or 1,
                                    memory_bytes=psutil.virtual_memory().total, disk_bytes=disk.total,
                                    driver_version=nvml.driver_version if nvml.handles else "",
                                    cuda_version=nvml.cuda_version if nvml.handles else "")


def disk_free(work_dir: Path) -> int:
    return int(psutil.disk_usage(str(work_dir)).free)


def parse_labels(text: str | dict[str, str] | None) -> dict[str, str]:
    """`k=v,k2=v2` (flag or env) or a mapping (config file)."""
    if not text:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    labels: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {part!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


def node_inventory(work_dir: Path, nvml: Nvml, *, runtimes: list[common_pb2.Runtime], region: str, offering: str,
                   labels: dict[str, str], advertise_address: str, interruptible: bool) -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(
        hostname=socket.gethostname(), agent_version=AGENT_VERSION, runtimes=runtimes, region_class=region,
        offering=offering, labels=labels, host=host(work_dir, nvml), gpus=nvml.read(),
        advertise_address=advertise_address, interruptible=interruptible)


def default_address() -> str:
    """The address of the interface that routes off the host (no packet is sent), else the host name."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()
