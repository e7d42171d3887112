"""Which waiting attempts the next placement pass tries: an active set and an unschedulable set, as the
Kubernetes scheduler keeps them (docs/adr/0038).

A new waiting attempt is *active*: the next pass decides it. One that fit nowhere is *parked* in the
unschedulable set with the request it was decided with, and no pass looks at it again until something
that can change its answer happens:

- capacity on a node (a node joined, changed, came back or freed what a placed attempt held):
  `wake_fitting` wakes, oldest parked first, the attempts that `scheduler.fit` says fit what that node
  has free, each taking its share, so one freed GPU wakes one attempt that can use it, not the queue;
- its Job's spec changed (`wake_job`), its project's Budgets or Sweeps changed (`wake_project`), the
  price book changed or a warm hold ended (`wake_all`);
- its retry deadline passed (`due`): RETRY_SECONDS after it was parked (a slow safety net, so a missed
  trigger is only ever late), or sooner where the pass asked (a hold the project could not pay retries
  after billing's UNFUNDED_RECHECK_S: a grant is no event placement hears). A due attempt whose amounts
  exceed the fleet's `Headroom` (the most any node that takes work has free, per dimension) cannot fit
  anywhere, whatever a missed event: it is parked for another period without a pass deciding it, so the
  safety net of a queue of thousands on a full fleet costs O(1) per attempt, not a pass over every node.

A gang's members wake together (a gang is placed whole). Pure bookkeeping on the event loop: no I/O,
and the work of a wake-up is proportional to the parked attempts it looks at, never to the store.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..money.pricebook import PriceBook
from ..scheduler import Candidate, NodeView, Request, Reservation, fit, free_on, rooms

RETRY_SECONDS = 60.0
"""How long an unschedulable attempt waits at most before a pass tries it again without any event."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """The most any ready, uncordoned node has free, each dimension on its own (so no single node need
    have all of it): a request above it in any dimension fits no node."""

    gpus: int = 0
    """Free healthy GPUs."""
    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0

    @classmethod
    def of(cls, nodes: Sequence[NodeView], held: Sequence[Reservation]) -> "Headroom":
        gpus = cpu = memory = disk = 0
        live = [n for n in nodes if n.ready and not n.cordoned]
        free = rooms(live, held)
        for node in live:
            room = free[node.name]
            gpus = max(gpus, sum(1 for i in node.healthy if i in room.gpus))
            cpu, memory = max(cpu, room.free.cpu_millis), max(memory, room.free.memory_bytes)
            disk = max(disk, room.free.disk_bytes)
        return cls(gpus, cpu, memory, disk)

    def admits(self, r: Request) -> bool:
        """The request may fit some node (a necessary condition only: `fit` decides)."""
        return (r.gpu_count <= self.gpus and r.cpu_millis <= self.cpu_millis and r.memory_bytes <= self.memory_bytes
                and r.disk_bytes <= self.disk_bytes)


@dataclass(frozen=True, slots=True)
class Parked:
    """An unschedulable attempt: what it asked for when it was last decided, and when to try again."""

    project: str
    job: str
    request: Request
    retry_at: float
    """time.monotonic() of its next try without an event."""
    gang: tuple[str, str, int] | None = None
    """(project, job uid, epoch) of its gang; None for a single attempt."""


class PlacementQueue:
    def __init__(self, retry_seconds: float = RETRY_SECONDS) -> None:
        self.retry_seconds = retry_seconds
        self.active: set[str] = set()
        self.parked: dict[str, Parked] = {}
        """In the order they were parked (dict order), so the oldest wakes first."""
        self._deadlines: list[tuple[float, str]] = []
        """A heap of (retry_at, key); an entry whose attempt woke or was parked again is skipped."""

    def __len__(self) -> int:
        return len(self.active) + len(self.parked)

    def __contains__(self, key: str) -> bool:
        return key in self.active or key in self.parked

    # -- membership -----------------------------------------------------------------------------------
    def add(self, key: str) -> bool:
        """A waiting attempt the queue did not know: active at once. False if it was known already."""
        if key in self:
            return False
        self.active.add(key)
        return True

    def forget(self, key: str) -> None:
        """The attempt no longer waits (placed, stopped, ended or deleted)."""
        self.active.discard(key)
        self.parked.pop(key, None)

    def take(self) -> set[str]:
        """The attempts the next pass decides (the active set, emptied)."""
        out, self.active = self.active, set()
        return out

    def park(self, key: str, project: str, job: str, request: Request, now: float,
             gang: tuple[str, str, int] | None = None, retry_in: float | None = None) -> None:
        """The attempt fit nowhere: it waits for an event, or `retry_in` (default RETRY_SECONDS)."""
        self.active.discard(key)
        self.parked.pop(key, None)  # re-parking moves it to the end: the order is by last decision
        at = now + (self.retry_seconds if retry_in is None else retry_in)
        self.parked[key] = Parked(project, job, request, at, gang)
        heapq.heappush(self._deadlines, (at, key))

    # -- wake-ups -------------------------------------------------------------------------------------
    def wake(self, keys: Iterable[str]) -> int:
        """Makes these parked attempts (and their gangs) active; returns how many woke."""
        woke = 0
        gangs: set[tuple[str, str, int]] = set()
        for key in keys:
            p = self.parked.pop(key, None)
            if p is not None:
                self.active.add(key)
                woke += 1
                if p.gang is not None:
                    gangs.add(p.gang)
        if gangs:
            woke += self.wake([k for k, p in self.parked.items() if p.gang in gangs])
        return woke

    def wake_all(self) -> int:
        return self.wake(list(self.parked))

    def wake_project(self, project: str) -> int:
        return self.wake([k for k, p in self.parked.items() if p.project == project])

    def wake_job(self, project: str, job: str, keys: Iterable[str]) -> int:
        """Wakes the Job's parked attempts among `keys` (the cache's attempts of the Job)."""
        return self.wake([k for k in keys if (p := self.parked.get(k)) is not None
                          and p.project == project and p.job == job])

    def wake_fitting(self, node: NodeView, held: Sequence[Reservation], book: PriceBook | None = None) -> int:
        """Wakes, oldest first, the parked attempts that fit what `node` has free after `held` (its
        reservations, warm holds included), each one's share taken before the next is tried: what a
        pass could place there, and no more. A node that takes nothing new wakes nothing."""
        if not node.ready or node.cordoned or not self.parked:
            return 0
        taken = [r for r in held if r.node == node.name]
        free, free_gpus = free_on(node, taken)
        gpus = len(free_gpus)
        wake: list[str] = []
        for key, p in list(self.parked.items()):
            r = p.request
            if (r.gpu_count > gpus or r.cpu_millis > free.cpu_millis or r.memory_bytes > free.memory_bytes
                    or r.disk_bytes > free.disk_bytes):
                continue  # a first cut on the amounts, before the whole of `fit`
            got = fit(r, node, taken, book)
            if isinstance(got, Candidate):
                wake.append(key)
                taken.append(Reservation(node.name, r.amount, got.gpu_indexes))
                free, gpus = free - r.amount, gpus - len(got.gpu_indexes)
        return self.wake(wake)

    def due(self, now: float, headroom: Headroom | None = None) -> int:
        """Wakes the parked attempts whose retry deadline passed; with `headroom`, one that it does not
        admit is parked again for another period instead (module docstring)."""
        keys = []
        while (top := self._next()) is not None and top[0] <= now:
            key = heapq.heappop(self._deadlines)[1]
            p = self.parked[key]
            if headroom is not None and not headroom.admits(p.request):
                self.park(key, p.project, p.job, p.request, now, p.gang)
            else:
                keys.append(key)
        return self.wake(keys)

    def next_due(self) -> float | None:
        """The earliest retry deadline (None: nothing parked)."""
        top = self._next()
        return None if top is None else top[0]

    def _next(self) -> tuple[float, str] | None:
        """The heap's first live deadline, dropping those of attempts woken or parked again since."""
        while self._deadlines:
            at, key = self._deadlines[0]
            p = self.parked.get(key)
            if p is not None and p.retry_at == at:
                return at, key
            heapq.heappop(self._deadlines)
        return None
