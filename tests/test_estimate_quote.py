"""status.estimate, pure (money/quote.py): every field from a Job's shape, the price book and a
placement preview; the NoDuration, Unpriced, ColdStart and InterruptibleSelected warnings; and the
dry run's ETag, which binds a create to exactly this spec's estimate."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import yaml
from cryptography.fernet import Fernet

from nodus.coordinator.money.pricebook import parse
from nodus.coordinator.vault import Vault
from nodus.coordinator.money.estimate import Tariff
from nodus.coordinator.money.policy import RESTART_OVERHEAD_S
from nodus.coordinator.money.quote import (ETAG_PURPOSE, THIN_RECORD, Binding, DurationSource, Preview, Shape, Startup,
                                          binding, combine, etag, quote, redo_s)

BOOK = parse(yaml.safe_load((Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml").read_text()))
H100 = BOOK.offering("h100-sxm-80g-x1-us")
SPOT = BOOK.offering("a100-sxm-80g-x8-eu-spot")
NOW = 1_796_000_000.0
FIELDS = {"costUSD", "overheadUSD", "rateUSDPerHour", "holdUSD", "concurrentHoldUSD", "gangHoldUSD",
          "assemblyBoundUSD", "minimumChargeUSD", "placementPreview", "pricebookVersion", "validUntil", "warnings",
          "blockingReasons", "startup"}


def codes(estimate: dict) -> list[str]:
    return [w["code"] for w in estimate["warnings"]]


def test_a_declared_duration_prices_every_field() -> None:
    shape = Shape.of({"expectedDuration": "1h", "completions": 4, "parallelism": 2})
    assert shape.source is DurationSource.DECLARED and shape.duration_s == 3600
    e = quote(BOOK, shape, Preview(H100, "n1: offering h100-sxm-80g-x1-us"), Startup(), NOW)
    assert FIELDS <= set(e)
    # One hour at $2.99 per index, four indexes; no boot measured and never reclaimed. No record of this
    # project's runs: the p90 lets each run take half again as long (quote.UNMEASURED_OVERRUN, $4.485 → $4.49).
    assert e["costUSD"] == {"p50": "11.96", "p90": "17.96"} and e["overheadUSD"] == {"p50": "0.00", "p90": "0.00"}
    assert e["rateUSDPerHour"] == "2.99" and e["pricebookVersion"] == "2026-12-01"
    # A hold covers the next 10 minutes (money/holds.py): $0.4983 → $0.50; two slots start at once.
    assert e["holdUSD"] == "0.50" and e["concurrentHoldUSD"] == "1.00"
    assert e["gangHoldUSD"] == "0.00" and e["assemblyBoundUSD"] == "0.00"
    assert e["minimumChargeUSD"] == "0.25"  # 5 minutes at $2.99/h
    assert e["placementPreview"]["offering"] == "h100-sxm-80g-x1-us" and e["placementPreview"]["explain"]
    assert e["validUntil"] == "2026-11-30T01:08:20Z" and e["blockingReasons"] == []
    assert codes(e) == ["ColdStart"] and e["startup"]["cold"]["message"] == "no measurements"


def test_a_gang_counts_every_member_and_bounds_a_failed_assembly() -> None:
    spec = {"expectedDuration": "30m", "distributed": {"nodes": 4, "startupTimeout": "10m", "maxAssemblyRetries": 1}}
    e = quote(BOOK, Shape.of(spec), Preview(H100, "x"), Startup(), NOW)
    # 4 nodes × 30 min × $2.99/h, each allocation rounded to the cent once ($1.495 → $1.50).
    assert e["costUSD"]["p50"] == "6.00"
    assert e["gangHoldUSD"] == "2.00" and e["concurrentHoldUSD"] == "2.00"  # 4 members' 10-minute holds
    # members × rate × startupTimeout × (maxAssemblyRetries + 1) = 4 × 2.99 × 1/6 h × 2
    assert e["assemblyBoundUSD"] == "3.99" and e["topology"] == "4 nodes"


def test_interruptible_capacity_widens_the_band_and_says_so() -> None:
    e = quote(BOOK, Shape.of({"expectedDuration": "20h"}), Preview(SPOT, "x"), Startup(), NOW)
    p50, p90 = Decimal(e["costUSD"]["p50"]), Decimal(e["costUSD"]["p90"])
    assert p90 > p50 and Decimal(e["overheadUSD"]["p90"]) > 0
    assert "InterruptibleSelected" in codes(e) and e["placementPreview"]["interruptible"] is True


def test_what_a_reclaim_makes_the_run_redo_follows_its_continuity() -> None:
    """A reclaim is a notice: a Checkpointed Job checkpoints in the grace and redoes nothing (the reclaim
    costs its replacement's boot and increments), a Restartable one redoes what its cursor cannot see
    (placement's RESTART_OVERHEAD_S), an Ephemeral one starts over, half way through on average."""
    assert redo_s("Checkpointed", Decimal(7200)) == 0 and redo_s("Ephemeral", Decimal(7200)) == 3600
    assert redo_s("Restartable", Decimal(7200)) == RESTART_OVERHEAD_S

    def band(offering: object, continuity: str | None) -> tuple[Decimal, Decimal]:
        spec: dict = {"expectedDuration": "2h"}
        if continuity:
            spec["recovery"] = {"continuity": continuity}
        e = quote(BOOK, Shape.of(spec), Preview(offering, "x"), Startup(cold=(Decimal(60),)), NOW)
        return Decimal(e["costUSD"]["p50"]), Decimal(e["costUSD"]["p90"])

    kept, cursor, over = band(SPOT, None), band(SPOT, "Restartable"), band(SPOT, "Ephemeral")
    assert band(SPOT, "Checkpointed") == kept, "Checkpointed is the default"
    assert kept[1] < cursor[1] < over[1] and kept[0] <= cursor[0] <= over[0], (kept, cursor, over)
    # a reclaim of a Checkpointed run still costs its replacement's boot and whole increments
    assert kept[1] > Tariff.of(SPOT).charge(Decimal(7200 + 60))
    assert band(H100, "Ephemeral") == band(H100, "Checkpointed"), "on-demand capacity is not reclaimed"


def test_measured_starts_give_a_band_and_are_billed_as_overhead() -> None:
    starts = tuple(Decimal(s) for s in (60, 90, 120, 600))
    e = quote(BOOK, Shape.of({"expectedDuration": "1h"}), Preview(H100, "x"), Startup(cold=starts), NOW)
    assert e["startup"]["cold"] == {"p50": "2m0s", "p90": "10m0s"}
    assert e["startup"]["warm"]["message"] == "no measurements"
    assert "measured starts: 2m0s at p50, 10m0s at p90" in next(w["message"] for w in e["warnings"])
    assert Decimal(e["overheadUSD"]["p50"]) == Decimal("0.10")  # two minutes of boot at $2.99/h


def test_history_stands_in_for_a_missing_duration_and_nothing_gives_a_rate_per_hour() -> None:
    shape = Shape.of({}, history=[Decimal(1800), Decimal(3600), Decimal(7200)])
    assert shape.source is DurationSource.HISTORY and shape.duration_s == 3600
    bare = quote(BOOK, Shape.of({"parallelism": 3, "completions": 3}), Preview(H100, "x"), Startup(), NOW)
    assert "NoDuration" in codes(bare) and bare["costUSD"] == {"p50": "8.97", "p90": "8.97"}  # 3 × $2.99 per hour
    assert "per hour" in next(w["message"] for w in bare["warnings"] if w["code"] == "NoDuration")


def test_the_hold_never_exceeds_the_jobs_own_cap() -> None:
    e = quote(BOOK, Shape.of({"expectedDuration": "10h", "maxCostUSD": "0.30"}), Preview(H100, "x"), Startup(), NOW)
    assert e["holdUSD"] == "0.30"  # 10 minutes would be $0.50


def test_without_a_price_book_nothing_is_priced_and_it_says_so() -> None:
    e = quote(None, Shape.of({"expectedDuration": "1h"}), Preview(None, "n1: the only fitting node"), Startup(), NOW)
    assert e["pricebookVersion"] == "" and e["rateUSDPerHour"] == "" and codes(e) == ["Unpriced"]
    assert e["blockingReasons"] == [] and e["costUSD"] == {"p50": "0.00", "p90": "0.00"}


SIGN = Vault(None, Fernet.generate_key()).signer(ETAG_PURPOSE)  # type: ignore[arg-type]


def test_the_etag_binds_only_this_exact_spec() -> None:
    spec = {"command": ["train"], "expectedDuration": "1h"}
    e = quote(BOOK, Shape.of(spec), Preview(H100, "x"), Startup(), NOW)
    tag = etag(spec, e, SIGN)
    bound = binding(tag, spec, SIGN)
    assert bound == Binding(tag, "2026-12-01", Decimal("2.99")) and bound.max_rate_usd_per_hour == Decimal("3.29")
    assert binding(tag, {**spec, "expectedDuration": "2h"}, SIGN) is None, "another spec"
    assert binding(tag.replace("2.99", "9.99"), spec, SIGN) is None, "a rate the estimate did not quote"
    assert binding('"0123456789abcdef"', spec, SIGN) is None and binding("", spec, SIGN) is None
    unpriced = binding(etag(spec, quote(None, Shape.of(spec), None, Startup(), NOW), SIGN), spec, SIGN)
    assert unpriced is not None and unpriced.max_rate_usd_per_hour is None
    dotted = {"pricebookVersion": "v1.2.3", "rateUSDPerHour": "0.085"}
    assert binding(etag(spec, dotted, SIGN), spec, SIGN) == Binding(etag(spec, dotted, SIGN), "v1.2.3", Decimal("0.085"))
    # A client cannot mint an ETag for a rate it was never quoted: the digest is keyed by the coordinator.
    other = Vault(None, Fernet.generate_key()).signer(ETAG_PURPOSE)  # type: ignore[arg-type]
    forged = etag(spec, {"pricebookVersion": "2026-12-01", "rateUSDPerHour": "0.01"}, other)
    assert binding(forged, spec, SIGN) is None, "an ETag signed with another key is no estimate of ours"


def test_a_sweep_sums_its_cells_and_holds_the_costliest_at_once() -> None:
    shape = Shape.of({"expectedDuration": "1h"})
    h100 = quote(BOOK, shape, Preview(H100, "n1"), Startup(), NOW)
    cpu = quote(BOOK, shape, Preview(BOOK.offering("cpu-2-8g-us"), "n2"), Startup(), NOW)
    e = combine([(h100, 3), (cpu, 3)], max_parallel=4)
    assert e["costUSD"] == {"p50": "9.24", "p90": "13.86"}  # 3 × $2.99 + 3 × $0.09 (an hour at $0.085, rounded);
    # the p90s: 3 × $4.49 + 3 × $0.13 (no record: 1.5 hours each)
    assert e["rateUSDPerHour"] == "2.99" and e["holdUSD"] == "0.50"
    assert e["concurrentHoldUSD"] == "1.51"  # three H100 cells ($0.50) and one CPU cell ($0.01) start at once
    assert e["placementPreview"]["explain"] == "first cell: n1" and codes(e) == ["ColdStart"] * 2


def test_a_warm_node_is_no_cold_start() -> None:
    e = quote(BOOK, Shape.of({"expectedDuration": "1h"}), Preview(H100, "x", warm_reuse=True), Startup(), NOW)
    assert codes(e) == [] and e["placementPreview"]["warmReuse"] is True


def test_a_gang_of_total_gpus_counts_its_resolved_nodes() -> None:
    spec = {"expectedDuration": "1h", "distributed": {"totalGPUs": 16, "gpusPerNode": 8}}
    shape = Shape.of(spec, topology={"nodes": 2, "gpusPerNode": 8, "network": "Colocated"})
    assert shape.members == 2 and shape.topology == "2 nodes × 8 GPUs (Colocated)"
    e = quote(BOOK, shape, Preview(BOOK.offering("h100-sxm-80g-x8-us"), "x"), Startup(), NOW)
    assert e["costUSD"]["p50"] == "47.84" and e["topology"] == "2 nodes × 8 GPUs (Colocated)"  # 2 × $23.92


def test_the_p90_counts_how_much_longer_than_declared_this_projects_jobs_ran() -> None:
    spec = {"expectedDuration": "1h"}
    plain = quote(BOOK, Shape.of(spec), Preview(H100, "x"), Startup(), NOW)
    assert plain["costUSD"] == {"p50": "2.99", "p90": "4.49"}, \
        "no record: the p50 is the declared hour, the p90 lets it run half again as long"
    # A record too short to show its own p90 keeps that floor, however well its runs kept to the word.
    kept = [Decimal("1.000")] * (THIN_RECORD - 1)
    assert quote(BOOK, Shape.of(spec, overruns=kept), Preview(H100, "x"), Startup(), NOW)["costUSD"]["p90"] == "4.49"
    long_enough = quote(BOOK, Shape.of(spec, overruns=[*kept, Decimal(1)]), Preview(H100, "x"), Startup(), NOW)
    assert long_enough["costUSD"] == {"p50": "2.99", "p90": "2.99"}, "a record of THIN_RECORD runs replaces the floor"
    # Nine Jobs ran as said, one took half again as long: the p90 is a run of 1.5 h.
    ratios = [Decimal("1.000")] * 9 + [Decimal("1.500")]
    e = quote(BOOK, Shape.of(spec, overruns=ratios), Preview(H100, "x"), Startup(), NOW)
    assert e["costUSD"] == {"p50": "2.99", "p90": "4.49"}
    faster = quote(BOOK, Shape.of(spec, overruns=[Decimal("0.5")] * 10), Preview(H100, "x"), Startup(), NOW)
    assert faster["costUSD"]["p90"] == "2.99", "a fleet that finishes early never narrows the band below the declared"
    # A duration from history carries its own spread: the median is the p50, the history's p90 the p90.
    history = [Decimal(s) for s in (3000, 3600, 3600, 3600, 5400)]
    h = quote(BOOK, Shape.of({}, history), Preview(H100, "x"), Startup(), NOW)
    assert h["costUSD"] == {"p50": "2.99", "p90": "4.49"}
