"""A running attempt whose GPU turned unhealthy gets a warning in its status (issue 16 item 6).

Agents judge their GPUs from NVML (agent/gpu_health.py) and say why a GPU is unhealthy in every
heartbeat; the node's lease keeps the newest verdicts (`gpuUnhealthy`), placement gives such a GPU no
new work, and the node's `GpusHealthy` condition names it (node_api). What already runs there is not
stopped: an Xid or a hot GPU does not always end a program, and killing it would lose what it has not
checkpointed. Instead the attempt's `status.warnings` carries a `GpuUnhealthy` warning naming the GPU,
the node and the agent's words, and its Job's `GpuHealthy` condition turns False (job.py), so the
customer sees it in `kubectl describe` and can checkpoint and move the Job. The warning goes away when
the GPU reads healthy again.

Level-triggered: a change to a node's lease queues that node's live attempts, a change to an attempt
queues it, and `warnings_for` (pure) says what the attempt's warnings should be.
"""
from __future__ import annotations

import logging
from typing import Any

from .attempt_machine import phase_of
from .cache import ATTEMPTS, LEASES, NODES, Cache, attempt_key
from .fleet import gpu_health
from .job_status import GPU_UNHEALTHY
from .objects import Objects
from .workqueue import WorkQueue, run_workers

log = logging.getLogger("nodus.controllers.gpu_warnings")

RESYNC_SECONDS = 60.0


def warnings_for(attempt: dict[str, Any], health: dict[int, str]) -> list[dict[str, str]]:
    """The attempt's status.warnings with one GpuUnhealthy warning per unhealthy GPU it holds (and
    none for the healthy ones); its other warnings are kept as they are."""
    spec, status = attempt.get("spec") or {}, attempt.get("status") or {}
    node = spec.get("node") or ""
    kept = [w for w in status.get("warnings") or [] if isinstance(w, dict) and w.get("code") != GPU_UNHEALTHY]
    for index in spec.get("gpuIndexes") or []:
        why = health.get(int(index), "")
        if why:
            kept.append({"code": GPU_UNHEALTHY,
                         "message": f'GPU {index} on node "{node}" is unhealthy ({why}); it gets no new work, '
                                    "this attempt keeps running: checkpoint and suspend the Job to move it"})
    return kept


class GpuWarnings:
    def __init__(self, cache: Cache, objects: Objects, workers: int = 1) -> None:
        self.cache, self.objects, self.workers = cache, objects, workers
        self.queue: WorkQueue[str] = WorkQueue()
        cache.listen(LEASES, self._on_lease)
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_lease(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if (old or {}).get("gpuUnhealthy") != (new or {}).get("gpuUnhealthy"):
            self._queue_node(key[len(LEASES):])

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and (new.get("spec") or {}).get("gpuIndexes") and not phase_of(new).terminal:
            self.queue.add(key)

    def _queue_node(self, node: str) -> None:
        for attempt in self.cache.live_attempts_on(node):  # not the node's history: a resync costs its live ones
            meta = attempt["metadata"]
            self.queue.add(attempt_key(meta.get("namespace", ""), meta["name"]))

    def resync(self) -> None:
        for key, _ in self.cache.under(LEASES):
            self._queue_node(key[len(LEASES):])

    async def run(self) -> None:
        await self.cache.synced.wait()
        await run_workers(self.queue, self.reconcile, workers=self.workers, resync=self.resync,
                          resync_seconds=RESYNC_SECONDS, log=log, name="gpu-warnings")

    def health_of(self, node: str) -> dict[int, str]:
        doc = self.cache.get(NODES + node)
        return gpu_health(doc, self.cache.get(LEASES + node)) if doc is not None else {}

    async def reconcile(self, key: str) -> None:
        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            if phase_of(obj).terminal:
                return None  # a finished attempt keeps the warnings it ended with
            node = (obj.get("spec") or {}).get("node") or ""
            if not node:
                return None
            warnings = warnings_for(obj, self.health_of(node))
            status = obj.setdefault("status", {})
            if warnings == (status.get("warnings") or []):
                return None
            if warnings:
                status["warnings"] = warnings
            else:
                status.pop("warnings", None)
            return obj

        attempt = self.cache.get(key)
        if attempt is None or phase_of(attempt).terminal:
            return
        await self.objects.mutate(key, mutate)
