"""Runtimes run an attempt's processes: `process` (the node's own environment) and `oci` (runc pods for
attempts with an image, the process runtime's way for the others)."""
from __future__ import annotations

from .oci import OciRuntime, node_runtime
from .process import ProcessRuntime, Refused

__all__ = ["OciRuntime", "ProcessRuntime", "Refused", "node_runtime"]
