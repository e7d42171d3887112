"""Nodes: the registry of hosts and their leases (NodeService, its transport, is node_api.py).

A node is two records in the store: `_nodes/<name>` (identity, session, inventory, cordon and drain
state; written on registration and by operators) and `_leases/<name>` (its lease, apart so that
renewals do not rewrite the inventory). A node is Ready while its lease holds. A heartbeat is kept in
memory on the replica holding the node's stream, which renews the stored lease only at a fraction of
the lease (controllers/liveness.py, ADR 0049): on that replica `lease()` is the stored lease renewed
by the newest heartbeat. The lease
controller (controllers/lease.py) marks an expired lease `expired` and its attempts Lost.

Why a grace after a restart: while the coordinator is down no heartbeat can arrive, so every lease
would look expired the moment it comes back and every running attempt would be replaced for
nothing. A lease not yet marked expired therefore holds at least until `lease_duration` after the
coordinator began to accept reconnects (ADR 0088: not its process start, nor the end of its cache's
load, which can take longer than a lease on a large store); until then no lease runs out at all
(`Leases.hold`). The grace only protects what runs: new attempts go only to nodes whose lease a
heartbeat renewed (`Leases.fresh`).
"""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
from typing import Any, Sequence

from google.protobuf import json_format

from nodus.v1 import common_pb2

from .clock import Clock, parse, rfc3339
from .controllers.attempts import phase_of
from .controllers.cache import LEASES, NODES, attempt_key
from .controllers.fleet import Fleet, lease_fresh
from .controllers.liveness import Beat, alive, expiry, overlay, persist_due
from .controllers.job_controller import stop
from .controllers.objects import Objects
from .controllers.reasons import AttemptReason
from .errors import NodusError
from .money.books import PriceBooks
from .money.fit import MeasuredGpu, MeasuredShape, differences
from .money.pricebook import PriceBook
from .scheduler import OCI, PROCESS, NodeView, Reservation, gpu_family

log = logging.getLogger("nodus.nodes")

_RUNTIMES = {common_pb2.RUNTIME_PROCESS: PROCESS, common_pb2.RUNTIME_OCI: OCI}


class Leases:
    """When a node's lease holds, on the injected clock."""

    def __init__(self, clock: Clock, duration: float) -> None:
        self.clock = clock
        self.duration = duration
        self.started: float | None = clock.now()
        """When the restart grace began: agents could reconnect from then. None: not yet (`hold`)."""

    def hold(self) -> None:
        """No lease runs out until `grace` is called: the agents cannot reconnect yet."""
        self.started = None

    def grace(self) -> None:
        """Agents can reconnect from now: leases not yet marked expired hold one duration more."""
        self.started = self.clock.now()

    def extend(self, since: float) -> None:
        """Agents could reconnect (to another replica that restarted, ADR 0098) from `since`: leases not yet
        marked expired hold until one duration after it, unless they hold already (`hold`) or longer."""
        if self.started is not None and since > self.started:
            self.started = since

    def expiry(self, lease: dict[str, Any]) -> float:
        expire = parse(lease.get("expireTime")) or 0.0
        if lease.get("expired"):
            return expire
        return math.inf if self.started is None else max(expire, self.started + self.duration)

    def ready(self, lease: dict[str, Any] | None, now: float | None = None) -> bool:
        """The node counts as alive: its attempts are not Lost (the restart grace applies)."""
        if not lease or lease.get("expired"):
            return False
        return (self.clock.now() if now is None else now) < self.expiry(lease)

    def fresh(self, lease: dict[str, Any] | None, now: float | None = None) -> bool:
        """The node may take new attempts: a heartbeat renewed its lease and it has not run out. No
        restart grace here: a node that died while the coordinator was down gets nothing new."""
        return lease_fresh(lease, self.clock.now() if now is None else now)


def capacity_of(inventory: common_pb2.NodeInventory) -> dict[str, int]:
    host = inventory.host
    return {"cpuMillis": host.cpus * 1000, "memoryBytes": host.memory_bytes, "diskBytes": host.disk_bytes,
            "gpus": len(inventory.gpus)}


def unhealthy(gpu: common_pb2.Gpu) -> str:
    """Why placement must not use the GPU, as its agent said ("Reason: message"); "" when healthy."""
    return f"{gpu.unhealthy_reason}: {gpu.unhealthy_message}" if gpu.unhealthy_reason else ""


