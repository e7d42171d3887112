"""A controller's status write of a Job (status_write.py, ADR 0060): compare-and-swap on the version the
controller decided from, the status admitted as a status PUT's is, nothing written when it is the stored
one, Conflict and NotFound as the resource service answers them, and the caller's object left as it was."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import SYSTEM
from services import resource_service

JOBS = resolve("jobs")


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"command": ["true"]}}


def test_a_status_write_is_compare_and_swap_on_the_version_it_was_decided_from(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with resource_service(tmp_path) as (store, service):
            created, _ = await service.create(SYSTEM, JOBS, "p", job("a"))
            before = copy.deepcopy(created)

            written = await service.write_job_status("p", created, {"phase": "Queued", "active": 1})
            assert created == before, "the caller's object (a cache's copy) is not changed"
            got = await service.get(SYSTEM, JOBS, "p", "a")
            assert got == written and got["status"] == {"phase": "Queued", "active": 1}
            assert int(got["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
            assert got["spec"] == created["spec"] and got["metadata"]["uid"] == created["metadata"]["uid"]

            again = await service.write_job_status("p", written, {"phase": "Queued", "active": 1})
            assert again is written, "the stored status again: nothing is written"
            assert (await store.get("jobs/p/a")).revision == int(written["metadata"]["resourceVersion"])  # type: ignore[union-attr]

            with pytest.raises(NodusError) as stale:  # decided from the version before the last write
                await service.write_job_status("p", created, {"phase": "Failed"})
            assert stale.value.reason == "Conflict" and '"a"' in str(stale.value)
            with pytest.raises(NodusError) as bad:  # the status is admitted: its shape is checked
                await service.write_job_status("p", written, {"phase": "Queued", "active": "one"})
            assert bad.value.reason == "Invalid" and "status.active" in str(bad.value)
            with pytest.raises(NodusError) as unknown:
                await service.write_job_status("p", written, {"phase": "Queued", "bogus": 1})
            assert unknown.value.reason in ("Invalid", "BadRequest") and "bogus" in str(unknown.value)
            with pytest.raises(NodusError) as unversioned:
                await service.write_job_status("p", {**written, "metadata": {"name": "a"}}, {"phase": "Failed"})
            assert unversioned.value.reason == "Invalid" and "resourceVersion" in str(unversioned.value)

            # Only what changed is admitted again; a key set to null is unset, as a status PUT unsets it.
            last = await service.write_job_status("p", written, {"phase": "Failed", "active": None, "message": "m"})
            assert last["status"] == {"phase": "Failed", "message": "m"}
            assert (await service.get(SYSTEM, JOBS, "p", "a"))["status"] == {"phase": "Failed", "message": "m"}

            await service.delete(SYSTEM, JOBS, "p", "a")
            with pytest.raises(NodusError) as gone:
                await service.write_job_status("p", last, {"phase": "Succeeded"})
            assert gone.value.reason == "NotFound"
    asyncio.run(scenario())
