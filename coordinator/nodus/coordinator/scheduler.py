"""Placement, first version: which node an attempt goes to, as a pure function.

An attempt fits a node when the node is Ready (its lease holds) and not cordoned, is in one of the
`placement.regions` and sold as one of the `placement.offerings` (when the Job names any), offers the runtime
the Job needs (`process` for a Job without an image, `oci` for one with an image), and its free
capacity (inventory minus what live attempts reserve) covers the request: cpu, memory, disk, and
`gpu.count` GPUs of the right type (a family such as H100 matches any H100 variant and never another
family; `exact` pins the variant), each with at least `minMemory`, linked by NVLink when asked, and
healthy (a GPU its agent reports unhealthy, for example through a stale CDI spec, is never chosen).
Nothing fits: the attempt waits (the Job controller fails it after `placement.queueTimeout`).

Free capacity is derived from the Attempt objects in the store (their `spec.node`, `spec.resources`
and `spec.gpuIndexes`), never from memory, so it survives a restart of the coordinator.

Every node that fits becomes a `Candidate`, and a `Scorer` ranks candidates (`spread`, below).

With a price book (`book`, the active one), each node is read with its offering: `money/policy.py`
refuses what the Job's `placement` rules out (`interruptible: Never` on interruptible capacity, a rate
above `maxRateUSDPerHour`) and ranks the rest by `placement.profile` (Cost, Speed, Balanced) before
the scorer, which then only breaks ties. The decision names the offering, its frozen rate and
whether it is interruptible, and its explanation says why each other offering lost. Exact GPU
variants also match the offering's accelerator id, and an offering sold with NVLink counts as NVLink
(interconnect is not measured yet). Warm reuse, also only with a book: a node whose last attempt of a
Job with `scaledownWindow` ended within that window is kept for that Job's project (a `Reservation`
with `warm_for`, derived from the store by the placement controller); other projects' attempts are
refused there, and the project's next fitting attempt takes it before any other node. Without a book
nothing of this applies: placement is as before.

Pools, with or without a book: a node joined with `nodus-agent --pool PROJECT/NAME` (the label
POOL_LABEL) is dedicated to that project; no other project places there. A Job's `placement.pool`
NAME places only on the nodes of pool NAME of its own project.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from .api import units
from .clock import rfc3339
from .money import policy as money
from .money.accelerators import gpu_family as gpu_family, gpu_matches as gpu_matches, gpu_variant as gpu_variant
from .money.pricebook import Interconnect, Offering, PriceBook

POOL_LABEL = "nodus.dev/pool"
"""A node's pool, PROJECT/NAME: the project it is dedicated to, and the pool's name in it."""
PROCESS, OCI = "process", "oci"
"""Runtime words: a Job without an image needs `process`; one with an image needs `oci`."""


@dataclass(frozen=True, slots=True)
class Amount:
    """An amount of a node's capacity."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    gpus: int = 0

    def __add__(self, other: "Amount") -> "Amount":
        return Amount(self.cpu_millis + other.cpu_millis, self.memory_bytes + other.memory_bytes,
                      self.disk_bytes + other.disk_bytes, self.gpus + other.gpus)

    def __sub__(self, other: "Amount") -> "Amount":
        return Amount(self.cpu_millis - other.cpu_millis, self.memory_bytes - other.memory_bytes,
                      self.disk_bytes - other.disk_bytes, self.gpus - other.gpus)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One accelerator of a node, as its agent reported it."""

    index: int
    name: str
    memory_bytes: int = 0
    nvlink_links: int = 0
    unhealthy: str = ""
    """Why placement must not use it ("StaleCdiSpec: ..." from its agent's check); empty while healthy."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """What placement needs to know about a node."""

    name: str
    ready: bool
    """The lease holds."""
    cordoned: bool
    runtimes: frozenset[str]
    capacity: Amount
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    region: str = ""
    offering: str = ""
    indexes: frozenset[int] = frozenset()
    """Every GPU index of the node (derived from `gpus`)."""
    healthy: tuple[int, ...] = ()
    """The indexes of its healthy GPUs, in order (derived from `gpus`)."""

    def __post_init__(self) -> None:
        if self.gpus and not self.indexes:
            object.__setattr__(self, "indexes", frozenset(g.index for g in self.gpus))
            object.__setattr__(self, "healthy", tuple(sorted(g.index for g in self.gpus if not g.unhealthy)))


@dataclass(frozen=True, slots=True)
class Request:
    """What one attempt asks for."""

    runtime: str = PROCESS
    cpu_millis: int = 0
    memory_bytes: int = 0
    disk_bytes: int = 0
    gpu_count: int = 0
    gpu_types: tuple[str, ...] = ()
    gpu_exact: bool = False
    gpu_min_memory: int = 0
    nvlink: bool = False
    regions: tuple[str, ...] = ()
    """Region classes the node must be in; empty: any."""
    offerings: tuple[str, ...] = ()
    """Offering ids the node must be sold as; empty: any."""
    project: str = ""
    """The project the attempt runs for: only it may take a node kept warm for it or in its pools."""
    pool: str = ""
    """placement.pool: a pool of the project the node must be in; empty: any node the project may use."""
    prefer_node: str = ""
    """A gang rank's node of the previous epoch: taken when it still fits."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes a gang rank must not use again (its member never assembled there, or the node was lost)."""
    policy: money.Policy = money.Policy()
    """interruptible, maxRateUSDPerHour, profile and expectedDuration: read only with a price book."""

    @property
    def amount(self) -> Amount:
        return Amount(self.cpu_millis, self.memory_bytes, self.disk_bytes, self.gpu_count)

    @classmethod
    def of(cls, resources: Mapping[str, Any] | None, image: str | None,
           placement: Mapping[str, Any] | None = None, expected_duration: str | None = None,
           complete_within_s: Decimal | None = None) -> "Request":
        """The request of a Job's (or an Attempt's) `resources`, `image`, `placement`,
        `expectedDuration` and the time left until its `completeByTime`. Unset floors ask for nothing."""
        resources = resources or {}
        placement = placement or {}
        gpu = resources.get("gpu") or {}
        return cls(runtime=OCI if image else PROCESS,
                   cpu_millis=_millis(resources.get("cpu")), memory_bytes=_bytes(resources.get("memory")),
                   disk_bytes=_bytes(resources.get("disk")),
                   gpu_count=int(gpu.get("count") or (1 if gpu.get("type") else 0)),
                   gpu_types=tuple(gpu.get("type") or ()), gpu_exact=bool(gpu.get("exact")),
                   gpu_min_memory=_bytes(gpu.get("minMemory")), nvlink=gpu.get("interconnect") == "NVLink",
                   regions=tuple(placement.get("regions") or ()), offerings=tuple(placement.get("offerings") or ()),
                   pool=str(placement.get("pool") or ""), prefer_node=str(placement.get("preferNode") or ""),
                   avoid_nodes=tuple(placement.get("avoidNodes") or ()),
                   policy=money.Policy.of(placement, expected_duration, complete_within_s))


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one live attempt holds on its node."""

    node: str
    amount: Amount
    gpu_indexes: tuple[int, ...] = ()
    warm_for: str = ""
    """Set instead of an amount: the node is kept warm for this project (spec.scaledownWindow)."""
    until: float = 0.0
    """When a warm hold ends (Unix seconds)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node the request fits, with what would be left and the GPUs it would get."""

    node: NodeView
    free_after: Amount
    gpu_indexes: tuple[int, ...]
    offering: Offering | None = None
    """The node's offering in the active price book; None without a book or when the book does not sell it."""
    warm: bool = False
    """The node is kept warm for the request's project."""


Scorer = Callable[[Request, Candidate], tuple[float, ...]]
Key = TypeVar("Key", bound=Hashable)
"""Whatever names a request to its caller (an attempt's store key); placements come back under it."""
"""Ranks a candidate; the highest tuple wins (ties go to the node name, alphabetically)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision for one request: a node (and its GPUs), or None with why nothing fits."""

    node: str | None
    gpu_indexes: tuple[int, ...] = ()
    explain: str = ""
    offering: Offering | None = None
    """What the attempt is sold as (with a price book): its rate is the one frozen for the attempt."""
    warm_reuse: bool = False
    """It takes a node its project kept warm."""


def _millis(value: Any) -> int:
    if value in (None, ""):
        return 0
    try:
        return int(math.ceil(units.parse_quantity(value) * 1000))
    except (ValueError, ArithmeticError):
        return 0


def _bytes(value: Any) -> int:
    if value in (None, ""):
        return 0
    try:
        return int(math.ceil(units.parse_quantity(value)))
    except (ValueError, ArithmeticError):
        return 0


def _quantity(n: int) -> str:
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if (n >= size and n % size == 0) or n >= 10 * size:
            return f"{Decimal(n) / size:.4g}{unit}"
    return str(n)


# -- fitting ------------------------------------------------------------------------------------------

def _pool_refusal(request: Request, pool: str) -> str:
    """Why a node in `pool` (PROJECT/NAME, or "") is not for the request; "" when it may be."""
    owner, _, name = pool.partition("/")
    if pool and owner != request.project:
        return f"dedicated to pool {name} of project {owner}"
    if request.pool and (not pool or name != request.pool):
        where = f"in pool {name}" if pool else "in no pool"
        return f"{where}, and placement.pool is {request.pool}"
    return ""


def free_on(node: NodeView, reservations: Iterable[Reservation]) -> tuple[Amount, frozenset[int]]:
    """What is left on `node` after its reservations: an amount and the free GPU indexes."""
    held, used = Amount(), set[int]()
    for r in reservations:
        if r.node == node.name:
            held = held + r.amount
            used.update(r.gpu_indexes)
    return node.capacity - held, node.indexes - used


@dataclass(slots=True)
class Room:
    """What one node has free during a decision: its amount, its free GPU indexes and its warm holds
    (project → until). `rooms` makes them from the reservations once; a pass takes from them as it places,
    so deciding a request costs O(nodes) however many reservations there are."""

    free: Amount
    gpus: frozenset[int]
    warm: dict[str, float]

    def take(self, amount: Amount, gpu_indexes: Iterable[int], warm_reuse: bool = False) -> None:
        self.free = self.free - amount
        self.gpus = self.gpus - frozenset(gpu_indexes)
        if warm_reuse:  # taken: from now on the attempt holds it, and the hold is over
            self.warm = {}


def rooms(nodes: Iterable[NodeView], reservations: Iterable[Reservation]) -> dict[str, Room]:
    """Each node's Room after `reservations` (one walk over them)."""
    held: dict[str, list[int]] = {}
    used: dict[str, set[int]] = {}
    warm: dict[str, dict[str, float]] = {}
    for r in reservations:
        if r.warm_for:
            warm.setdefault(r.node, {})[r.warm_for] = r.until
        a = r.amount
        if (sums := held.get(r.node)) is None:
            held[r.node] = [a.cpu_millis, a.memory_bytes, a.disk_bytes, a.gpus]
        else:
            sums[0] += a.cpu_millis
            sums[1] += a.memory_bytes
            sums[2] += a.disk_bytes
            sums[3] += a.gpus
        if r.gpu_indexes:
            used.setdefault(r.node, set()).update(r.gpu_indexes)
    out = {}
    for node in nodes:
        gpus, name = node.indexes, node.name
        taken = used.get(name)
        free = node.capacity - Amount(*held[name]) if name in held else node.capacity
        out[name] = Room(free, gpus - taken if taken else gpus, warm.get(name, {}))
    return out


def fit(request: Request, node: NodeView, reservations: Iterable[Reservation],
        book: PriceBook | None = None) -> Candidate | str:
    """A Candidate, or the reason (in a customer's words) why the request does not fit the node."""
    return fit_room(request, node, rooms((node,), reservations)[node.name], book)


def fit_room(request: Request, node: NodeView, room: Room, book: PriceBook | None = None) -> Candidate | str:
    """`fit` against the node's Room."""
    if not node.ready:
        return "NotReady"
    if request.avoid_nodes and node.name in request.avoid_nodes:
        return "this rank lost it or never assembled there in the previous epoch"
    if node.cordoned:
        return "cordoned"
    if request.regions and node.region not in request.regions:
        return f"region {node.region or 'unset'} is not in {', '.join(request.regions)}"
    if request.offerings and node.offering not in request.offerings:
        return f"offering {node.offering or 'unset'} is not in {', '.join(request.offerings)}"
    if (request.pool or node.labels) and (pooled := _pool_refusal(request, node.labels.get(POOL_LABEL, ""))):
        return pooled
    offering = book.offering(node.offering) if book is not None and node.offering else None
    if book is not None and (refused := money.refusal(request.policy, offering, node.offering)):
        return refused
    warm = room.warm if book else {}
    if warm and request.project not in warm:
        project, until = next(iter(warm.items()))
        return f"kept warm for project {project} until {rfc3339(until)} (the scaledownWindow of its last Job)"
    if request.runtime not in node.runtimes:
        need = "an image needs the oci runtime" if request.runtime == OCI else "no image needs the process runtime"
        return f"{need} (node offers {', '.join(sorted(node.runtimes)) or 'none'})"
    free, free_gpus = room.free, room.gpus
    for label, want, have, fmt in (("cpu", request.cpu_millis, free.cpu_millis, lambda m: f"{m / 1000:g}"),
                                   ("memory", request.memory_bytes, free.memory_bytes, _quantity),
                                   ("disk", request.disk_bytes, free.disk_bytes, _quantity)):
        if want > have:
            return f"{label}: wants {fmt(want)}, {fmt(max(have, 0))} free"
    chosen: tuple[int, ...] = ()
    if request.gpu_count:
        acc = offering.accelerator if offering is not None else None
        sold = (not request.gpu_types or acc is None or gpu_matches(acc.id, request.gpu_types, request.gpu_exact)
                or (not request.gpu_exact and gpu_matches(acc.family, request.gpu_types, False)))
        nvlink_sold = acc is not None and acc.interconnect is Interconnect.NVLINK
        if not (request.gpu_types or request.gpu_min_memory or request.nvlink):  # any healthy GPU will do
            if len(free_gpus) >= request.gpu_count:
                chosen = tuple(i for i in node.healthy if i in free_gpus)[:request.gpu_count]
                if len(chosen) == request.gpu_count:
                    return Candidate(node, free - request.amount, chosen, offering, bool(warm))
        usable = [g for g in node.gpus if g.index in free_gpus and not g.unhealthy
                  and (not request.gpu_types or gpu_matches(g.name, request.gpu_types, request.gpu_exact)
                       or (acc is not None and sold))
                  and g.memory_bytes >= request.gpu_min_memory
                  and (not request.nvlink or g.nvlink_links > 0 or nvlink_sold)] if free_gpus else []
        if len(usable) < request.gpu_count:
            kind = "/".join(request.gpu_types) or "any"
            extra = (f" with ≥{_quantity(request.gpu_min_memory)}" if request.gpu_min_memory else "") + \
                (" on NVLink" if request.nvlink else "")
            sick = [g for g in node.gpus if g.index in free_gpus and g.unhealthy] if free_gpus else []
            why = f" ({len(sick)} unhealthy: {sick[0].unhealthy})" if sick else ""
            return f"gpu: wants {request.gpu_count} × {kind}{extra}, {len(usable)} free{why}"
        chosen = tuple(sorted(g.index for g in usable)[:request.gpu_count])
    return Candidate(node, free - request.amount, chosen, offering, bool(warm))


def spread(request: Request, candidate: Candidate) -> tuple[float, ...]:
    """Prefer the node with the most capacity left after the placement.

    Why spread: without prices every node costs the same, so the best node is the one where the
    attempt contends least for what is not reserved (memory bandwidth, disk and network I/O, CPU
    beyond the floor) and where a lost node takes the fewest attempts with it. Free GPUs count first
    (they are the scarce part), then the mean free fraction of cpu, memory and disk. With a price
    book the profile ranks first and spread only breaks ties between nodes of equal outlook.
    """
    node, left = candidate.node, candidate.free_after
    fractions = [have / total for have, total in ((left.cpu_millis, node.capacity.cpu_millis),
                                                  (left.memory_bytes, node.capacity.memory_bytes),
                                                  (left.disk_bytes, node.capacity.disk_bytes)) if total > 0]
    return (float(left.gpus) if request.gpu_count else 0.0,
            sum(fractions) / len(fractions) if fractions else 0.0)


def place(request: Request, nodes: Sequence[NodeView], reservations: Sequence[Reservation],
          scorer: Scorer = spread, book: PriceBook | None = None) -> Placement:
    """The best node for `request`, deterministically (same inputs, same answer). With `book`, the
    Job's placement policy filters and its profile ranks first (module docstring)."""
    ordered = sorted(nodes, key=lambda n: n.name)
    return place_in(request, ordered, rooms(ordered, reservations), scorer, book)


MAX_SHOWN = 5
"""Refusals an explain names before it says how many more there are."""


def place_in(request: Request, ordered: Sequence[NodeView], room: Mapping[str, Room], scorer: Scorer = spread,
             book: PriceBook | None = None) -> Placement:
    """`place` over nodes already in name order and their Rooms."""
    candidates: list[Candidate] = []
    refusals: list[str] = []
    refused = 0
    for node in ordered:
        result = fit_room(request, node, room[node.name], book)
        if isinstance(result, Candidate):
            candidates.append(result)
        else:
            refused += 1
            if book is not None or len(refusals) < MAX_SHOWN:  # a priced explain lists more (priced)
                refusals.append(f"{node.name}: {result}")
    if not candidates:
        if not ordered:
            return Placement(None, explain="no node has registered")
        shown = "; ".join(refusals[:MAX_SHOWN]) + (f"; and {refused - MAX_SHOWN} more" if refused > MAX_SHOWN else "")
        return Placement(None, explain=f"no node fits: {shown}")
    if book is None:
        best, score = candidates[0], scorer(request, candidates[0])
        for c in candidates[1:]:  # in name order: a tie stays with the alphabetically first node
            if (s := scorer(request, c)) > score:
                best, score = c, s
        of = (f"the most free capacity of {len(candidates)} fitting nodes" if len(candidates) > 1
              else "the only fitting node")
        return Placement(best.node.name, best.gpu_indexes, explain=f"{best.node.name}: {of}")
    return priced(request, candidates, refusals, scorer)


def priced(request: Request, candidates: list[Candidate], refusals: list[str], scorer: Scorer,
           more: int = 0) -> Placement:
    """The best candidate by the request's profile (then `scorer`), explained against every other
    offering: each loser once (by its best node), then the nodes the policy or capacity ruled out
    (`refusals` in name order, and `more` refused nodes not listed there)."""
    policy = request.policy
    looks: dict[str, money.Outlook] = {}
    for c in candidates:
        if c.offering is not None and c.offering.id not in looks:
            looks[c.offering.id] = money.outlook(policy, c.offering)

    def look(c: Candidate) -> money.Outlook | None:
        return looks[c.offering.id] if c.offering is not None else None

    def rank(policy: money.Policy) -> list[Candidate]:
        # A warm node first: its project pays for it through the window whether it is used or not.
        # One score per offering (hundreds of nodes are sold as a handful of offerings), and only each
        # offering's best node is ranked (the explain names one node per losing offering): found in one
        # pass over the candidates in name order, so a tie stays with the alphabetically first node.
        scores = {oid: money.score(policy, o) for oid, o in looks.items()}
        unpriced = money.score(policy, None)
        heads: dict[str | None, tuple[tuple[Any, ...], Candidate]] = {}
        for c in candidates:
            oid = c.offering.id if c.offering is not None else None
            key = (c.warm, unpriced if oid is None else scores[oid], scorer(request, c))
            if (head := heads.get(oid)) is None or key > head[0]:
                heads[oid] = (key, c)
        return [c for _, c in sorted(heads.values(), key=lambda h: (h[0], _reverse(h[1].node.name)), reverse=True)]

    ranked = rank(policy)
    steer = money.late(policy, look(ranked[0]))
    if steer:
        policy = replace(policy, profile=money.Profile.SPEED)
        ranked = rank(policy)
    best = ranked[0]
    chosen = look(best)
    if chosen is None:
        head = f"{best.node.name}: sold as no offering of the price book (no priced node fits)"
    else:
        offerings = len({c.offering.id for c in candidates if c.offering is not None})
        head = (f"{best.node.name}: {money.describe(chosen)}, {money.WON[policy.profile]} "
                f"({policy.profile.value}) of {offerings} fitting offering{'s' if offerings > 1 else ''}")
    why: list[str] = []
    seen = {best.offering.id} if best.offering is not None else set()
    for c in ranked[1:]:
        other = look(c)
        if other is None or other.offering.id in seen:
            continue
        seen.add(other.offering.id)
        why.append(f"{c.node.name}: {money.lost(policy, chosen, other)}" if chosen is not None
                   else f"{c.node.name}: {money.describe(other)}")
    why.extend(refusals)
    total = len(why) + more
    shown = "; ".join(why[:8]) + (f"; and {total - 8} more" if total > 8 else "")
    head += f" ({steer})" if steer else ""
    head += "; reuses the node its project kept warm (scaledownWindow)" if best.warm else ""
    return Placement(best.node.name, best.gpu_indexes, explain=head + (f"; lost: {shown}" if shown else ""),
                     offering=best.offering, warm_reuse=best.warm)


def _reverse(name: str) -> tuple[int, ...]:
    """Sorts names backwards, so that `max` breaks a tie toward the alphabetically first node."""
    return tuple(-ord(c) for c in name)


def place_all(requests: Sequence[tuple[Key, Request]], nodes: Sequence[NodeView],
              reservations: Sequence[Reservation], scorer: Scorer = spread,
              book: PriceBook | None = None) -> dict[Key, Placement]:
    """Places requests in order, each seeing the capacity the earlier ones took (one scheduling pass):
    the nodes are sorted and their Rooms made once, and each placement takes from its node's Room, so a
    pass costs O(requests × nodes) whatever the reservations."""
    ordered = sorted(nodes, key=lambda n: n.name)
    room = rooms(ordered, reservations)
    out: dict[Key, Placement] = {}
    for key, request in requests:
        placement = place_in(request, ordered, room, scorer, book)
        out[key] = placement
        if placement.node is not None:
            room[placement.node].take(request.amount, placement.gpu_indexes, placement.warm_reuse)
    return out
