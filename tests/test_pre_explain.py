"""A Job's first attempts that fit no node are created with placement's explain, and its Queued status names it
(ADR 0096): one decision and three writes per create (the Job; its attempt and its status together), where the
pass's explain and the decision it set off made five. On the controller-level harness (tests/job_harness.py)
with a real fleet, node registry and placement controller; the passes are called by hand."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from job_harness import PROJECT, JobHarness
from nodus.coordinator.controllers.cache import attempt_key, job_key
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.job_controller import new_attempt
from nodus.coordinator.controllers.placement import PlacementController
from nodus.coordinator.nodes import NodeRegistry
from nodus.v1 import common_pb2

GPU = {"resources": {"gpu": {"count": 1}}}


def _inventory(gpus: int) -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(
        runtimes=[common_pb2.RUNTIME_PROCESS], host=common_pb2.HostInventory(cpus=4, memory_bytes=1 << 33),
        gpus=[common_pb2.Gpu(index=i, name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30) for i in range(gpus)])


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, explained: bool, gpus: int) -> dict[str, Any]:
    """Creates a one-GPU Job on a fleet of one node with `gpus` GPUs, decides it, runs a placement pass and
    drains what that sets off: the counts of decisions and writes, the attempt and the Job as stored."""
    out: dict[str, Any] = {}
    tmp_path.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        h = await JobHarness.open(tmp_path)
        registry = NodeRegistry(Fleet(h.cache, h.clock), h.objects, h.clock, lease_duration=15, heartbeat_interval=3)
        placement = PlacementController(registry, h.objects, h.clock)
        if explained:
            h.controller.explain = placement.explain_new
        h.count_decisions(monkeypatch)
        try:
            await registry.register("n1", _inventory(gpus))
            await h.caught_up()
            start = h.store.revision
            await h.create_job("j", **GPU)
            await h.drain()
            [name] = h.attempts("j")
            key = attempt_key(PROJECT, name)
            out["attempt_after_decision"] = h.cache.get(key)
            out["job_after_decision"] = h.job("j")
            for _ in range(3):  # the pass, and whatever its writes set off, until nothing moves
                await placement.place()
                await h.drain()
            out.update(decisions=h.decisions, writes=h.store.revision - start, tried=placement.tried,
                       attempt=h.cache.get(key), job=h.job("j"), revision=h.cache.revision(job_key(PROJECT, "j")))
            h.controller._settled.clear()  # forget the skip: deciding again on what is stored must change nothing
            h.controller.queue.add(job_key(PROJECT, "j"))
            await h.drain()
            out["revision_after_redecide"] = h.cache.revision(job_key(PROJECT, "j"))
            await registry.register("n2", _inventory(1))  # room comes: the parked attempt wakes and is placed
            await h.caught_up()
            await placement.place()
            await h.drain()
            out["attempt_after_room"] = h.cache.get(key)
        finally:
            await h.close()
    asyncio.run(main())
    return out


def _explain(obj: dict[str, Any] | None) -> str:
    return (((obj or {}).get("status") or {}).get("placement") or {}).get("explain", "")


def test_a_first_attempt_that_fits_nowhere_is_created_explained_with_the_message_in_one_decision(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _run(tmp_path / "before", monkeypatch, explained=False, gpus=0)
    after = _run(tmp_path / "after", monkeypatch, explained=True, gpus=0)
    # The same end state either way: the attempt waits with the pass's explain, the Job names it.
    explain = _explain(before["attempt"])
    assert "n1: gpu: wants 1 × any, 0 free" in explain, explain
    assert _explain(after["attempt"]) == explain
    for out in (before, after):
        assert out["job"]["status"]["phase"] == "Queued"
        assert out["job"]["status"]["message"] == f"waiting for capacity: {explain}"
        assert out["attempt"]["status"]["reason"] == "WaitingForCapacity"
        assert out["revision_after_redecide"] == out["revision"], "deciding again on it wrote something"
    # ... but the explain and the message come with the decision's own writes.
    assert _explain(after["attempt_after_decision"]) == explain
    assert after["job_after_decision"]["status"]["message"] == f"waiting for capacity: {explain}"
    assert before["job_after_decision"]["status"].get("message", "") == ""
    assert (before["decisions"], before["writes"]) == (2, 5)
    assert (after["decisions"], after["writes"]) == (1, 3), "one decision, the Job, its attempt and its status"
    assert before["tried"] == 1
    # Its first decision found it fitting nowhere on the fleet as it still was: parked as it arrived, no pass
    # decides it again (ADR 0128) ...
    assert after["tried"] == 0, "a pass decided the attempt its first decision had explained"
    # ... and room on a node wakes it, as it wakes an attempt a pass parked.
    for out in (before, after):
        assert out["attempt_after_room"]["spec"]["node"] == "n2"


def test_a_first_attempt_that_fits_is_created_without_an_explain_and_placed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(tmp_path, monkeypatch, explained=True, gpus=1)
    assert _explain(out["attempt_after_decision"]) == ""
    assert out["job_after_decision"]["status"].get("message", "") == ""
    assert out["attempt"]["spec"]["node"] == "n1"


def test_a_first_decision_made_before_the_fleet_changed_is_decided_again_by_a_pass(tmp_path: Path) -> None:
    """ADR 0128's guard: an attempt whose first decision (fits nowhere) was made before a node joined is not
    parked on that stale answer; the next pass decides it, and places it on the new node."""
    async def main() -> None:
        h = await JobHarness.open(tmp_path)
        registry = NodeRegistry(Fleet(h.cache, h.clock), h.objects, h.clock, lease_duration=15, heartbeat_interval=3)
        placement = PlacementController(registry, h.objects, h.clock)
        try:
            await registry.register("n1", _inventory(0))
            await h.create_job("j", **GPU)
            await h.caught_up()
            job = h.job("j")
            assert job is not None
            stale = new_attempt(job, 0, 1, h.clock.now())
            assert "0 free" in placement.explain_new([stale], job)
            await registry.register("n2", _inventory(1))  # room joins between the decision and the attempt's write
            await h.caught_up()
            await h.objects.create(attempt_key(PROJECT, stale["metadata"]["name"]), stale)
            await h.caught_up()
            assert set(placement.queue.active) == {attempt_key(PROJECT, stale["metadata"]["name"])}, \
                "parked on a stale answer"
            await placement.place()
            await h.drain()
            assert placement.tried == 1
            assert h.cache.get(attempt_key(PROJECT, stale["metadata"]["name"]))["spec"]["node"] == "n2"
        finally:
            await h.close()
    asyncio.run(main())
