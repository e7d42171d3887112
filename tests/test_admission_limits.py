"""The operator's admission limits travel with each admission, not through a module global: two
admissions (and two resource services) in one process with different --gang-max-nodes answer the same
Job differently, and the flag's bad values are refused naming it."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

from nodus import config as daemon_config
from nodus.coordinator import main
from nodus.coordinator.api import admission
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.api.limits import AdmissionLimits
from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import SYSTEM, Identity
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key

JOB, SWEEP = resolve("jobs"), resolve("sweeps")
SMALL, LARGE = AdmissionLimits(gang_max_nodes=4), AdmissionLimits(gang_max_nodes=12)


class Nothing:
    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return None


def job(distributed: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "gang"},
            "spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"], "distributed": distributed,
                     "network": {"egress": {"policy": "Open"}}}}  # an image gang's egress must be Open (ADR 0033)


def sweep(distributed: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "grid"},
            "spec": {"matrix": {"params": {"LR": ["1e-4", "3e-4"]}}, "template": {"spec": job(distributed)["spec"]}}}


def causes(info: Any, obj: dict[str, Any], limits: AdmissionLimits) -> list[tuple[str, str]]:
    with pytest.raises(NodusError) as raised:
        asyncio.run(admission.admit_create(info, obj, Nothing(), project="p", limits=limits))
    assert raised.value.reason == "Invalid"
    return [(c.field, c.message) for c in raised.value.causes]


def admitted(info: Any, obj: dict[str, Any], limits: AdmissionLimits) -> dict[str, Any]:
    return asyncio.run(admission.admit_create(info, obj, Nothing(), project="p", limits=limits)).object


def test_the_node_cap_is_the_limits_of_each_admission() -> None:
    six = job({"nodes": 6})
    assert causes(JOB, six, SMALL) == [("spec.distributed.nodes", "Invalid value: 6: must be at most 4 during the beta")]
    assert admitted(JOB, six, LARGE)["spec"]["distributed"]["nodes"] == 6
    assert causes(JOB, job({"nodes": 6}), SMALL)  # the refusal did not change what the other admits
    assert admitted(JOB, job({"nodes": 6}), LARGE)


def test_total_gpus_resolve_against_the_cap_of_each_admission() -> None:
    forty_eight = job({"totalGPUs": 48, "gpusPerNode": 8})  # 6 nodes
    assert causes(JOB, forty_eight, SMALL) == [
        ("spec.distributed.totalGPUs",
         "Invalid value: 48: resolves to 6 nodes of 8 GPUs; at most 4 nodes during the beta")]
    assert admitted(JOB, forty_eight, LARGE)["spec"]["distributed"]["totalGPUs"] == 48


def test_a_sweep_template_is_held_to_the_same_cap() -> None:
    grid = sweep({"nodes": 6})
    assert causes(SWEEP, grid, SMALL) == [
        ("spec.template.spec.distributed.nodes", "Invalid value: 6: must be at most 4 during the beta")]
    assert admitted(SWEEP, grid, LARGE)["spec"]["template"]["spec"]["distributed"]["nodes"] == 6


def test_the_default_is_the_beta_cap_of_8() -> None:
    assert AdmissionLimits().gang_max_nodes == 8
    assert causes(JOB, job({"nodes": 9}), AdmissionLimits()) == [
        ("spec.distributed.nodes", "Invalid value: 9: must be at most 8 during the beta")]


def test_two_resource_services_in_one_process_admit_under_their_own_limits(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            identity = Identity(store)
            await identity.ensure_project("p", "test")
            vault = Vault(store, load_or_create_key(tmp_path / "secret.key"))
            small = ResourceService(store, identity, vault, limits=SMALL)
            large = ResourceService(store, identity, vault, limits=LARGE)
            with pytest.raises(NodusError) as refused:
                await small.create(SYSTEM, JOB, "p", copy.deepcopy(job({"nodes": 6})))
            assert [c.field for c in refused.value.causes] == ["spec.distributed.nodes"]
            created, _ = await large.create(SYSTEM, JOB, "p", copy.deepcopy(job({"nodes": 6})))
            assert created["spec"]["distributed"]["nodes"] == 6
            # An update goes through the same limits: the small service refuses what the large one stored.
            with pytest.raises(NodusError) as refused_update:
                await small.replace(SYSTEM, JOB, "p", "gang", copy.deepcopy(created))
            assert "spec.distributed.nodes" in [c.field for c in refused_update.value.causes]
        finally:
            await store.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("nodes", [1, 17, True])
def test_a_cap_outside_2_to_16_is_refused(nodes: Any) -> None:
    with pytest.raises(ValueError, match="between 2 and 16"):
        AdmissionLimits(gang_max_nodes=nodes)


def test_the_coordinator_flag_becomes_the_limits_and_a_bad_one_names_the_flag() -> None:
    args = daemon_config.resolve(main.parser(), ["--gang-max-nodes", "12"])
    assert main._admission_limits(args) == LARGE
    with pytest.raises(SystemExit, match="--gang-max-nodes: the gang size cap must be between 2 and 16, got 20"):
        main._admission_limits(daemon_config.resolve(main.parser(), ["--gang-max-nodes", "20"]))
