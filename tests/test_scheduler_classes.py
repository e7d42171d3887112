"""NodeClasses (scheduler_classes.py) decides exactly as the node-by-node scheduler: the same node, the
same GPUs, the same explain word for word, with and without a price book, on random fleets where many
nodes share a shape and Rooms drift apart as a pass takes from them; and it costs one fit per class."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.coordinator.clock import ManualClock
from nodus.coordinator.controllers.cache import LEASES, NODES, Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.money.pricebook import PriceBook, parse
from nodus.coordinator.scheduler import (OCI, POOL_LABEL, PROCESS, Amount, Gpu, NodeView, Request, Reservation,
                                         place_all, rooms)
from nodus.coordinator import scheduler_classes
from nodus.coordinator.scheduler_classes import NodeClasses, place_classes
from nodus.coordinator.store import SqliteStore

GI = 1 << 30


def _offering(oid: str, family: str, rate: str, spot: str = "", speed: str = "1") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": oid, "accelerator": {"id": f"nvidia-{family.lower()}-sxm-80g", "family": family, "gpusPerNode": 4,
                                   "memory": "80Gi", "interconnect": "PCIe"},
        "vcpu": 8, "memory": "32Gi", "regionClass": "us", "provider": "lab", "region": "us-1",
        "rateUSDPerHour": rate, "billingIncrement": "60s", "minimumCharge": "1m", "relativeSpeed": speed}
    if spot:
        doc.update(interruptible=True, interruptionsPerHour=spot)
    return doc


BOOK: PriceBook = parse({"pricebookVersion": "classes-1", "storageUSDPerGiBMonth": "0.08", "offerings": [
    _offering("a100-spot", "A100", "1.00", spot="0.1"), _offering("a100", "A100", "2.00"),
    _offering("h100", "H100", "5.00", speed="2")]})
SHAPES = [  # (gpu family, gpus, offering, runtimes, region, pool)
    ("A100", 4, "a100-spot", (PROCESS,), "us", ""), ("A100", 4, "a100", (PROCESS, OCI), "us", ""),
    ("H100", 2, "h100", (PROCESS,), "eu", ""), ("H100", 8, "", (PROCESS,), "us", "p/train"),
]


@st.composite
def fleets(draw: Any) -> tuple[list[NodeView], list[Reservation]]:
    n = draw(st.integers(0, 24))
    nodes, held = [], []
    for i in range(n):
        family, gpus, offering, runtimes, region, pool = SHAPES[draw(st.integers(0, len(SHAPES) - 1))]
        sick = draw(st.sampled_from([None, None, None, 0, gpus - 1]))
        nodes.append(NodeView(f"n-{draw(st.integers(0, 999)):03d}-{i}", draw(st.sampled_from([True, True, True, False])),
                              draw(st.sampled_from([False, False, False, True])), frozenset(runtimes),
                              Amount(8000, 32 * GI, 100 * GI, gpus),
                              tuple(Gpu(g, family, 80 * GI, 0, "StaleCdiSpec: gone" if g == sick else "")
                                    for g in range(gpus)),
                              {POOL_LABEL: pool} if pool else {}, region, offering))
        for _ in range(draw(st.integers(0, 2))):
            taken = tuple(sorted(draw(st.sets(st.integers(0, gpus - 1), max_size=2))))
            held.append(Reservation(nodes[-1].name, Amount(draw(st.sampled_from([0, 1000, 4000])), 0, 0, len(taken)),
                                    taken))
        if offering and draw(st.integers(0, 5)) == 0:
            held.append(Reservation(nodes[-1].name, Amount(), warm_for=draw(st.sampled_from(["p", "q"])), until=9e9))
    return nodes, held


def _request(count: int, family: str, cpu: str, image: str | None, regions: list[str], pool: str, project: str,
             profile: str, avoid: list[str]) -> Request:
    placement = {k: v for k, v in (("regions", regions), ("pool", pool), ("profile", profile), ("avoidNodes", avoid))
                 if v}
    gpu: dict[str, Any] = {"count": count, **({"type": [family]} if family else {})}
    return replace(Request.of({"gpu": gpu, "cpu": cpu}, image, placement), project=project)


requests = st.builds(
    _request, st.integers(0, 3), st.sampled_from(["", "A100", "H100"]), st.sampled_from(["0", "500m", "6"]),
    st.sampled_from([None, "ghcr.io/acme/x:1"]), st.sampled_from([[], ["eu"]]), st.sampled_from(["", "train"]),
    st.sampled_from(["p", "q"]), st.sampled_from(["", "Cost", "Speed"]), st.sampled_from([[], ["n-000-0"]]))


@settings(max_examples=300, deadline=None)
@given(fleets(), st.lists(requests, max_size=12), st.booleans())
def test_a_pass_decides_as_the_node_by_node_scheduler(fleet: tuple[list[NodeView], list[Reservation]],
                                                      asked: list[Request], with_book: bool) -> None:
    nodes, held = fleet
    book = BOOK if with_book else None
    keyed = list(enumerate(asked))
    assert place_classes(keyed, nodes, held, book=book) == place_all(keyed, nodes, held, book=book)


def test_one_fit_per_class_however_many_nodes(monkeypatch: Any) -> None:
    gpus = tuple(Gpu(i, "H100", 80 * GI) for i in range(8))
    nodes = [NodeView(f"sim-{i:04d}", True, False, frozenset({PROCESS}), Amount(64000, 256 * GI, 0, 8), gpus)
             for i in range(1000)]
    classes = NodeClasses.of(nodes, [Reservation("sim-0007", Amount(0, 0, 0, 1), (0,))])
    assert len(classes) == 2, "999 untouched nodes and the one with a GPU taken"
    calls = []
    fit_room = scheduler_classes.fit_room
    monkeypatch.setattr(scheduler_classes, "fit_room", lambda *a, **k: calls.append(a[1].name) or fit_room(*a, **k))
    one = Request.of({"gpu": {"count": 1}}, None)
    placed = classes.place(one)
    assert (placed.node, placed.gpu_indexes) == ("sim-0000", (0,))
    assert placed.explain == "sim-0000: the most free capacity of 1000 fitting nodes"
    assert sorted(calls) == ["sim-0000", "sim-0007"], "one decision per class, made on its first member"
    classes.take("sim-0000", one.amount, placed.gpu_indexes)
    assert len(classes) == 2 and classes.place(one).node == "sim-0001", "sim-0000 joined sim-0007's class"
    nine = Request.of({"gpu": {"count": 9}}, None)
    assert classes.place(nine).explain == ("no node fits: sim-0000: gpu: wants 9 × any, 7 free; sim-0001: gpu: wants "
                                           "9 × any, 8 free; sim-0002: gpu: wants 9 × any, 8 free; sim-0003: gpu: wants "
                                           "9 × any, 8 free; sim-0004: gpu: wants 9 × any, 8 free; and 995 more")


async def _fleet_rooms(path: Path) -> None:
    store = await SqliteStore.open(path / "store.db")
    cache = Cache(store)
    fleet = Fleet(cache, ManualClock())
    await cache.start()
    revision = iter(range(1, 10_000))
    for i in range(6):
        cache.apply(f"{NODES}n{i}", {"name": f"n{i}", "runtimes": ["process"], "capacity": {"cpuMillis": 8000, "gpus": 4},
                                    "gpus": [{"index": g, "name": "H100"} for g in range(4)]}, next(revision))
        cache.apply(f"{LEASES}n{i}", {"expireTime": "2099-01-01T00:00:00Z"}, next(revision))

    def attempt(name: str, node: str, gpus: list[int], phase: str = "Running") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "p"}, "status": {"phase": phase},
                "spec": {"job": "j", "node": node, "gpuIndexes": gpus, "resources": {"cpu": "1", "gpu": {"count": len(gpus)}}}}

    def agrees() -> None:
        nodes, classes = fleet.rooms()
        assert len(nodes) == 6 and classes.rooms == rooms(nodes, fleet.held()), "the kept Rooms are what a rebuild makes"
        one = Request.of({"gpu": {"count": 1}}, None)
        assert classes.place(one) == place_all([(0, one)], nodes, fleet.held())[0]
        mine = classes.copy()  # a placement pass's own, taken from without touching the fleet's
        two = [(0, one), (1, one)]
        assert place_classes(two, nodes, fleet.held()) == place_all(two, nodes, fleet.held())
        for _, request in two:
            p = mine.place(request)
            assert p.node is not None
            mine.take(p.node, request.amount, p.gpu_indexes)
        assert classes.rooms == rooms(nodes, fleet.held()) != mine.rooms

    agrees()
    for step, (name, node, gpus, phase) in enumerate([("a", "n0", [0], "Running"), ("b", "n0", [1, 2], "Running"),
                                                       ("c", "n3", [3], "Provisioning"), ("a", "n0", [0], "Succeeded"),
                                                       ("c", "n3", [3], "Running"), ("d", "n5", [0, 1, 2, 3], "Running")]):
        cache.apply(f"attempts/p/{name}", attempt(name, node, gpus, phase), next(revision))
        if step % 2:
            agrees()  # some moves seen one at a time, some two together
    agrees()
    cache.apply("attempts/p/b", None, next(revision))
    agrees()
    await cache.stop()
    await store.close()


def test_the_fleets_rooms_follow_reservations_one_node_at_a_time(tmp_path: Path) -> None:
    asyncio.run(_fleet_rooms(tmp_path))
