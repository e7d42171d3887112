"""Placement v1 as a pure function: runtimes, capacity floors, GPUs, readiness, cordons, spread."""
from __future__ import annotations

from typing import Any

import pytest

from nodus.coordinator.controllers.fleet import reservation_of
from nodus.coordinator.scheduler import (OCI, PROCESS, Amount, Candidate, Gpu, NodeView, Placement, Request,
                                         Reservation, fit, gpu_family, gpu_matches, gpu_variant, place, place_all)

GI = 1 << 30


def node(name: str, *, cpus: int = 8, memory: int = 32, disk: int = 100, gpus: tuple[Gpu, ...] = (),
         runtimes: tuple[str, ...] = (PROCESS,), ready: bool = True, cordoned: bool = False, region: str = "us",
         offering: str = "") -> NodeView:
    return NodeView(name, ready, cordoned, frozenset(runtimes), Amount(cpus * 1000, memory * GI, disk * GI, len(gpus)),
                    gpus, {}, region, offering)


def h100s(n: int, nvlink: int = 0, memory: int = 80) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, "NVIDIA H100 80GB HBM3", memory * GI, nvlink) for i in range(n))


def req(resources: dict[str, Any] | None = None, image: str | None = None, **placement: Any) -> Request:
    return Request.of(resources, image, placement)


def test_request_of_a_job_spec() -> None:
    r = req({"cpu": "500m", "memory": "512Mi", "disk": "1Gi", "gpu": {"count": 2, "type": ["H100"],
                                                                      "minMemory": "40Gi", "interconnect": "NVLink"}},
            image="ghcr.io/acme/x:1", regions=["eu"])
    assert (r.cpu_millis, r.memory_bytes, r.disk_bytes, r.gpu_count) == (500, 512 << 20, GI, 2)
    assert r.runtime == OCI and r.nvlink and r.gpu_min_memory == 40 * GI and r.regions == ("eu",)
    assert req().amount == Amount() and req().runtime == PROCESS, "unset floors ask for nothing"
    assert req({"gpu": {"type": ["A100"]}}).gpu_count == 1, "a type without a count asks for one"


def test_runtime_decides_between_process_and_oci_nodes() -> None:
    nodes = [node("proc", runtimes=(PROCESS,)), node("oci", runtimes=(OCI,))]
    assert place(req(), nodes, []).node == "proc"
    assert place(req(image="busybox"), nodes, []).node == "oci"
    only_proc = place(req(image="busybox"), nodes[:1], [])
    assert only_proc.node is None and "an image needs the oci runtime" in only_proc.explain


def test_capacity_floors_and_reservations() -> None:
    n = node("a", cpus=4, memory=8)
    assert place(req({"cpu": "4", "memory": "8Gi"}), [n], []).node == "a"
    held = [Reservation("a", Amount(3000, 2 * GI, 0, 0))]
    refused = place(req({"cpu": "2"}), [n], held)
    assert refused.node is None and refused.explain == "no node fits: a: cpu: wants 2, 1 free"
    assert place(req({"memory": "7Gi"}), [n], held).explain == "no node fits: a: memory: wants 7Gi, 6Gi free"
    assert place(req({"cpu": "1"}), [n], held).node == "a"
    assert place(req({"cpu": "1"}), [n], [Reservation("b", Amount(4000, 0, 0, 0))]).node == "a", \
        "another node's reservations do not count here"


def test_not_ready_and_cordoned_nodes_take_nothing() -> None:
    refused = place(req(), [node("a", ready=False), node("b", cordoned=True)], [])
    assert refused.node is None and "a: NotReady" in refused.explain and "b: cordoned" in refused.explain
    assert place(req(), [], []).explain == "no node has registered"


