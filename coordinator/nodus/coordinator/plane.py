"""The control plane's moving parts, wired once: the controllers, AgentService and NodeService, on
the fleet's cache (main.py builds the cache and the fleet first: admission's estimates read them too). `main.py` builds one, registers its gRPC services, starts it and stops it.

Every replica serves the API and the agents' streams off its own cache; only the holder of the
controllers' lease runs the controllers (controllers/leader.py, docs/adr/0043-leader-lease-and-fencing.md),
each in a task whose context carries the fence of the epoch it won, so the store refuses its writes
once another replica has taken over. A follower still makes one decision: the first one of a Job created
through it, written under the epoch it last saw (controllers/follower_decisions.py, ADR 0122)."""
from __future__ import annotations

import asyncio
import contextvars
import logging
from functools import partial
from typing import Any, Callable

import grpc

from .agents import AgentServicer
from .api.kinds import resolve
from .blob_gc import BlobGc, GcSettings
from .checkpoints import RETENTION_TICK, Retention
from .agents import add_to_server as add_agent_service
from .clock import Clock
from .gangs_api import add_to_server as add_gang_service
from .metrics import STORE_WRITE_LATENCY, WATCH_LAG
from .grpc_api import AGENT_SERVICE, GANG_SERVICE, NODE_SERVICE
from .node_api import add_to_server as add_node_service
from .nodes import NodeRegistry
from .operator_registry import OperatorRegistry
from .resources import ResourceService
from .sinks import SinkLoader
from .status_write import status_document
from .store.base import Store
from .store.lease import FENCE, Fence
from .vault import Vault
from .volume_commits import VolumeCommits
from .volumes import VolumeService
from .controllers.fleet import Fleet
from .controllers.follower_decisions import FollowerDecisions
from .controllers.billing_controller import BillingController
from .controllers.checkpoints import FREE_STORAGE_BYTES
from .controllers.event_recorder import EVENT_TTL, EventRecorder
from .controllers.job_reports import ReportWriter
from .controllers.gang import GangConfig
from .controllers.gpu_warnings import GpuWarnings
from .controllers.interruptions import Interruptions
from .controllers.job_controller import WORKERS as JOB_WORKERS, JobController
from .controllers.lease import LeaseController
from .controllers.leader import LeaderSettings, Leadership
from .controllers.objects import Objects
from .controllers import replicas
from .controllers.placement import PlacementController
from .controllers.sweep_controller import SweepController
from .controllers.workload_tokens import WorkloadTokens
from .money.ledger_store import Ledger
from .stopping import cancel_and_wait

log = logging.getLogger("nodus.controllers")


