"""A large Sweep (more cells than SweepSettings.summary_cells, lowered here to 3 through the resource
service's settings) is stored as its summary only — phase, cellCounts, cost, best, conditions, no
`cells` — while GET, LIST and a WATCH's initial events through the resource service (what REST and gRPC
both serve) show status.cells built from the cell Jobs, in the shape a small Sweep stores; the Sweep
controller creates each cell once, at most maxParallel at a time, and a restarted controller (a fresh
cache and index over the same store) creates none twice. A small Sweep beside it still stores its rows."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.clock import SystemClock
from nodus.coordinator.controllers.cache import Cache
from nodus.coordinator.controllers.fleet import Fleet
from nodus.coordinator.controllers.sweep import SweepSettings
from nodus.coordinator.controllers.sweep_controller import SweepController
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.selectors import parse_field_selector, parse_label_selector
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key

SWEEPS, JOBS = resolve("sweeps"), resolve("jobs")
SETTINGS = SweepSettings(summary_cells=3, summary_interval=0.0)


def sweep(name: str, values: list[str], max_parallel: int = 2) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["train"]}},
        "matrix": {"params": {"LR": values}}, "maxParallel": max_parallel}}


async def eventually(check: Callable[[], Awaitable[bool]], what: str, limit: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        assert loop.time() < deadline, f"not so after {limit} s: {what}"
        await asyncio.sleep(0.02)


class Coordinator:
    """The resource service, the cache and the Sweep controller over one store, as `nodus-coordinator`
    wires them (no Job controller: the test writes the cells' status itself)."""

    def __init__(self, store: SqliteStore, identity: Identity, vault: Vault) -> None:
        self.cache = Cache(store)
        self.service = ResourceService(store, identity, vault, fleet=Fleet(self.cache, SystemClock()), sweeps=SETTINGS)
        self.controller = SweepController(self.cache, self.service, SystemClock())
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.cache.start()
        self.task = asyncio.create_task(self.controller.run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.cache.stop()

    async def cells(self, name: str) -> list[dict[str, Any]]:
        page = await self.service.list(SYSTEM, JOBS, "p", labels=parse_label_selector(f"nodus.dev/sweep={name}"),
                                       fields=parse_field_selector(""))
        return page.items

    async def finish(self, job: dict[str, Any], phase: str, cost: str, units: int | None = None) -> None:
        """Writes a cell Job's status as the Job and money controllers would."""
        status: dict[str, Any] = {"phase": phase, "cost": {"totalUSD": cost},
                                  "startTime": "2026-12-03T10:00:00Z", "completionTime": "2026-12-03T10:00:10Z"}
        if units is not None:
            status["progress"] = {"units": {"completed": units}}
        current = await self.service.get(SYSTEM, JOBS, "p", job["metadata"]["name"])
        await self.service.replace(SYSTEM, JOBS, "p", job["metadata"]["name"], {**current, "status": status},
                                   subresource="status")


async def stored(store: SqliteStore, name: str) -> dict[str, Any]:
    rec = await store.get(f"sweeps/p/{name}")
    assert rec is not None
    return dict(orjson.loads(rec.value))


def test_a_large_sweep_stores_its_summary_and_serves_its_cells_from_the_cell_jobs(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        identity = Identity(store)
        await identity.ensure_project("p", "test")
        vault = Vault(store, load_or_create_key(tmp_path / "secret.key"))
        c = Coordinator(store, identity, vault)
        await c.start()
        try:
            await c.service.create(SYSTEM, SWEEPS, "p", sweep("big", ["0.1", "0.2", "0.3", "0.4", "0.5"]))
            await c.service.create(SYSTEM, SWEEPS, "p", sweep("small", ["0.1", "0.2"]))

            async def two_cells() -> bool:
                return len(await c.cells("big")) == 2 and (await stored(store, "big")).get("status", {}).get(
                    "cellCounts") == {"Pending": 5}
            await eventually(two_cells, "the first maxParallel cells of the big Sweep exist")
            # The cells exist but have no status yet: the Job is Pending, as the cells not created are.
            first = await stored(store, "big")
            assert "cells" not in first["status"], "a large Sweep's stored status holds no cell rows"
            got = await c.service.get(SYSTEM, SWEEPS, "p", "big")
            assert [(r["index"], r["object"], r["phase"], r["params"], r["costUSD"]) for r in got["status"]["cells"]] \
                == [(i, f"big-{i}", "Pending", {"LR": f"0.{i + 1}"}, "0.00") for i in range(5)]
            rec = await store.get("sweeps/p/big")
            assert rec is not None and got["metadata"]["resourceVersion"] == str(rec.revision), "served as stored"

            # Finish the cells as they are created: a failure, then successes with reported units.
            outcomes = {0: ("Succeeded", "2.00", 10), 1: ("Failed", "0.50", None), 2: ("Succeeded", "1.00", 4),
                        3: ("Succeeded", "3.00", 30), 4: ("Succeeded", "1.20", 6)}
            finished: set[str] = set()

            async def all_finished() -> bool:
                for job in await c.cells("big"):
                    name = job["metadata"]["name"]
                    if name not in finished:
                        finished.add(name)
                        await c.finish(job, *outcomes[int(name.rsplit("-", 1)[1])])
                return len(finished) == 5 and (await stored(store, "big"))["status"].get("phase") == "Failed"
            await eventually(all_finished, "every cell finished and the Sweep ended")

            summary = (await stored(store, "big"))["status"]
            assert "cells" not in summary
            assert summary["cellCounts"] == {"Succeeded": 4, "Failed": 1}
            assert (summary["phase"], summary["reason"]) == ("Failed", "CellsFailed") and "big-1" in summary["message"]
            assert summary["cost"] == {"totalUSD": "7.70"}
            # byCost per unit: 3.00/30 = 0.10 is the cheapest; byThroughput: 30 units in 10 s.
            assert summary["best"] == {"byCost": 3, "byThroughput": 3}

            expected = [{"index": 0, "object": "big-0", "phase": "Succeeded", "repetition": 0, "costUSD": "2.00",
                         "params": {"LR": "0.1"}, "wallSeconds": 10, "unitsPerSecond": "1.000"},
                        {"index": 1, "object": "big-1", "phase": "Failed", "repetition": 0, "costUSD": "0.50",
                         "params": {"LR": "0.2"}, "wallSeconds": 10},
                        {"index": 2, "object": "big-2", "phase": "Succeeded", "repetition": 0, "costUSD": "1.00",
                         "params": {"LR": "0.3"}, "wallSeconds": 10, "unitsPerSecond": "0.400"},
                        {"index": 3, "object": "big-3", "phase": "Succeeded", "repetition": 0, "costUSD": "3.00",
                         "params": {"LR": "0.4"}, "wallSeconds": 10, "unitsPerSecond": "3.000"},
                        {"index": 4, "object": "big-4", "phase": "Succeeded", "repetition": 0, "costUSD": "1.20",
                         "params": {"LR": "0.5"}, "wallSeconds": 10, "unitsPerSecond": "0.600"}]
            got = await c.service.get(SYSTEM, SWEEPS, "p", "big")
            assert got["status"]["cells"] == expected
            assert {k: v for k, v in got["status"].items() if k != "cells"} == summary, "the summary as stored"
            listed = await c.service.list(SYSTEM, SWEEPS, "p", labels=parse_label_selector(""),
                                          fields=parse_field_selector(""))
            by_name = {s["metadata"]["name"]: s for s in listed.items}
            assert by_name["big"]["status"]["cells"] == expected, "LIST serves the same rows as GET"
            watch = await c.service.watch(SYSTEM, SWEEPS, "p", labels=parse_label_selector(""),
                                          fields=parse_field_selector("metadata.name=big"))
            first_event = await watch.__anext__()
            assert first_event.type == "ADDED" and first_event.object["status"]["cells"] == expected
            await watch.aclose()  # type: ignore[attr-defined]

            # A small Sweep keeps its rows in the store, in the same shape.
            async def small_done() -> bool:
                for job in await c.cells("small"):
                    if job["metadata"]["name"] not in finished:
                        finished.add(job["metadata"]["name"])
                        await c.finish(job, "Succeeded", "1.00", 5)
                return (await stored(store, "small"))["status"].get("phase") == "Succeeded"
            await eventually(small_done, "the small Sweep succeeded")
            small = await stored(store, "small")
            assert [r["object"] for r in small["status"]["cells"]] == ["small-0", "small-1"]
            assert small["status"]["cellCounts"] == {"Succeeded": 2}
            assert (await c.service.get(SYSTEM, SWEEPS, "p", "small"))["status"] == small["status"]
        finally:
            await c.stop()
        # A restart: a fresh cache and index over the same store decide again and create no cell twice.
        again = Coordinator(store, identity, vault)
        await again.start()
        try:
            await asyncio.sleep(0.5)
            assert sorted(j["metadata"]["name"] for j in await again.cells("big")) == [f"big-{i}" for i in range(5)]
            served = await again.service.get(SYSTEM, SWEEPS, "p", "big")
            assert served["status"]["cells"] == expected
        finally:
            await again.stop()
            await store.close()
    asyncio.run(scenario())


def test_a_deleted_large_sweep_takes_its_cells_and_a_copy_of_the_served_object_is_the_callers(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        identity = Identity(store)
        await identity.ensure_project("p", "test")
        c = Coordinator(store, identity, Vault(store, load_or_create_key(tmp_path / "secret.key")))
        await c.start()
        try:
            await c.service.create(SYSTEM, SWEEPS, "p", sweep("big", ["1", "2", "3", "4"], max_parallel=4))

            async def four() -> bool:
                return len(await c.cells("big")) == 4
            await eventually(four, "every cell created")
            got = await c.service.get(SYSTEM, SWEEPS, "p", "big")
            mine = copy.deepcopy(got)
            got["status"]["cells"].clear()  # a reader's object is its own: the next read is whole again
            assert (await c.service.get(SYSTEM, SWEEPS, "p", "big"))["status"]["cells"] == mine["status"]["cells"]
            await c.service.delete(SYSTEM, SWEEPS, "p", "big")

            async def none() -> bool:
                return not await c.cells("big")
            await eventually(none, "the deleted Sweep's cells are deleted")
        finally:
            await c.stop()
            await store.close()
    asyncio.run(scenario())
