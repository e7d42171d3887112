"""The same decisions as `scheduler.place_in` / `place_all`, in O(kinds of node) instead of O(nodes).

`fit_room` reads nothing of a node's name (the one exception, a gang rank's `avoid_nodes`, goes node by
node), and `spread` and the price book read only its shape and its Room. So nodes of the same shape
(readiness, cordon, runtimes, capacity, GPUs, labels, region, offering) whose Rooms are equal (free
amount, free GPU indexes, warm holds) get the same answer: the same refusal, or the same candidate with
the same GPUs and score. `NodeClasses` keeps the nodes grouped that way, each class's members in name
order, and decides a request once per class; ties still go to the alphabetically first node (the first
member of the best classes), and an explain names the same nodes with the same words as the node-by-node
decision (tests/test_scheduler_classes.py checks both agree on random fleets). A fleet of a thousand
identical nodes filling up in order has a handful of classes: a placement pass and a create's estimate
cost as much with 1,000 nodes as with 10 (docs/adr/0074).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from .money.pricebook import PriceBook
from .scheduler import (MAX_SHOWN, Amount, Candidate, Key, NodeView, Placement, Request, Reservation, Room, Scorer,
                        fit_room, place_in, priced, rooms, spread)


def shape_of(node: NodeView) -> Hashable:
    """Everything `fit_room` and the scorers read of a node, except its name and its Room."""
    return (node.ready, node.cordoned, node.runtimes, node.capacity, node.gpus,
            tuple(sorted(node.labels.items())) if node.labels else (), node.region, node.offering)


class Shapes:
    """Node shapes interned as small ints, remembered per NodeView object: the fleet builds a node's view
    once per revision of the node and its lease, so a class key is made without hashing a node's GPUs
    again on every pass and every create."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._of: dict[int, tuple[NodeView, int]] = {}
        """id(view) → (the view, kept so that its id is not reused while it is here; its shape's int)."""

    def of(self, node: NodeView) -> int:
        hit = self._of.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        if len(self._of) >= 4 * len(self._ids) + 4096:
            self._of.clear()  # views of revisions long gone: remembered again as they are used
        shape = self._ids.setdefault(shape_of(node), len(self._ids))
        self._of[id(node)] = (node, shape)
        return shape


def _room_key(room: Room) -> Hashable:
    return room.free, room.gpus, tuple(sorted(room.warm.items())) if room.warm else ()


@dataclass(slots=True)
class _Class:
    members: list[str]
    """Its nodes' names, in order."""
    room: Room
    """The Room every member has (each member keeps its own copy, equal to this one)."""


