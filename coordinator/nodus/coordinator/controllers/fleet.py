"""What the scheduler and the estimates read of the fleet, kept up to date from the watch-fed cache.

Placement passes and every Job create (its `status.estimate`) ask the same questions: which nodes are
there and may take work, what the live placed attempts hold, which nodes are kept warm, how long starts
took per offering, and how long comparable Jobs of a project ran. Answering them by listing the store,
or by walking every Attempt, made a create cost O(Attempts) and a queue of waiting Jobs quadratic. The
fleet answers from indexes that cache listeners maintain as objects change (each event costs O(1)):

- reservations: per live placed attempt, what it holds on its node (and the same by node);
- start samples: per offering, provisioning → start seconds of each attempt that started there;
- run history: per (project, image digest) and (project, command), the run seconds of each Job that
  succeeded, and per project how long each ran against its declared expectedDuration.

Nodes are few, so `nodes()` builds their views from the cache each call; the active price book is
read from the cache too (a version's parse is memoized). Everything here is derived
from the store through the cache; nothing is written.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from decimal import Decimal
from typing import Any, Sequence

import orjson

from ..clock import Clock, parse, seconds
from ..money.books import ACTIVE, VERSIONS, PriceBooks
from ..money.pricebook import PriceBook
from ..scheduler import Amount, Gpu, NodeView, Request, Reservation, rooms
from ..scheduler_classes import NodeClasses, Shapes
from .attempt_machine import phase_of
from .cache import ATTEMPTS, JOBS, LEASES, NODES, SWEEPS, Cache
from .placement import warm_holds
from .placement_backlog import PlacementBacklog
from .sweep import cells_in, sweep_owner


def lease_fresh(lease: dict[str, Any] | None, now: float) -> bool:
    """The node may take new attempts: a heartbeat renewed its lease and it has not run out."""
    if not lease or lease.get("expired"):
        return False
    return now < (parse(lease.get("expireTime")) or 0.0)


def gpu_health(node: dict[str, Any], lease: dict[str, Any] | None) -> dict[int, str]:
    """Each GPU index's `unhealthy` ("" when healthy): the newest heartbeat's, else the registration's
    (a CDI spec can go stale after the node joined, and be regenerated)."""
    beat = (lease or {}).get("gpuUnhealthy")
    if isinstance(beat, dict):
        return {int(k): str(v) for k, v in beat.items()}
    return {int(g.get("index", 0)): str(g.get("unhealthy", "")) for g in node.get("gpus") or []}


def amount_of(doc: dict[str, Any] | None) -> Amount:
    doc = doc or {}
    return Amount(int(doc.get("cpuMillis", 0)), int(doc.get("memoryBytes", 0)), int(doc.get("diskBytes", 0)),
                  int(doc.get("gpus", 0)))


def reservation_of(attempt: dict[str, Any]) -> Reservation | None:
    """What a live, placed attempt holds on its node (None for an unplaced or finished one)."""
    spec = attempt.get("spec") or {}
    if not spec.get("node") or phase_of(attempt).terminal:
        return None
    amount = Request.of(spec.get("resources"), spec.get("image")).amount
    gpu_indexes = tuple(spec.get("gpuIndexes") or ())
    if gpu_indexes:
        amount = Amount(amount.cpu_millis, amount.memory_bytes, amount.disk_bytes, len(gpu_indexes))
    return Reservation(spec["node"], amount, gpu_indexes)


def node_view(doc: dict[str, Any], lease: dict[str, Any] | None, now: float) -> NodeView:
    health = gpu_health(doc, lease)
    gpus = tuple(Gpu(int(g.get("index", 0)), g.get("name", ""), int(g.get("memoryBytes", 0)),
                     int(g.get("nvlinkLinks", 0)), health.get(int(g.get("index", 0)), ""))
                 for g in doc.get("gpus") or [])
    return NodeView(doc["name"], lease_fresh(lease, now), bool(doc.get("cordoned")),
                    frozenset(doc.get("runtimes") or ()), amount_of(doc.get("capacity")), gpus,
                    doc.get("labels") or {}, doc.get("region", ""), doc.get("offering", ""))


def _run_seconds(job: dict[str, Any] | None) -> Decimal | None:
    """How long a Job that succeeded ran (None for any other Job)."""
    seen = (job or {}).get("status") or {}
    started, ended = parse(seen.get("startTime")), parse(seen.get("completionTime"))
    if seen.get("phase") != "Succeeded" or started is None or ended is None:
        return None
    return Decimal(str(round(max(ended - started, 0.0), 3)))


def _start_seconds(attempt: dict[str, Any] | None) -> tuple[str, Decimal] | None:
    """(offering, provisioning → start seconds) of an attempt that started on an offering."""
    if attempt is None:
        return None
    seen, offering = attempt.get("status") or {}, (attempt.get("spec") or {}).get("offering")
    provisioned, started = parse(seen.get("provisioningTime")), parse(seen.get("startTime"))
    if not offering or provisioned is None or started is None:
        return None
    return offering, Decimal(str(round(max(started - provisioned, 0.0), 3)))


def money_of(value: object) -> Decimal | None:
    """A decimal string of USD as admission accepted it (None when unset)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return Decimal(value)
    except ArithmeticError:
        return None


