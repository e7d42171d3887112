"""The price book as values: parsing examples/pricebook.yaml, every bad field named with its fix, the
versions kept in the store, and whether a measured node fits its offering. No process is started."""
from __future__ import annotations

import asyncio
import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodus.coordinator.errors import NodusError
from nodus.coordinator.money.books import Outcome, PriceBooks
from nodus.coordinator.money.fit import MeasuredGpu, MeasuredShape, differences
from nodus.coordinator.money.pricebook import Interconnect, parse
from nodus.coordinator.store import SqliteStore

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def causes(document: Any) -> dict[str, str]:
    with pytest.raises(NodusError) as raised:
        parse(document)
    assert raised.value.reason == "Invalid"
    return {c.field: c.message for c in raised.value.causes}


def test_the_example_parses_into_exact_values() -> None:
    book = parse(example())
    assert book.version == "2026-12-01" and book.storage_usd_per_gib_month == Decimal("0.08")
    h100 = book.offering("h100-sxm-80g-x8-us")
    assert h100 is not None and h100.accelerator is not None
    assert (h100.accelerator.family, h100.gpus, h100.accelerator.memory_bytes) == ("H100", 8, 80 << 30)
    assert h100.accelerator.interconnect is Interconnect.NVLINK
    assert (h100.rate_usd_per_hour, h100.billing_increment_s, h100.minimum_charge_s) == (Decimal("23.92"), 60, 300)
    spot = [o for o in book.offerings if o.interruptible]
    assert [(o.id, o.interruptions_per_hour) for o in spot] == [("a100-sxm-80g-x8-eu-spot", Decimal("0.05"))]
    cpu = book.offering("cpu-2-8g-us")
    assert cpu is not None and cpu.accelerator is None and cpu.gpus == 0 and cpu.rate_usd_per_hour == Decimal("0.085")
    assert {o.region_class for o in book.offerings} == {"us", "eu"}
    assert book.offering("nope") is None


def test_a_float_rate_is_refused_with_the_field_path_and_the_fix() -> None:
    doc = example()
    doc["offerings"][2]["rateUSDPerHour"] = 2.5
    found = causes(doc)
    assert list(found) == ["offerings[2].rateUSDPerHour"]
    assert 'must be a decimal string like "2.50"' in found["offerings[2].rateUSDPerHour"]
    with pytest.raises(NodusError) as raised:
        parse(doc)
    assert "offerings[2].rateUSDPerHour" in raised.value.message and "offerings[2].rateUSDPerHour" in \
        raised.value.effective_fix


def test_every_bad_field_is_named_at_once() -> None:
    doc = example()
    doc["pricebookVersion"] = "has spaces"
    doc["storageUSDPerGiBMonth"] = "-1"
    doc["offerings"][0]["accelerator"]["gpusPerNode"] = 0
    doc["offerings"][0]["accelerator"]["interconnect"] = "InfiniBand"
    doc["offerings"][1]["billingIncrement"] = "1.5s"
    doc["offerings"][1]["vcpu"] = True
    doc["offerings"][2]["interruptionsPerHour"] = "0"
    doc["offerings"][3]["memory"] = "lots"
    doc["offerings"][4]["ratePerHour"] = "1.00"
    del doc["offerings"][4]["regionClass"]
    doc["offerings"].append(copy.deepcopy(doc["offerings"][3]))
    found = causes(doc)
    assert set(found) == {
        "pricebookVersion", "storageUSDPerGiBMonth", "offerings[0].accelerator.gpusPerNode",
        "offerings[0].accelerator.interconnect", "offerings[1].billingIncrement", "offerings[1].vcpu",
        "offerings[2].interruptionsPerHour", "offerings[3].memory", "offerings[4].ratePerHour",
        "offerings[4].regionClass", "offerings[5].memory", "offerings[5].id"}
    assert "Unsupported value" in found["offerings[0].accelerator.interconnect"]
    assert "whole seconds" in found["offerings[1].billingIncrement"]
    assert "above 0" in found["offerings[2].interruptionsPerHour"]
    assert found["offerings[4].ratePerHour"].startswith("Unknown field")
    assert found["offerings[4].regionClass"].startswith("Required value")
    assert found["offerings[5].id"].startswith("Duplicate value")


def test_a_document_that_is_not_a_book() -> None:
    assert set(causes(["not", "a", "mapping"])) == {"document"}
    assert set(causes({"pricebookVersion": "v1", "storageUSDPerGiBMonth": "0"})) == {"offerings"}
    assert set(causes({"pricebookVersion": "v1", "storageUSDPerGiBMonth": "0", "offerings": []})) == {"offerings"}


