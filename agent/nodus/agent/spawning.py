"""An attempt's supervisor is forked while state.json's fsync runs, and starts its first step once the
fsync is done (ADR 0082).

The rule of table.py holds: the SUPERVISED stage is on disk before anything of the attempt runs. What
runs before it is on disk is the supervisor alone (its spec read, its cgroup made, its first cgroup move
with the kernel's wait), at its start gate (supervisor/start_gate.py); the fsync, ~8 ms on a loaded host,
no longer stands in front of all of that.
"""
from __future__ import annotations

import asyncio
import os

from nodus.v1 import agent_pb2

from .layout import AttemptLayout
from .runtime.process import ProcessRuntime, Spawned
from .supervisor.start_gate import open_gate, shut_gate
from .table import AttemptTable


async def spawn_gated(runtime: ProcessRuntime, table: AttemptTable, a: agent_pb2.Assignment,
                      layout: AttemptLayout) -> Spawned:
    """Writes the spec and forks the supervisor (one thread hop) while every change persisted so far is
    fsynced; opens the gate once both are done. Raises what either raised (the gate then stays shut and
    the supervisor ends LOST having run nothing)."""
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    flushed = asyncio.ensure_future(table.flush())
    opened = False
    try:
        try:
            spawned = await asyncio.to_thread(_write_and_spawn, runtime, a, layout, gate_r)
        finally:
            os.close(gate_r)  # the supervisor holds its own copy
        await flushed
        open_gate(gate_w)
        opened = True
        return spawned
    finally:
        if not opened:
            shut_gate(gate_w)
            if not flushed.done():
                flushed.cancel()
            elif not flushed.cancelled():
                flushed.exception()  # retrieved: the writer logged it, and our caller has the spawn's error


def _write_and_spawn(runtime: ProcessRuntime, a: agent_pb2.Assignment, layout: AttemptLayout, gate: int) -> Spawned:
    runtime.write_spec(a, layout)
    return runtime.spawn(a, layout, gate)