class NodeRegistry:
    def __init__(self, fleet: Fleet, objects: Objects, clock: Clock, lease_duration: float,
                 heartbeat_interval: float) -> None:
        self.fleet, self.cache, self.objects, self.clock = fleet, fleet.cache, objects, clock
        self.leases = Leases(clock, lease_duration)
        self.heartbeat_interval = heartbeat_interval
        self.price_books = PriceBooks(objects.store)
        self.beats: dict[str, Beat] = {}
        """node → the newest heartbeat a stream on this replica heard (ADR 0049)."""
        self._writing: dict[str, asyncio.Task[None]] = {}
        """node → its stored lease's write in flight: at most one per node, carrying the newest beat."""

    # -- reads ------------------------------------------------------------------------------------
    def node(self, name: str) -> dict[str, Any] | None:
        return self.cache.get(NODES + name)

    def node_by_id(self, node_id: str) -> dict[str, Any] | None:
        return next((doc for _, doc in self.cache.under(NODES) if doc.get("id") == node_id), None)

    def lease(self, name: str) -> dict[str, Any] | None:
        """The node's lease as this replica knows it: the stored one, renewed by a newer heartbeat
        that a stream here heard (its write may not have landed yet)."""
        stored = self.cache.get(LEASES + name)
        return overlay(stored, self.beats.get(name), self.node(name), self.leases.duration, self.clock.now())

    def lease_expiry(self, name: str) -> float | None:
        """When `lease(name)` runs out, as Unix seconds (None: no lease), without building it."""
        return expiry(self.cache.get(LEASES + name), self.beats.get(name), self.node(name), self.leases.duration,
                      self.clock.now())

    def alive(self, name: str, now: float | None = None) -> bool:
        """A stream on this replica heard the node's current session within the lease duration."""
        return alive(self.beats.get(name), self.node(name), self.leases.duration,
                     self.clock.now() if now is None else now)

    def names(self) -> list[str]:
        return sorted(doc["name"] for _, doc in self.cache.under(NODES))

    def ready(self, name: str) -> bool:
        return self.leases.ready(self.lease(name))

    def views(self) -> list[NodeView]:
        """What the scheduler sees of every node."""
        return self.fleet.nodes()

    def reservations(self) -> list[Reservation]:
        return self.fleet.reservations()

    # -- registration and leases --------------------------------------------------------------------
    async def register(self, name: str, inventory: common_pb2.NodeInventory) -> dict[str, Any]:
        """Creates or updates the node and opens a new session (epoch + 1); renews its lease. With a
        price book active, a node joining as an offering must fit it (OfferingMismatch otherwise)."""
        book = await self.price_books.active() if inventory.offering else None
        if book is not None:
            check_offering(book, name, inventory)
        now = self.clock.now()
        session = secrets.token_hex(16)

        def update(doc: dict[str, Any] | None) -> dict[str, Any]:
            doc = doc or {"name": name, "id": "node-" + secrets.token_hex(6), "epoch": 0}
            doc.update(epoch=int(doc.get("epoch", 0)) + 1, sessionId=session, registerTime=rfc3339(now),
                       inventory=json_format.MessageToDict(inventory, preserving_proto_field_name=True),
                       capacity=capacity_of(inventory),
                       gpus=[{"index": g.index, "name": g.name, "memoryBytes": g.memory_bytes,
                              "nvlinkLinks": g.nvlink_active_links, "simulated": g.simulated,
                              "unhealthy": unhealthy(g)} for g in inventory.gpus],
                       runtimes=sorted({_RUNTIMES[r] for r in inventory.runtimes if r in _RUNTIMES}),
                       labels=dict(inventory.labels), region=inventory.region_class, offering=inventory.offering)
            return doc

        node = await self.objects.upsert(NODES + name, update)
        await self.objects.upsert(LEASES + name, lambda _: self._lease(node, now))
        return node

    def _lease(self, node: dict[str, Any], now: float) -> dict[str, Any]:
        return {"node": node["name"], "epoch": node["epoch"], "sessionId": node["sessionId"], "renewTime": rfc3339(now),
                "expireTime": rfc3339(now + self.leases.duration), "expired": False}

    def beat(self, name: str, session_id: str, epoch: int, disk_free_bytes: int = 0,
             gpus: Sequence[common_pb2.Gpu] = ()) -> None:
        """A heartbeat of the current session: kept in memory at once, so the node is alive on this
        replica whatever the store's latency; the stored lease (which revives an expired one, and
        carries the GPUs' health, index -> why unhealthy, for placement) is written in the background
        when `persist_due` says so, one write per node at a time."""
        node = self.node(name)
        if node is None or node.get("sessionId") != session_id or int(node.get("epoch", 0)) != epoch:
            raise NodusError("StaleSession", f'session {epoch} of node "{name}" was superseded or is unknown')
        self._record(name, Beat(session_id, epoch, self.clock.now(), disk_free_bytes,
                                {str(g.index): unhealthy(g) for g in gpus}))

    def hello(self, name: str, session_id: str, epoch: int) -> None:
        """A stream of the node's current session opened: it is alive here from now, as a heartbeat would
        say, with the free disk and GPU health its lease last carried. After a restart a node that came
        back late in the grace must not lose its attempts before its first heartbeat (ADR 0088)."""
        node = self.node(name)
        if node is None or node.get("sessionId") != session_id or int(node.get("epoch", 0)) != epoch:
            raise NodusError("StaleSession", f'session {epoch} of node "{name}" was superseded or is unknown')
        known = self.beats.get(name) or self.cache.get(LEASES + name) or {}
        if isinstance(known, Beat):
            disk, gpus = known.disk_free_bytes, dict(known.gpu_unhealthy)
        else:
            disk, gpus = int(known.get("diskFreeBytes") or 0), dict(known.get("gpuUnhealthy") or {})
        self._record(name, Beat(session_id, epoch, self.clock.now(), disk, gpus))

    def _record(self, name: str, beat: Beat) -> None:
        self.beats[name] = beat
        if name not in self._writing and persist_due(self.cache.get(LEASES + name), beat, self.leases.duration):
            self._writing[name] = asyncio.create_task(self._persist(name), name=f"lease-write:{name}")

    async def renew(self, name: str, session_id: str, epoch: int, disk_free_bytes: int = 0,
                    gpus: Sequence[common_pb2.Gpu] = ()) -> dict[str, Any]:
        """A heartbeat (`beat`) whose stored lease is written before it returns, due or not."""
        self.beat(name, session_id, epoch, disk_free_bytes, gpus)
        while (writing := self._writing.get(name)) is not None:
            await writing
        await self._persist(name)
        return self.lease(name) or {}

    async def written(self) -> None:
        """Waits for the stored leases' writes in flight."""
        while self._writing:
            await asyncio.gather(*self._writing.values(), return_exceptions=True)

    def forget(self, name: str, session_id: str) -> None:
        """The stream of `session_id` ended: its heartbeats no longer keep the node alive here."""
        beat = self.beats.get(name)
        if beat is not None and beat.session_id == session_id:
            del self.beats[name]

    async def _persist(self, name: str) -> None:
        """Writes the stored lease from the newest beat as it is when the write starts."""
        try:
            beat = self.beats.get(name)
            node = self.node(name)
            if beat is None or node is None or node.get("sessionId") != beat.session_id:
                return
            lease = self._lease(node, beat.time)
            if beat.disk_free_bytes:
                lease["diskFreeBytes"] = beat.disk_free_bytes
            if beat.gpu_unhealthy:
                lease["gpuUnhealthy"] = beat.gpu_unhealthy
            await self.objects.upsert(LEASES + name, lambda _: lease)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the next heartbeat writes again; liveness here is in memory
            log.exception("node %s: writing its lease failed", name)
        finally:
            if self._writing.get(name) is asyncio.current_task():
                del self._writing[name]

    # -- operators --------------------------------------------------------------------------------
    async def set_cordon(self, name: str, cordoned: bool, message: str = "", draining: bool = False) -> dict[str, Any]:
        def mutate(doc: dict[str, Any]) -> dict[str, Any]:
            doc.update(cordoned=cordoned, draining=draining, message=message)
            return doc
        if self.node(name) is None and await self.objects.read(NODES + name) is None:
            raise no_node(name)
        return await self.objects.mutate(NODES + name, mutate) or self.node(name) or {}

    async def drain(self, name: str, grace_seconds: int, message: str) -> dict[str, Any]:
        """Cordon, then stop every attempt on the node with reason Drained: they are recorded Lost and
        replaced elsewhere, counted against recovery.maxAttempts, never against backoffLimit."""
        doc = await self.set_cordon(name, True, message, draining=True)
        now = self.clock.now()
        for attempt in self.cache.attempts_on(name):
            if not phase_of(attempt).terminal:
                key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])
                await self.objects.mutate(key, stop(AttemptReason.DRAINED, grace_seconds, now))
        return doc


