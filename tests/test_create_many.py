"""ResourceService.create_many, the Sweep controller's creates of one pass: each object admitted and
created as `create` would, one result per object in order, a refusal (AlreadyExists for a cell created
before a restart, Invalid for a bad body) given back in its place without stopping the others, and the
caller's rights and the project checked once for all of them; alike objects (a pass's cells: one template,
their own names, labels and env values) admitted once, each exactly as its own create admits it."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import SYSTEM, Caller, Role
from services import resource_service

JOBS = resolve("jobs")


def job(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"command": ["true"], **spec}}


def test_create_many_answers_each_object_in_order_and_a_refusal_stops_none_of_the_others(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with resource_service(tmp_path) as (store, service):
            await service.create(SYSTEM, JOBS, "p", job("b"))
            seen: list[str] = []
            got = await service.create_many(SYSTEM, JOBS, "p", [job("a"), job("b"), job("c", parallelism=0), job("d")],
                                            lambda obj: seen.append(obj["metadata"]["name"]))
            assert sorted(seen) == ["a", "d"], "`created` gets each object created, and only those"
            assert [g["metadata"]["name"] if isinstance(g, dict) else g.reason for g in got] \
                == ["a", "AlreadyExists", "Invalid", "d"]
            assert isinstance(got[2], NodusError) and "spec.parallelism" in str(got[2])
            for g in (got[0], got[3]):
                assert isinstance(g, dict)
                stored = await service.get(SYSTEM, JOBS, "p", g["metadata"]["name"])
                assert stored == g, "each result is the object as stored"
                assert g["metadata"]["uid"] and g["spec"]["backoffLimit"] == 6, "admitted as create admits"
            assert len({g["metadata"]["uid"] for g in (got[0], got[3]) if isinstance(g, dict)}) == 2

            with pytest.raises(NodusError) as denied:  # the caller's rights, once for the batch
                await service.create_many(Caller("viewer", "p", Role.VIEWER), JOBS, "p", [job("e")])
            assert denied.value.reason == "Forbidden"
            with pytest.raises(NodusError) as missing:
                await service.create_many(SYSTEM, JOBS, "nope", [job("e")])
            assert missing.value.reason == "NotFound" and "nope" in str(missing.value)
            assert await store.get("jobs/p/e") is None
    asyncio.run(scenario())


def cell(name: str, index: int, value: Any, **spec: Any) -> dict[str, Any]:
    """A Sweep cell's body, as controllers/sweep.py::cell_job makes it: the template, a cell label and its
    NODUS_PARAM_ value beside a literal variable of the template's."""
    return {"apiVersion": "nodus.dev/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"nodus.dev/sweep": "s", "nodus.dev/cell": str(index)}},
            "spec": {"command": ["true"], "placement": {"queueTimeout": "1ms"}, **spec,
                     "env": [{"name": "MODE", "value": "fast"}, {"name": "NODUS_PARAM_LR", "value": value}]}}


def _same_parts(obj: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What two creates of one body share: the spec, the labels, and the status without its estimate's
    moment (the quote names the time it was made)."""
    status = {k: v for k, v in (obj.get("status") or {}).items() if k != "estimate"}
    return obj["spec"], obj["metadata"].get("labels"), status


def test_alike_objects_are_admitted_once_and_each_is_what_its_own_create_admits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with resource_service(tmp_path) as (store, service):
            bodies = [cell(f"c-{i}", i, f"0.{i}") for i in range(6)]
            bodies += [cell(f"c-{i}", i, f"0.{i}", backoffLimit=2) for i in range(6, 9)]  # a second shape
            bodies.append(cell("c-9", 9, 5))  # a value that is no string: admitted alone, and refused
            bodies.append(cell("c-10", 10, "0.10"))
            bodies[10]["metadata"]["labels"]["nodus.dev/cell"] = "-10-"  # alike, but its own label is bad
            got = await service.create_many(SYSTEM, JOBS, "p", [copy.deepcopy(b) for b in bodies])
            refused = {i: g for i, g in enumerate(got) if isinstance(g, NodusError)}
            assert sorted(refused) == [9, 10]
            assert refused[9].reason == "Invalid" and "spec.env[1].value" in str(refused[9])
            assert refused[10].reason == "Invalid" and "metadata.labels" in str(refused[10])
            for i, g in enumerate(got):
                if i in refused:
                    continue
                assert isinstance(g, dict)
                alone, _ = await service.create(SYSTEM, JOBS, "p", {**copy.deepcopy(bodies[i]),
                                                                     "metadata": {**bodies[i]["metadata"],
                                                                                  "name": f"alone-{i}"}})
                assert _same_parts(g) == _same_parts(alone), f"cell {i} is admitted as its own create admits it"
                assert g["spec"]["env"][1]["value"] == f"0.{i}" and g["spec"]["backoffLimit"] == (2 if i >= 6 else 6)
                assert await service.get(SYSTEM, JOBS, "p", f"c-{i}") == g
            first, second = got[0], got[1]
            assert isinstance(first, dict) and isinstance(second, dict)
            second["spec"]["command"].append("changed")
            assert first["spec"]["command"] == ["true"], "objects admitted alike share no containers"
    asyncio.run(scenario())
