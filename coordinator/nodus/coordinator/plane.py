"""The control plane's moving parts, wired once: the controllers, AgentService and NodeService, on
the fleet's cache (main.py builds the cache and the fleet first: admission's estimates read them too). `main.py` builds one, registers its gRPC services, starts it and stops it."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import grpc

from .agents import AgentServicer
from .checkpoints import RETENTION_TICK, Retention
from .agents import add_to_server as add_agent_service
from .clock import Clock
from .gangs_api import add_to_server as add_gang_service
from .grpc_api import AGENT_SERVICE, GANG_SERVICE, NODE_SERVICE
from .node_api import add_to_server as add_node_service
from .nodes import NodeRegistry
from .operator_registry import OperatorRegistry
from .resources import ResourceService
from .sinks import SinkLoader
from .store.base import Store
from .vault import Vault
from .controllers.fleet import Fleet
from .controllers.billing_controller import BillingController
from .controllers.checkpoints import FREE_STORAGE_BYTES
from .controllers.event_recorder import EVENT_TTL, EventRecorder
from .controllers.gang import GangConfig
from .controllers.gpu_warnings import GpuWarnings
from .controllers.interruptions import Interruptions
from .controllers.job_controller import JobController
from .controllers.lease import LeaseController
from .controllers.objects import Objects
from .controllers.placement import PlacementController
from .controllers.sweep_controller import SweepController
from .money.ledger_store import Ledger

log = logging.getLogger("nodus.controllers")


class ControlPlane:
    def __init__(self, store: Store, fleet: Fleet, service: ResourceService, vault: Vault, clock: Clock, *,
                 lease_duration: float, heartbeat_interval: float, gangs: GangConfig = GangConfig(),
                 blobs: Any = None, retention_interval: float = RETENTION_TICK,
                 free_storage: int = FREE_STORAGE_BYTES, image_registry: OperatorRegistry | None = None,
                 event_ttl: float = EVENT_TTL) -> None:
        self.cache = fleet.cache
        self.objects = Objects(store, self.cache)
        self.registry = NodeRegistry(fleet, self.objects, clock, lease_duration, heartbeat_interval)
        interruptions = Interruptions(self.cache, clock)  # one MTBI memo for the streams and the Job controller
        self.agents = AgentServicer(self.registry, self.objects, service.identity, vault, clock, gangs, interruptions,
                                    image_registry)
        self.jobs = JobController(self.cache, self.objects, service, clock, gangs=gangs, interruptions=interruptions,
                                  free_storage=free_storage)
        self.placement = PlacementController(self.registry, self.objects, clock)
        self.billing = BillingController(fleet, Ledger(store), service, clock)
        self.sweeps = SweepController(self.cache, service, clock)
        self.leases = LeaseController(self.registry, self.objects)
        self.gpu_warnings = GpuWarnings(self.cache, self.objects)  # attempts on a GPU that turned unhealthy
        self.events = EventRecorder(self.cache, store, clock, ttl=event_ttl)
        self.retention = Retention(self.cache, self.objects, blobs, clock, vault,
                                   tick=retention_interval) if blobs is not None else None
        self.sinks = SinkLoader(self.cache, self.objects, blobs, vault)  # outputs into customers' tables
        self._identity = service.identity
        self._tasks: list[asyncio.Task[None]] = []

    def servicers(self) -> list[tuple[str, Callable[[grpc.aio.Server], None]]]:
        return [(AGENT_SERVICE, lambda server: add_agent_service(server, self.agents)),
                (NODE_SERVICE, lambda server: add_node_service(server, self.registry, self._identity, self.agents)),
                (GANG_SERVICE, lambda server: add_gang_service(server, self.cache, self._identity))]

    async def start(self, controllers: bool = True) -> None:
        """Loads the cache from the store, then starts every controller (unless told not to)."""
        await self.cache.start()
        if not controllers:
            log.warning("controllers are off: Jobs are stored but never run")
            return
        runs = [("job-controller", self.jobs.run), ("placement", self.placement.run), ("leases", self.leases.run),
                ("billing", self.billing.run), ("sweeps", self.sweeps.run), ("events", self.events.run),
                ("gpu-warnings", self.gpu_warnings.run),
                ("output-sinks", self.sinks.run)]
        if self.retention is not None:
            runs.append(("checkpoint-retention", self.retention.run))
        for name, run in runs:
            self._tasks.append(asyncio.create_task(run(), name=name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for session in list(self.agents.sessions.values()):
            session.end()
        await self.cache.stop()