def test_the_digest_is_of_values_not_spelling() -> None:
    doc = example()
    same = copy.deepcopy(doc)
    same["offerings"][0]["rateUSDPerHour"] = "23.920"
    same["offerings"][0]["memory"] = str(1800 << 30)
    assert parse(same).digest == parse(doc).digest
    other = copy.deepcopy(doc)
    other["offerings"][0]["rateUSDPerHour"] = "23.93"
    assert parse(other).digest != parse(doc).digest


def _shape(gpus: int, family: str = "H100", memory: int = 80 << 30, vcpus: int = 208,
           host_memory: int = 1800 << 30) -> MeasuredShape:
    return MeasuredShape(tuple(MeasuredGpu(family, family, memory, True) for _ in range(gpus)), vcpus, host_memory)


def test_a_node_fits_its_offering_or_the_differences_are_named() -> None:
    book = parse(example())
    h100 = book.offering("h100-sxm-80g-x8-us")
    assert h100 is not None
    assert differences(h100, _shape(8)) == ()
    assert differences(h100, _shape(8, memory=81559 << 20)) == ()  # what NVML reports of an 80 GB H100
    found = differences(h100, _shape(4, family="A100", memory=40 << 30, vcpus=16, host_memory=64 << 30))
    assert found == ("GPUs: the node has 4, offering h100-sxm-80g-x8-us has 8",
                     "GPU family: the node has A100, offering h100-sxm-80g-x8-us has H100",
                     "GPU memory: the node's smallest GPU has 40.0Gi, offering h100-sxm-80g-x8-us has 80.0Gi per GPU",
                     "vCPU: the node has 16, offering h100-sxm-80g-x8-us has 208",
                     "memory: the node has 64.0Gi, offering h100-sxm-80g-x8-us has 1800.0Gi")
    cpu = book.offering("cpu-2-8g-us")
    assert cpu is not None
    assert differences(cpu, _shape(0, vcpus=2, host_memory=8 << 30)) == ()
    assert differences(cpu, _shape(1, vcpus=4, host_memory=16 << 30)) == (
        "GPUs: the node has 1, offering cpu-2-8g-us has 0",)
    spot = book.offering("a100-sxm-80g-x8-eu-spot")
    assert spot is not None
    shape = _shape(8, family="A100", vcpus=96, host_memory=1152 << 30)
    assert differences(spot, MeasuredShape(shape.gpus, shape.vcpus, shape.memory_bytes, "eu", True)) == ()
    assert differences(spot, MeasuredShape(shape.gpus, shape.vcpus, shape.memory_bytes, "", True)) == ()
    assert differences(spot, MeasuredShape(shape.gpus, shape.vcpus, shape.memory_bytes, "us", False)) == (
        "region class: the node says us (--region), offering a100-sxm-80g-x8-eu-spot is in eu",
        "interruptible: the node says false (--interruptible), offering a100-sxm-80g-x8-eu-spot is interruptible")
    assert differences(h100, MeasuredShape(_shape(8).gpus, 208, 1800 << 30, "us", True)) == (
        "interruptible: the node says true (--interruptible), offering h100-sxm-80g-x8-us is not interruptible",)


def test_versions_are_kept_and_never_change(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            books = PriceBooks(store)
            assert await books.active() is None
            with pytest.raises(NodusError) as none:
                await books.get()
            assert none.value.reason == "NotFound" and "pricebook apply" in none.value.effective_fix
            first = example()
            stored, outcome = await books.apply(first, "2026-12-01T00:00:00Z")
            assert outcome is Outcome.CREATED and stored.active
            assert (await books.apply(first, "2026-12-01T00:01:00Z"))[1] is Outcome.UNCHANGED

            changed = example()
            changed["offerings"][0]["rateUSDPerHour"] = "19.99"
            with pytest.raises(NodusError) as replaced:
                await books.apply(changed, "2026-12-01T00:02:00Z")
            assert replaced.value.reason == "AlreadyExists" and "new pricebookVersion" in replaced.value.effective_fix
            changed["pricebookVersion"] = "2026-12-02"
            assert (await books.apply(changed, "2026-12-02T00:00:00Z"))[1] is Outcome.CREATED
            active = await books.active()
            assert active is not None and active.version == "2026-12-02"

            old = await books.get("2026-12-01")  # an old charge can still be explained by its version
            assert not old.active and old.apply_time == "2026-12-01T00:00:00Z"
            h100 = old.book.offering("h100-sxm-80g-x8-us")
            assert h100 is not None and h100.rate_usd_per_hour == Decimal("23.92")
            assert [(v.book.version, v.active) for v in await books.versions()] == [
                ("2026-12-01", False), ("2026-12-02", True)]
            assert (await books.apply(first, "2026-12-03T00:00:00Z"))[1] is Outcome.ACTIVATED
            assert (await PriceBooks(store).active()).version == "2026-12-01"  # type: ignore[union-attr]
            with pytest.raises(NodusError) as missing:
                await books.get("1999")
            assert missing.value.reason == "NotFound"
        finally:
            await store.close()
    asyncio.run(scenario())