@pytest.mark.parametrize("name, family, variant", [
    ("NVIDIA H100 80GB HBM3", "H100", "h100-80gb-hbm3"),
    ("NVIDIA A100-SXM4-80GB", "A100", "a100-sxm4-80gb"),
    ("Tesla T4", "T4", "t4"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090", "rtx-4090"),
])
def test_gpu_names(name: str, family: str, variant: str) -> None:
    assert gpu_family(name) == family and gpu_variant(name) == variant


def test_gpu_family_matches_its_variants_and_never_another_family() -> None:
    assert gpu_matches("NVIDIA H100 80GB HBM3", ["H100"], exact=False)
    assert gpu_matches("NVIDIA H100 80GB HBM3", ["h100-sxm-80g"], exact=False), "a variant id names its family"
    assert not gpu_matches("NVIDIA H200", ["H100"], exact=False)
    assert not gpu_matches("NVIDIA A100-SXM4-80GB", ["H100"], exact=False)
    assert gpu_matches("NVIDIA H100 80GB HBM3", ["A100", "H100"], exact=False)
    assert gpu_matches("NVIDIA H100 80GB HBM3", ["H100 80GB HBM3"], exact=True)
    assert not gpu_matches("NVIDIA H100 PCIe", ["H100 80GB HBM3"], exact=True)


def test_gpu_count_type_memory_and_nvlink() -> None:
    mixed = node("mixed", gpus=(Gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GI), Gpu(1, "NVIDIA H100 80GB HBM3", 80 * GI)))
    got = place(req({"gpu": {"count": 1, "type": ["H100"]}}), [mixed], [])
    assert got.node == "mixed" and got.gpu_indexes == (1,)
    assert place(req({"gpu": {"count": 2, "type": ["H100"]}}), [mixed], []).node is None
    assert place(req({"gpu": {"count": 1, "type": ["A100"], "minMemory": "80Gi"}}), [mixed], []).node is None
    assert place(req({"gpu": {"count": 2}}), [mixed], []).gpu_indexes == (0, 1), "no type: any GPU"
    linked = node("linked", gpus=h100s(2, nvlink=4))
    unlinked = node("unlinked", gpus=h100s(8))
    nv = place(req({"gpu": {"count": 2, "type": ["H100"], "interconnect": "NVLink"}}), [unlinked, linked], [])
    assert nv.node == "linked"
    refused = place(req({"gpu": {"count": 1, "type": ["H100"]}}), [node("cpu-only")], [])
    assert refused.explain == "no node fits: cpu-only: gpu: wants 1 × H100, 0 free"


def test_reserved_gpus_are_not_given_twice() -> None:
    n = node("a", gpus=h100s(4))
    held = [Reservation("a", Amount(gpus=2), (0, 2))]
    got = place(req({"gpu": {"count": 2}}), [n], held)
    assert got.gpu_indexes == (1, 3)
    assert place(req({"gpu": {"count": 3}}), [n], held).node is None


def test_spread_prefers_the_node_with_the_most_free_capacity() -> None:
    nodes = [node("a"), node("b"), node("c")]
    held = [Reservation("a", Amount(4000, 16 * GI)), Reservation("c", Amount(1000, GI))]
    assert place(req({"cpu": "1"}), nodes, held).node == "b"
    got = place(req(), [node("b"), node("a")], [])
    assert got.node == "a" and "most free capacity of 2" in got.explain, "a tie goes to the first name"
    gpu_nodes = [node("g1", gpus=h100s(8)), node("g2", gpus=h100s(8))]
    busy = [Reservation("g1", Amount(gpus=4), (0, 1, 2, 3))]
    assert place(req({"gpu": {"count": 1}}), gpu_nodes, busy).node == "g2", "free GPUs count first"


def test_place_all_takes_earlier_placements_into_account_and_is_deterministic() -> None:
    nodes = [node("a", cpus=2), node("b", cpus=2)]
    requests = [(i, req({"cpu": "1"})) for i in range(5)]
    first = place_all(requests, nodes, [])
    assert [first[i].node for i in range(5)] == ["a", "b", "a", "b", None]
    assert place_all(requests, list(reversed(nodes)), []) == first


def test_regions_and_offerings_are_hard_constraints() -> None:
    nodes = [node("us1", region="us", offering="h100-x1-us"), node("eu1", region="eu", offering="h100-x1-eu")]
    assert place(req(regions=["eu"]), nodes, []).node == "eu1"
    assert place(req(offerings=["h100-x1-us"]), nodes, []).node == "us1"
    assert "region eu is not in ap" in place(req(regions=["ap"]), nodes, []).explain


def test_a_custom_scorer_is_the_pricing_seam() -> None:
    nodes = [node("big", cpus=64), node("small", cpus=4)]

    def pack(request: Request, candidate: Candidate) -> tuple[float, ...]:
        return (-candidate.free_after.cpu_millis,)

    assert place(req({"cpu": "1"}), nodes, []).node == "big"
    assert place(req({"cpu": "1"}), nodes, [], scorer=pack).node == "small"


def test_reservations_come_from_live_placed_attempts() -> None:
    def attempt(phase: str, node_name: str = "a") -> dict[str, Any]:
        return {"metadata": {"name": "x"}, "spec": {"node": node_name, "resources": {"cpu": "2"}, "gpuIndexes": [1]},
                "status": {"phase": phase}}

    assert reservation_of(attempt("Running")) == Reservation("a", Amount(2000, 0, 0, 1), (1,))
    assert reservation_of(attempt("Succeeded")) is None, "a finished attempt frees its capacity"
    assert reservation_of(attempt("Pending", "")) is None
    assert isinstance(fit(req(), node("a"), []), Candidate)
    assert Placement(None).node is None
