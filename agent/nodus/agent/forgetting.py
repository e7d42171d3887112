"""Forgetting ended attempts: once the coordinator acknowledged an attempt's end (and its log shipped),
the agent drops it from its table, keeps its tombstone, and removes its directory.

Ends acknowledged together are forgotten together: one state.json write and one removal pass for all
of them, the tombstones fsynced before the directories go (ADR 0036). Until then state.json may still
list one whose directory is gone; a restart meanwhile re-reports its end (a no-op for the coordinator)
and forgets it again, as after a crash between a removal and the write.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine, Protocol

from . import layout as L
from .table import AttemptTable

log = logging.getLogger("nodus.agent")

FORGET_BATCH_SECONDS = 0.01  # acknowledged ends within this are forgotten with one state.json write


class Remover(Protocol):
    def layout(self, attempt_id: str) -> L.AttemptLayout: ...

    def remove(self, layout: L.AttemptLayout) -> None: ...


class Forgetful(Protocol):
    def forget(self, attempt_id: str) -> None: ...


class Forgetting:
    def __init__(self, table: AttemptTable, runtime: Remover, checkpoints: Forgetful,
                 spawn_task: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        self.table = table
        self.runtime = runtime
        self.checkpoints = checkpoints
        self.spawn_task = spawn_task
        self.doomed: list[L.AttemptLayout] = []
        """Directories of forgotten attempts, removed by the next sweep (or at shutdown, or by the
        agent's `load` after a restart)."""
        self.sweeper: asyncio.Task[None] | None = None

    def forget(self, attempt_id: str) -> None:
        """Drops the attempt now; its directory goes with the next sweep (`sweep_soon`)."""
        v = self.table.forget(attempt_id)
        self.checkpoints.forget(attempt_id)
        if v and v.log_task:
            v.log_task.cancel()
        self.doomed.append(self.runtime.layout(attempt_id))

    def sweep_soon(self) -> None:
        if self.sweeper is None:
            self.sweeper = self.spawn_task(self._sweep(), "forget")

    async def _sweep(self) -> None:
        try:
            await asyncio.sleep(FORGET_BATCH_SECONDS)
        finally:
            self.sweeper = None  # cancelled (shutdown): what is doomed stays for shutdown to remove
        doomed, self.doomed = self.doomed, []
        self.table.persist()
        try:
            await self.table.flush()  # the tombstones on disk before the directories go
        except asyncio.CancelledError:
            self.doomed.extend(doomed)  # for shutdown to remove, once it has flushed
            raise
        if doomed:
            await asyncio.to_thread(self.remove_dirs, doomed)

    def remove_left(self) -> None:
        """At shutdown, once state.json holds the tombstones: what no sweep removed yet."""
        doomed, self.doomed = self.doomed, []
        self.remove_dirs(doomed)

    def remove_dirs(self, layouts: list[L.AttemptLayout]) -> None:
        for layout in layouts:
            self.remove_dir(layout)

    def remove_dir(self, layout: L.AttemptLayout) -> None:
        if layout.root.exists():
            try:
                self.runtime.remove(layout)
            except OSError as e:
                log.warning("could not remove %s: %s", layout.root, e)