def measured_shape(inventory: common_pb2.NodeInventory) -> MeasuredShape:
    return MeasuredShape(tuple(MeasuredGpu(g.name, gpu_family(g.name), g.memory_bytes, g.simulated)
                               for g in inventory.gpus), inventory.host.cpus, inventory.host.memory_bytes,
                         inventory.region_class, inventory.interruptible)


def check_offering(book: PriceBook, name: str, inventory: common_pb2.NodeInventory) -> None:
    """Refuses a node whose measured shape does not fit the offering it joins as, naming each difference."""
    offering = book.offering(inventory.offering)
    if offering is None:
        known = ", ".join(o.id for o in book.offerings)
        raise NodusError("OfferingMismatch", f'node "{name}" joins as offering "{inventory.offering}", which price '
                         f'book {book.version} does not sell (it sells {known})', name=name, kind="nodes",
                         extra={"offering": inventory.offering, "pricebookVersion": book.version})
    found = differences(offering, measured_shape(inventory))
    if found:
        raise NodusError("OfferingMismatch", f'node "{name}" does not fit offering "{offering.id}" of price book '
                         f'{book.version}: ' + "; ".join(found), name=name, kind="nodes",
                         extra={"offering": offering.id, "pricebookVersion": book.version})


def no_node(name: str) -> NodusError:
    return NodusError("NotFound", f'node "{name}" not found', name=name, kind="nodes",
                      fix="list the nodes with NodeService.ListNodes")
