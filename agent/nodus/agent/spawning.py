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
from typing import Callable

from nodus.v1 import agent_pb2

from .layout import AttemptLayout
from .runtime.process import ProcessRuntime, Spawned
from .supervisor.start_gate import open_gate, shut_gate
from .table import AttemptTable


def nothing_to_fetch(a: agent_pb2.Assignment) -> bool:
    """Whether the attempt has no image, inputs, volume contents, source or checkpoint to fetch before its
    spawn: then its directories are made in the spawn's own thread hop (`spawn_gated`'s prepare), and its
    MATERIALIZING goes to the coordinator once, with its inputs ready."""
    return not (a.image or a.inputs or any(v.source.uri for v in a.volumes)
                or (a.HasField("source") and a.source.WhichOneof("source")) or a.HasField("restore_from"))


async def spawn_gated(runtime: ProcessRuntime, table: AttemptTable, a: agent_pb2.Assignment,
                      layout: AttemptLayout, prepare: Callable[[], None] | None = None) -> Spawned:
    """Writes the spec and forks the supervisor (one thread hop, after `prepare` where given: the attempt's
    directories) while every change persisted so far is fsynced; opens the gate once both are done. Raises
    what either raised (the gate then stays shut and the supervisor ends LOST having run nothing)."""
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    flushed = asyncio.ensure_future(table.flush())
    opened = False
    try:
        try:
            spawned = await asyncio.to_thread(_write_and_spawn, runtime, a, layout, gate_r, prepare)
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


def _write_and_spawn(runtime: ProcessRuntime, a: agent_pb2.Assignment, layout: AttemptLayout, gate: int,
                     prepare: Callable[[], None] | None) -> Spawned:
    if prepare is not None:
        prepare()
    runtime.write_spec(a, layout)
    return runtime.spawn(a, layout, gate)