def _history_keys(project: str, job: dict[str, Any]) -> list[tuple[str, str, str]]:
    keys = []
    digest = (((job.get("status") or {}).get("image")) or {}).get("digest")
    if digest:
        keys.append((project, "image", str(digest)))
    command = (job.get("spec") or {}).get("command")
    if command:
        keys.append((project, "command", orjson.dumps(command).decode()))
    return keys


class Fleet:
    """The fleet as the cache holds it, with the indexes above. Listens from construction, so build it
    before the cache starts: the initial load runs through the same listeners."""

    def __init__(self, cache: Cache, clock: Clock) -> None:
        self.cache, self.clock = cache, clock
        self._books = PriceBooks(cache.store)
        self._held: dict[str, Reservation] = {}
        self._held_on: dict[str, dict[str, Reservation]] = defaultdict(dict)
        """The same reservations by node."""
        self._sum_on: dict[str, Amount] = {}
        self._gpus_on: dict[str, Counter[int]] = defaultdict(Counter)
        """Per node, what its reservations hold together (placement reads one Reservation per node)."""
        self._views: dict[str, tuple[int | None, int | None, NodeView, float]] = {}
        """Per node: the revisions of the node and its lease the view was built at, the view, and the
        lease's expiry (parsed once per revision: `nodes()` runs on every create and placement pass)."""
        self._changed: set[str] = set()
        """Nodes whose node or lease object changed since `nodes()` last looked."""
        self._joined = False
        """A node was added or deleted since `nodes()` last looked: it lists them all again."""
        self._shown: dict[str, NodeView] = {}
        """Each node's view in `nodes()`'s answer (`_listed`), by name."""
        self._listed: list[NodeView] | None = None
        """What `nodes()` answered last; good while nothing changed and no lease ran out (`_turns`)."""
        self._turns = 0.0
        """When the first ready node's lease runs out (its view's readiness turns), or earlier: a renewal
        moves a lease's expiry later without moving this."""
        self._versions = [0, 0]
        """Bumped when `nodes()` rebuilds its answer, and when what the live placed attempts hold changes."""
        self._rooms: tuple[int, NodeClasses] | None = None
        """The classes `rooms()` answers, made at this version of `nodes()`'s answer."""
        self._moved: set[str] = set()
        """Nodes whose reservations changed since `rooms()` last looked: only their Rooms are made again."""
        self.shapes = Shapes()
        """The nodes' shapes, interned once per view (what NodeClasses groups them by)."""
        self.backlog = PlacementBacklog(cache)
        """The Jobs admitted and not yet decided by placement, which a Job create waits on (ADR 0075)."""
        self._starts: dict[str, dict[str, Decimal]] = defaultdict(dict)
        self._runs: dict[tuple[str, str, str], dict[str, Decimal]] = defaultdict(dict)
        self._overruns: dict[str, dict[str, Decimal]] = defaultdict(dict)
        """Per project: each succeeded Job's actual run over its declared expectedDuration."""
        cache.listen(ATTEMPTS, self._on_attempt)
        cache.listen(JOBS, self._on_job)
        cache.listen(NODES, self._on_node)
        cache.listen(LEASES, self._on_node)

    # -- indexes ----------------------------------------------------------------------------------
    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        held = reservation_of(new) if new is not None else None
        was = self._held.pop(key, None)
        if was is not None or held is not None:
            self._versions[1] += 1
            self._moved.update(r.node for r in (was, held) if r is not None)
        if was is not None:
            self._held_on[was.node].pop(key, None)
            self._sum_on[was.node] = self._sum_on.get(was.node, Amount()) - was.amount
            gpus = self._gpus_on[was.node]
            gpus.subtract(was.gpu_indexes)
            for i in was.gpu_indexes:
                if gpus[i] <= 0:
                    del gpus[i]
            if not self._held_on[was.node]:
                del self._held_on[was.node], self._sum_on[was.node], self._gpus_on[was.node]
        if held is not None:
            self._held[key] = held
            self._held_on[held.node][key] = held
            self._sum_on[held.node] = self._sum_on.get(held.node, Amount()) + held.amount
            self._gpus_on[held.node].update(held.gpu_indexes)
        if (before := _start_seconds(old)) is not None:
            self._starts[before[0]].pop(key, None)
        if (after := _start_seconds(new)) is not None:
            self._starts[after[0]][key] = after[1]

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._changed.add(key[key.index("/") + 1:])
        if key.startswith(NODES) and (old is None) != (new is None):
            self._joined = True

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        project = key.removeprefix(JOBS).split("/", 1)[0]
        if old is not None and _run_seconds(old) is not None:
            for group in _history_keys(project, old):
                self._runs[group].pop(key, None)
            self._overruns[project].pop(key, None)
        if new is not None and (ran := _run_seconds(new)) is not None:
            for group in _history_keys(project, new):
                self._runs[group][key] = ran
            declared = seconds((new.get("spec") or {}).get("expectedDuration"))
            if declared:
                self._overruns[project][key] = (ran / Decimal(str(declared))).quantize(Decimal("0.001"))

    @staticmethod
    def admitting(fleet: "Fleet | None", kind: str, dry_run: bool) -> AbstractAsyncContextManager[None]:
        """What a create of `kind` goes through: a Job's waits for room in the placement backlog (ADR 0075);
        a dry run, another kind, or a service without a fleet does not wait."""
        if fleet is None or kind != "Job" or dry_run:
            return nullcontext()
        return fleet.backlog.admitting()

    # -- reads ------------------------------------------------------------------------------------
    def book(self) -> PriceBook | None:
        """The active price book as the cache holds it (None: no price book, no money)."""
        active = self.cache.get(ACTIVE)
        record = self.cache.get(VERSIONS + str(active["version"])) if active is not None else None
        return None if record is None else self._books.book_of(record)

    def cap_of(self, project: str, job: str) -> Decimal | None:
        """What the Job may spend in all: its own spec.maxCostUSD, narrowed, for a Sweep's cell, by the
        Sweep's one shared cap less what its other cells have spent (their status.cost, the ledger's
        display copy). None: no cap."""
        obj = self.cache.job(project, job) or {}
        own = money_of((obj.get("spec") or {}).get("maxCostUSD"))
        sweep = (sweep_owner(obj) or ("",))[0]
        shared = money_of(((self.cache.get(f"{SWEEPS}{project}/{sweep}") or {}).get("spec") or {}).get("maxCostUSD")) \
            if sweep else None
        if shared is None:
            return own
        me = f"{JOBS}{project}/{job}"
        others = sum((money_of(((j.get("status") or {}).get("cost") or {}).get("totalUSD")) or Decimal(0)
                      for k, j in cells_in(self.cache.under(f"{JOBS}{project}/"), sweep) if k != me), Decimal(0))
        left = max(shared - others, Decimal(0))
        return left if own is None else min(own, left)

    def labels_of(self, project: str) -> dict[str, dict[str, str]]:
        """The labels of the project's Jobs by uid (a Budget's selector matches them; budgets.rooms)."""
        return {j["metadata"]["uid"]: dict(j["metadata"].get("labels") or {})
                for _, j in self.cache.under(f"{JOBS}{project}/") if j.get("metadata", {}).get("uid")}

    def nodes(self) -> list[NodeView]:
        """What the scheduler sees of every node, by name. A view is built once per revision of the node
        and its lease (a node of a thousand GPUs is a thousand Gpu values); only readiness moves with time.
        The list itself is kept while no node's view changed: a lease renewal moves the lease's revision but
        leaves its node's view as it was (ready, the same GPUs' health), so at a thousand nodes, whose
        leases are written ~100 times a second, a create or a placement pass looks at the nodes whose lease
        moved, not at every node, and the classes `rooms()` keeps survive it (ADR 0116)."""
        now = self.clock.now()
        if self._listed is not None and not self._changed and now < self._turns:
            return list(self._listed)
        if self._listed is None or self._joined:
            return self._relist(now)
        # Only the nodes whose node or lease changed; every node once the first ready one's lease may have
        # run out (`_turns` is a lower bound: a renewal only moves an expiry later).
        names = self._changed if now < self._turns else list(self._shown)
        self._changed = set()
        moved = False
        turns = self._turns if now < self._turns else float("inf")
        for name in names:
            doc = self.cache.get(NODES + name)
            if doc is None or name not in self._shown:
                return self._relist(now)
            view, expire = self._view(name, doc, now)
            if view.ready:
                turns = min(turns, expire)
            if view != self._shown[name]:
                self._shown[name], moved = view, True
        self._turns = turns
        if moved:
            self._listed = sorted(self._shown.values(), key=lambda v: v.name)
            self._versions[0] += 1
        return list(self._listed or ())

    def _view(self, name: str, doc: dict[str, Any], now: float) -> tuple[NodeView, float]:
        """The node's view at `now` and its lease's expiry (-1 when it has none or it expired), built once
        per revision of the node and its lease."""
        lease = self.cache.get(LEASES + name)
        revisions = (self.cache.revision(NODES + name), self.cache.revision(LEASES + name))
        hit = self._views.get(name)
        if hit is None or hit[:2] != revisions:
            view = node_view(doc, lease, now)
            expire = -1.0 if not lease or lease.get("expired") else parse(lease.get("expireTime")) or 0.0
            self._views[name] = (*revisions, view, expire)
            return view, expire
        view, expire = hit[2], hit[3]
        if view.ready != (ready := now < expire):  # lease_fresh, from the expiry parsed once
            view = replace(view, ready=ready)
        return view, expire

    def _relist(self, now: float) -> list[NodeView]:
        """Every node's view again (the first call, or a node joined or went away)."""
        self._changed, self._joined = set(), False
        out = []
        turns = float("inf")
        for _, doc in self.cache.under(NODES):
            view, expire = self._view(doc["name"], doc, now)
            kept = self._shown.get(view.name)
            out.append(kept if kept == view else view)  # an equal view stays the same object (`Shapes`)
            if view.ready:
                turns = min(turns, expire)
        if len(self._views) > len(out):
            present = {v.name for v in out}
            self._views = {k: v for k, v in self._views.items() if k in present}
        self._listed = sorted(out, key=lambda v: v.name)
        self._shown = {v.name: v for v in self._listed}
        self._versions[0] += 1
        self._turns = turns
        return list(self._listed)

    def rooms(self) -> tuple[list[NodeView], NodeClasses]:
        """`nodes()` and each one's Room after what the live placed attempts hold (`scheduler.rooms` of
        `held()`), grouped into NodeClasses: every create's estimate reads them. Made again when `nodes()`
        changes; a reservation that moves remakes its node's Room only. Read only (`NodeClasses.place`); a
        pass that takes from Rooms makes its own."""
        nodes = self.nodes()
        if self._rooms is None or self._rooms[0] != self._versions[0]:
            self._rooms = (self._versions[0], NodeClasses(nodes, rooms(nodes, self.held()), self.shapes))
        else:  # the same nodes: only those whose reservations moved get their Room again, O(moved)
            classes = self._rooms[1]
            for name in self._moved:
                if (view := classes.views.get(name)) is not None:
                    used = self._gpus_on.get(name)
                    classes.reset(name, view.capacity - self._sum_on.get(name, Amount()),
                                  view.indexes.difference(used) if used else view.indexes)
        self._moved.clear()
        return nodes, self._rooms[1]

    def reservations(self) -> list[Reservation]:
        """What every live placed attempt holds."""
        return list(self._held.values())

    def held(self) -> list[Reservation]:
        """What the live placed attempts hold, one Reservation per node (their sum, and every GPU index
        they hold): what `scheduler.free_on` makes of `reservations()`, in O(nodes) values."""
        return [Reservation(node, amount, tuple(self._gpus_on.get(node, ()))) for node, amount in self._sum_on.items()]

    def reservations_on(self, node: str) -> list[Reservation]:
        """What the live placed attempts on `node` hold."""
        return list(self._held_on.get(node, {}).values())

    def warm(self, now: float) -> list[Reservation]:
        """The nodes kept warm now (`warm_holds`)."""
        cache = self.cache
        views = filter(None, (cache.attempt_view(k) for k, _ in cache.under(ATTEMPTS)))
        return warm_holds(views, self.window, now)

    def window(self, project: str, job: str) -> float | None:
        """The Job's scaledownWindow in seconds (None when unset or the Job is gone)."""
        return seconds(((self.cache.job(project, job) or {}).get("spec") or {}).get("scaledownWindow"))

    def start_seconds(self, offering: str) -> tuple[Decimal, ...]:
        """Provisioning → start seconds of the attempts that started on `offering`."""
        return tuple(self._starts.get(offering, {}).values()) if offering else ()

    def overruns(self, project: str) -> list[Decimal]:
        """The project's succeeded Jobs' actual run over their declared expectedDuration."""
        return list(self._overruns.get(project, {}).values())

    def history(self, project: str, digest: str | None, command: Sequence[str] | None) -> list[Decimal]:
        """Run seconds of the project's Jobs that succeeded with the image `digest` or the `command`
        (a Job matching both counts once)."""
        runs: dict[str, Decimal] = {}
        if digest:
            runs.update(self._runs.get((project, "image", digest), {}))
        if command:
            runs.update(self._runs.get((project, "command", orjson.dumps(list(command)).decode()), {}))
        return list(runs.values())