class NodeClasses:
    """Nodes (in name order) and their Rooms, grouped into classes of nodes a decision cannot tell apart.
    `place` decides as `scheduler.place_in` over the same nodes and Rooms; `take` is `Room.take` on one
    node, which moves it to the class of its new Room."""

    def __init__(self, ordered: Sequence[NodeView], room: dict[str, Room], shapes: Shapes | None = None) -> None:
        self.ordered = list(ordered)
        self.rooms = room
        """Each node's own Room (what `place_in` reads when a request goes node by node)."""
        self.views = {n.name: n for n in ordered}
        self._shape: dict[str, Hashable] = {n.name: shapes.of(n) if shapes is not None else shape_of(n) for n in ordered}
        self._of: dict[str, Hashable] = {}
        """A node's name → its class's key."""
        self._classes: dict[Hashable, _Class] = {}
        for node in self.ordered:  # in name order: each class's members come out sorted
            self._join(node.name)

    @classmethod
    def of(cls, nodes: Iterable[NodeView], reservations: Iterable[Reservation],
           shapes: Shapes | None = None) -> "NodeClasses":
        ordered = sorted(nodes, key=lambda n: n.name)
        return cls(ordered, rooms(ordered, reservations), shapes)

    def __len__(self) -> int:
        """How many classes (what a decision costs)."""
        return len(self._classes)

    def _join(self, name: str) -> None:
        room = self.rooms[name]
        key = (self._shape[name], _room_key(room))
        self._of[name] = key
        found = self._classes.get(key)
        if found is None:
            self._classes[key] = _Class([name], Room(room.free, room.gpus, dict(room.warm)))
        else:
            bisect.insort(found.members, name)

    def take(self, name: str, amount: Amount, gpu_indexes: Iterable[int], warm_reuse: bool = False) -> None:
        """What a placement on `name` took (as `Room.take`)."""
        key = self._of[name]
        members = self._classes[key].members
        del members[bisect.bisect_left(members, name)]
        if not members:
            del self._classes[key]
        room = self.rooms[name]
        # A Room of its own first: a copy shares its Rooms with the classes it was copied from (`copy`).
        self.rooms[name] = Room(room.free, room.gpus, room.warm)
        self.rooms[name].take(amount, gpu_indexes, warm_reuse)
        self._join(name)

    def copy(self) -> "NodeClasses":
        """Classes of their own to take from (a placement pass's), sharing what neither changes. The Rooms
        are shared too: `take` and `reset` put a new Room in place of the one they change, never change
        one in place, so a copy costs a dictionary copy, not a Room per node (ADR 0116)."""
        out = NodeClasses.__new__(NodeClasses)
        out.ordered, out.views, out._shape = self.ordered, self.views, self._shape
        out.rooms = dict(self.rooms)
        out._of = dict(self._of)
        out._classes = {key: _Class(list(c.members), c.room) for key, c in self._classes.items()}
        return out

    def reset(self, name: str, free: Amount, gpus: frozenset[int]) -> None:
        """`name`'s Room is now `free` and `gpus` (what its reservations leave: the fleet's index moved)."""
        key = self._of[name]
        members = self._classes[key].members
        del members[bisect.bisect_left(members, name)]
        if not members:
            del self._classes[key]
        self.rooms[name] = Room(free, gpus, self.rooms[name].warm)
        self._join(name)

    def place(self, request: Request, scorer: Scorer = spread, book: PriceBook | None = None) -> Placement:
        """`scheduler.place_in(request, ordered, rooms, scorer, book)`, decided once per class."""
        if request.avoid_nodes:  # the only rule that reads a node's name: node by node
            return place_in(request, self.ordered, self.rooms, scorer, book)
        if not self.ordered:
            return Placement(None, explain="no node has registered")
        fitting: list[tuple[str, Candidate, int]] = []
        """(first member, the candidate of the first member, how many members) per class that fits."""
        refused: dict[Hashable, str] = {}
        for key, group in self._classes.items():
            first = group.members[0]
            result = fit_room(request, self.views[first], group.room, book)
            if isinstance(result, Candidate):
                fitting.append((first, result, len(group.members)))
            else:
                refused[key] = result
        if not fitting:
            return Placement(None, explain=f"no node fits: {self._refusals(refused, len(self.ordered))}")
        fitting.sort(key=lambda f: f[0])
        if book is None:
            best, score = fitting[0][1], scorer(request, fitting[0][1])
            for _, c, _ in fitting[1:]:  # in name order: a tie stays with the alphabetically first node
                if (s := scorer(request, c)) > score:
                    best, score = c, s
            count = sum(n for _, _, n in fitting)
            of = f"the most free capacity of {count} fitting nodes" if count > 1 else "the only fitting node"
            return Placement(best.node.name, best.gpu_indexes, explain=f"{best.node.name}: {of}")
        total = sum(len(self._classes[k].members) for k in refused)
        listed = self._listed(refused, 8)  # _priced shows at most 8 reasons in all
        return priced(request, [c for _, c, _ in fitting], listed, scorer, more=total - len(listed))

    def _listed(self, refused: dict[Hashable, str], limit: int) -> list[str]:
        """The first `limit` refused nodes in name order, each as `place_in` words it."""
        merged = heapq.merge(*(self._classes[k].members for k in refused))
        return [f"{name}: {refused[self._of[name]]}" for name in itertools.islice(merged, limit)]

    def _refusals(self, refused: dict[Hashable, str], count: int) -> str:
        shown = self._listed(refused, MAX_SHOWN)
        return "; ".join(shown) + (f"; and {count - MAX_SHOWN} more" if count > MAX_SHOWN else "")


def place_classes(requests: Sequence[tuple[Key, Request]], nodes: Sequence[NodeView],
                  reservations: Sequence[Reservation], scorer: Scorer = spread,
                  book: PriceBook | None = None, shapes: Shapes | None = None) -> dict[Key, Placement]:
    """`scheduler.place_all`, with each decision made once per class of nodes (`NodeClasses`)."""
    classes = NodeClasses.of(nodes, reservations, shapes)
    out: dict[Key, Placement] = {}
    for key, request in requests:
        placement = classes.place(request, scorer, book)
        out[key] = placement
        if placement.node is not None:
            classes.take(placement.node, request.amount, placement.gpu_indexes, placement.warm_reuse)
    return out