class ControlPlane:
    def __init__(self, store: Store, fleet: Fleet, service: ResourceService, vault: Vault, clock: Clock, *,
                 lease_duration: float, heartbeat_interval: float, gangs: GangConfig = GangConfig(),
                 blobs: Any = None, retention_interval: float = RETENTION_TICK,
                 gc: GcSettings = GcSettings(),
                 free_storage: int = FREE_STORAGE_BYTES, image_registry: OperatorRegistry | None = None,
                 event_ttl: float = EVENT_TTL, leader: LeaderSettings = LeaderSettings(),
                 job_workers: int = JOB_WORKERS) -> None:
        self.cache = fleet.cache
        self.objects = Objects(store, self.cache)
        self.registry = NodeRegistry(fleet, self.objects, clock, lease_duration, heartbeat_interval)
        self.registry.leases.hold()  # no lease runs out before the agents can reconnect (`serving`, ADR 0088)
        self._serving = False
        interruptions = Interruptions(self.cache, clock)  # one MTBI memo for the streams and the Job controller
        self.agents = AgentServicer(self.registry, self.objects, service.identity, vault, clock, gangs, interruptions,
                                    image_registry)
        self.jobs = JobController(self.cache, self.objects, service, clock, gangs=gangs, interruptions=interruptions,
                                  free_storage=free_storage, workers=job_workers,
                                  explain=lambda attempts, job: self.placement.explain_new(attempts, job))
        self._reports = self.agents.reports = ReportWriter(self.objects, store, partial(status_document, resolve("jobs")))
        self.placement = PlacementController(self.registry, self.objects, clock)
        self.billing = BillingController(fleet, Ledger(store), service, clock)
        self.sweeps = SweepController(self.cache, service, clock)
        self.leases = LeaseController(self.registry, self.objects)
        self.gpu_warnings = GpuWarnings(self.cache, self.objects)  # attempts on a GPU that turned unhealthy
        self.events = EventRecorder(self.cache, store, clock, ttl=event_ttl)
        self.retention = Retention(self.cache, self.objects, blobs, clock, vault,
                                   tick=retention_interval) if blobs is not None else None
        self.gc = BlobGc(store, self.cache, self.objects, blobs, clock, gc) if blobs is not None else None
        self.volume_commits = (VolumeCommits(self.cache, self.objects, VolumeService(service), blobs)
                               if blobs is not None else None)  # writable mounts into their Volumes' revisions
        self.sinks = SinkLoader(self.cache, self.objects, blobs, vault)  # outputs into customers' tables
        self.workload_tokens = WorkloadTokens(self.cache, store, service.identity)  # ServiceAccount tokens (ADR 0055)
        self._identity = service.identity
        self._service = service
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self.leadership = Leadership(store, leader, self._lead, self._abdicate)
        self._following = FollowerDecisions(self.jobs, self.leadership)
        store.write_observer = STORE_WRITE_LATENCY.observe
        self._controllers = False
        self._started = clock.now()
        self._announcing: asyncio.Task[None] | None = None

    def servicers(self) -> list[tuple[str, Callable[[grpc.aio.Server], None]]]:
        return [(AGENT_SERVICE, lambda server: add_agent_service(server, self.agents)),
                (NODE_SERVICE, lambda server: add_node_service(server, self.registry, self._identity, self.agents)),
                (GANG_SERVICE, lambda server: add_gang_service(server, self.cache, self._identity))]

    async def start(self, controllers: bool = True) -> None:
        """Loads the cache from the store, then claims the controllers' lease (unless told not to run
        them): the first claim here, so a replica that wins starts them before it serves; then every
        renew interval. First it records that it is starting: the leader holds every lease until it serves
        (controllers/replicas.py, ADR 0098)."""
        self._started = self._clock.now()
        await replicas.announce(self.objects.store, self.leadership.holder, self._started)
        await self.cache.start()
        if not controllers:
            log.warning("controllers are off: Jobs are stored but never run")
            self.registry.fleet.backlog.limit = 0  # nothing here decides them: a create has nothing to wait for
            return
        self._controllers = True
        self._service.first_decisions = self._following  # decided here, written under the leader's epoch (ADR 0122)
        await self.leadership.tick()
        self.leadership.start()

    async def _lead(self, fence: Fence) -> None:
        """Starts every controller, each in a context whose writes carry `fence`."""
        await self.cache.synced.wait()
        # A new leader's restart grace: nodes whose agents were connected to the replica that died
        # keep their attempts for a lease duration while they reconnect (nodes.py, Leases). A replica
        # not serving yet starts it when it serves: a grace that ran while the agents could not reach
        # it would be none (ADR 0088).
        if self._serving:
            self.registry.leases.grace()
        runs = [("job-controller", self.jobs.run), ("placement", self.placement.run), ("leases", self.leases.run),
                ("billing", self.billing.run), ("sweeps", self.sweeps.run), ("events", self.events.run),
                ("gpu-warnings", self.gpu_warnings.run),
                ("output-sinks", self.sinks.run), ("workload-tokens", self.workload_tokens.run)]
        if self.retention is not None:
            runs.append(("checkpoint-retention", self.retention.run))
        if self.gc is not None:
            runs.append(("blob-gc", self.gc.run))
        if self.volume_commits is not None:
            runs.append(("volume-commits", self.volume_commits.run))
        self.jobs.fence = fence
        self._service.first_decisions = self.jobs  # a Job is created with its first decision (ADR 0108)
        self._reports.jobs = self.jobs  # and a report is written with its Job's decision (ADR 0127)
        for name, run in runs:
            context = contextvars.copy_context()
            context.run(FENCE.set, fence)
            self._tasks.append(asyncio.create_task(run(), name=name, context=context))

    def serving(self, agent_port: int) -> None:
        """The gRPC server accepts the agents' reconnects from now (`agent_port`: its mTLS port, told to
        enrolling nodes): the leases' restart grace starts."""
        self.agents.agent_port = agent_port
        self._serving = True
        self.registry.leases.grace()
        self._announcing = asyncio.create_task(self._announce_serving(self._clock.now()), name="replica-serving")

    async def _announce_serving(self, at: float) -> None:
        """Records that agents can reconnect here from `at`: the leader's grace for this replica's nodes."""
        try:
            await replicas.announce(self.objects.store, self.leadership.holder, self._started, at)
        except Exception:  # noqa: BLE001 - the starting record still holds the leases for a while
            log.exception("could not record that this replica serves")

    async def replica_status(self) -> dict[str, Any]:
        """What /readyz?verbose shows: this replica's role, the lease as it last saw it, its watch lag."""
        lag = await self.objects.store.watch_lag()
        WATCH_LAG.set(lag)
        lease = self.leadership.seen
        role = self.leadership.role if self._controllers else "controllers off"
        return {"role": role, "epoch": lease.epoch if lease else 0, "leader": lease.holder if lease else "",
                "holder": self.leadership.holder, "watch lag": f"{lag} revisions"}

    async def _abdicate(self) -> None:
        self._service.first_decisions = self._following if self._controllers else None
        self._reports.jobs = None
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)

    async def stop(self) -> None:
        if self._announcing is not None:
            await cancel_and_wait([self._announcing])
        if self._controllers:
            await self.leadership.stop()
        await self._abdicate()
        self._service.first_decisions = None  # stopping: no decisions from here on, led or followed
        for session in list(self.agents.sessions.values()):
            session.end()
        try:
            async with asyncio.timeout(2):
                await replicas.withdraw(self.objects.store, replicas.REPLICAS + self.leadership.holder)
        except Exception as e:  # noqa: BLE001 - the leader deletes it once its grace is over
            log.warning("could not delete this replica's record: %s", e or type(e).__name__)
        await self.cache.stop()
