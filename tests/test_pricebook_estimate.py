"""money/estimate.py: charges by billing increment and minimum charge, postings that sum to the cent,
and p50/p90 bands; properties over random tariffs and durations (hypothesis), and worked examples
from examples/pricebook.yaml."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.coordinator.money.estimate import Band, Tariff, cost_band
from nodus.coordinator.money.pricebook import parse

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"

rates = st.decimals(min_value=Decimal("0.001"), max_value=Decimal("200"), places=3)
tariffs = st.builds(Tariff, rates, st.sampled_from([1, 10, 30, 60, 300, 3600]), st.integers(0, 3600))
seconds = st.decimals(min_value=Decimal(0), max_value=Decimal(7 * 86400), places=3)


def book_tariff(offering_id: str) -> Tariff:
    offering = parse(yaml.safe_load(EXAMPLE.read_text())).offering(offering_id)
    assert offering is not None
    return Tariff.of(offering)


def test_worked_examples_from_the_example_book() -> None:
    h100 = book_tariff("h100-sxm-80g-x8-us")  # 23.92/h, 60 s increments, 5 min minimum
    assert h100.minimum_charge_usd == Decimal("1.99")  # 23.92 × 300 / 3600 = 1.9933…
    assert h100.charge(Decimal(10)) == Decimal("1.99")  # ten seconds still pay the minimum
    assert h100.billed_seconds(Decimal(301)) == 360 and h100.charge(Decimal(301)) == Decimal("2.39")
    assert h100.charge(Decimal(3600)) == Decimal("23.92")
    assert cost_band(h100, Decimal(3600)) == Band(Decimal("23.92"), Decimal("23.92"))
    spot = book_tariff("a100-sxm-80g-x8-eu-spot")  # 9.60/h, 0.05 reclaims an hour
    band = cost_band(spot, Decimal(10 * 3600), interruptions_per_hour=Decimal("0.05"),
                     restart_overhead_s=Decimal(600))
    # no reclaim (p 0.61) → 96.00; one (p 0.30) → two allocations of 5 h 5 min → 97.60
    assert band == Band(Decimal("96.00"), Decimal("97.60"))


@given(tariffs, seconds)
def test_an_allocation_pays_every_started_increment_and_at_least_the_minimum(tariff: Tariff, s: Decimal) -> None:
    billed = tariff.billed_seconds(s)
    assert billed >= s and billed >= tariff.minimum_charge_s
    if billed > tariff.minimum_charge_s:
        assert billed % tariff.billing_increment_s == 0 and billed - s < tariff.billing_increment_s
    charge = tariff.charge(s)
    assert charge == charge.quantize(Decimal("0.01")) and charge >= tariff.minimum_charge_usd >= 0


@given(tariffs, seconds, seconds)
def test_a_longer_allocation_never_costs_less(tariff: Tariff, a: Decimal, b: Decimal) -> None:
    short, long = sorted((a, b))
    assert tariff.charge(short) <= tariff.charge(long)


@settings(max_examples=50)
@given(tariffs, st.integers(0, 2000))
def test_postings_per_increment_sum_to_the_charge_to_the_cent(tariff: Tariff, increments: int) -> None:
    postings = [tariff.charged_through(n) - tariff.charged_through(n - 1) for n in range(1, increments + 1)]
    assert all(p >= 0 for p in postings)
    assert sum(postings, Decimal("0.00")) == tariff.charged_through(increments)
    if increments:
        assert tariff.charged_through(increments) == tariff.charge(Decimal(increments * tariff.billing_increment_s))


@settings(max_examples=60)
@given(tariffs, seconds, st.decimals(min_value=Decimal(0), max_value=Decimal(600), places=1),
       st.decimals(min_value=Decimal(0), max_value=Decimal("0.5"), places=3),
       st.decimals(min_value=Decimal(0), max_value=Decimal(3600), places=0))
def test_bands_are_ordered_and_never_below_an_uninterrupted_run(tariff: Tariff, duration: Decimal, startup: Decimal,
                                                                rate: Decimal, overhead: Decimal) -> None:
    band = cost_band(tariff, duration, startup_s=startup, interruptions_per_hour=rate, restart_overhead_s=overhead)
    assert band.p50 <= band.p90
    uninterrupted = tariff.charge(startup + duration)
    assert band.p50 >= uninterrupted  # a restart only ever adds billed time
    if rate == 0:
        assert band == Band(uninterrupted, uninterrupted)


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        cost_band(Tariff(Decimal("1"), 60, 0), Decimal(-1))
