"""ResourceService.create_many, the Sweep controller's creates of one pass: each object admitted and
created as `create` would, one result per object in order, a refusal (AlreadyExists for a cell created
before a restart, Invalid for a bad body) given back in its place without stopping the others, and the
caller's rights and the project checked once for all of them."""
from __future__ import annotations

import asyncio
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
