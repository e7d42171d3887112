"""Runtimes run an attempt's processes: `process` (the node's own environment) today, `oci` later."""
from __future__ import annotations

from .process import ProcessRuntime, Refused

__all__ = ["ProcessRuntime", "Refused"]
