"""The p50 and p90 of an estimate are quantiles of the charge the estimator models (whole increments,
the minimum charge, each allocation's boot, the reclaims, and the run's spread from this fleet's own
record): the p90 the smallest charge at least 90 % of outcomes stay within, the p50 the charge with the
share at or below it nearest a half. Under the bench's model of users' guesses (the actual run is the
guess times a log-normal factor) a record of earlier runs makes the p50 calibrated, which the true
median of the charge is not: a whole increment can hold a third of the outcomes."""
from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodus.coordinator.money.estimate import Tariff, _cumulative, _outcomes, cost_band
from nodus.coordinator.money.pricebook import PriceBook, parse
from nodus.coordinator.money import quote as quote_module
from nodus.coordinator.money.quote import SPREAD_POINTS, Preview, Shape, Startup, quote, spread

BY_THE_MINUTE = Tariff(Decimal("2.20"), 60, 60)  # bench/estimate.py's on-demand offering
BOOT = Decimal(5)


def share_at_or_below(tariff: Tariff, run_s: Decimal, factors: tuple[Decimal, ...], cost: Decimal,
                      startup_s: Decimal = BOOT) -> float:
    steps = _cumulative(_outcomes(tariff, run_s, startup_s, Decimal(0), Decimal(0), factors))
    return max((covered for c, covered in steps if c <= cost), default=0.0)


def test_the_p50_is_the_charge_with_a_share_nearest_a_half_not_the_median_increment() -> None:
    # Ten earlier runs of this project against their guesses; the next is a 6-minute guess.
    record = tuple(Decimal(r) for r in ("0.80", "0.88", "0.93", "0.97", "0.99", "1.02", "1.06", "1.12", "1.25", "1.45"))
    factors = Shape.of({"expectedDuration": "6m"}, overruns=record).factors
    band = cost_band(BY_THE_MINUTE, Decimal(360), startup_s=BOOT, factors=factors)
    # 6 minutes of work and 5 s of boot bill 7 minutes when the run is exact: 0.26, the charge's median,
    # with 9 of 12 outcomes at or below it (the record, the declaration as one run, the largest twice);
    # 6 minutes (0.22) has 4 of 12, nearer a half.
    assert band.p50 == Decimal("0.22") and BY_THE_MINUTE.charge(Decimal(365)) == Decimal("0.26")
    assert share_at_or_below(BY_THE_MINUTE, Decimal(360), factors, Decimal("0.22")) == pytest.approx(4 / 12)
    assert share_at_or_below(BY_THE_MINUTE, Decimal(360), factors, Decimal("0.26")) == pytest.approx(9 / 12)
    # the p90: the largest run seen (1.45 × 6 min + boot: 9 minutes), as 10 of 12 stay within 8 minutes
    assert band.p90 == BY_THE_MINUTE.charge(Decimal("527"))


def test_without_a_record_the_run_is_as_declared_and_the_band_is_its_charge() -> None:
    band = cost_band(BY_THE_MINUTE, Decimal(360), startup_s=BOOT)
    assert band.p50 == band.p90 == BY_THE_MINUTE.charge(Decimal(365))
    assert Shape.of({"expectedDuration": "6m"}).factors == ()


def test_a_record_is_its_order_statistics_and_its_largest_once_more() -> None:
    assert spread([]) == ()
    assert spread([Decimal("1.2"), Decimal("0.9")]) == (Decimal("0.9"), Decimal("1.2"), Decimal("1.2"))
    long = [Decimal(i) / 1000 for i in range(1, 5001)]
    thinned = spread(long)
    assert len(thinned) == SPREAD_POINTS and thinned == tuple(sorted(thinned)) and thinned[-1] == thinned[-2]
    assert Decimal("0.9") < thinned[-1] <= Decimal(5) and thinned[0] < Decimal("0.1"), "evenly spaced ranks"
    declared = Shape.of({"expectedDuration": "10m"}, overruns=[Decimal("1.5"), Decimal("0.5")])
    assert declared.factors == (Decimal("0.5"), Decimal(1), Decimal("1.5"), Decimal("1.5")), \
        "the declaration counts as one run of the record"
    history = Shape.of({}, history=[Decimal(600), Decimal(1200), Decimal(300)])
    assert history.duration_s == 600 and history.factors == (Decimal("0.5"), Decimal(1), Decimal(2), Decimal(2))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.sampled_from([1, 30, 60, 300]), st.sampled_from([0, 60, 300]),
       st.lists(st.decimals(min_value=Decimal("0.2"), max_value=Decimal("3"), places=2), min_size=0, max_size=40),
       st.decimals(min_value=Decimal(0), max_value=Decimal("0.5"), places=2))
def test_p50_and_p90_are_quantiles_of_the_modelled_charge(minutes: int, increment: int, minimum: int,
                                                          record: list[Decimal], reclaims: Decimal) -> None:
    tariff = Tariff(Decimal("3.00"), increment, minimum)
    run_s, factors = Decimal(60 * minutes), spread(record)
    outcomes = _outcomes(tariff, run_s, BOOT, reclaims, Decimal(600), factors)
    band = cost_band(tariff, run_s, startup_s=BOOT, interruptions_per_hour=reclaims,
                     restart_overhead_s=Decimal(600), factors=factors)
    steps = _cumulative(outcomes)
    costs = [c for c, _ in steps]
    share = dict(steps)
    assert band.p50 in share and band.p90 in share and band.p50 <= band.p90
    assert all(abs(share[band.p50] - 0.5) <= abs(covered - 0.5) + 1e-9 for _, covered in steps), \
        "no charge the model gives has a share at or below it nearer a half"
    assert share[band.p90] >= 0.9 - 1e-9
    below = [c for c in costs if c < band.p90]
    assert not below or share[below[-1]] < 0.9 - 1e-9, "the p90 is the smallest charge that covers 90 %"


def test_under_log_normal_guesses_a_record_calibrates_the_p50() -> None:
    """bench/estimate.py's users, without its daemons: a guess of whole minutes, the run the guess times
    a log-normal factor (median 1, sigma 0.3), the estimate from the 30 runs before it. The share of
    actual charges at or below the p50 lands in 40-60 %; at or below the charge's true median it would not."""
    rng = random.Random(7)
    record: list[Decimal] = [Decimal(str(round(math.exp(rng.gauss(0, 0.3)), 3))) for _ in range(30)]
    at_p50 = at_median = at_p90 = 0
    trials = 400
    for _ in range(trials):
        guess = Decimal(60 * rng.choice((3, 4, 5, 6, 8, 10, 12)))
        factor = Decimal(str(round(math.exp(rng.gauss(0, 0.3)), 3)))
        actual = BY_THE_MINUTE.charge(BOOT + guess * factor)
        factors = Shape.of({"expectedDuration": "1m"}, overruns=record[-30:]).factors
        band = cost_band(BY_THE_MINUTE, guess, startup_s=BOOT, factors=factors)
        steps = _cumulative(_outcomes(BY_THE_MINUTE, guess, BOOT, Decimal(0), Decimal(0), factors))
        median = next(c for c, covered in steps if covered >= 0.5)
        at_p50 += actual <= band.p50
        at_median += actual <= median
        at_p90 += actual <= band.p90
        record.append(factor)
    assert 0.40 <= at_p50 / trials <= 0.60, at_p50
    assert at_median / trials > 0.60, "the charge's true median holds well over half at or below it"
    assert at_p90 / trials >= 0.88, at_p90


def _bench_book() -> PriceBook:
    """bench/estimate.py's accuracy book: a simulated A100 by the minute (at least one), interruptible at
    $1.10/h reclaimed 4 times an hour, or on demand at $2.20/h."""
    def offering(oid: str, rate: str, spot: bool) -> dict[str, object]:
        o: dict[str, object] = {
            "id": oid, "accelerator": {"id": "nvidia-a100-sxm-80g", "family": "A100", "gpusPerNode": 1,
                                       "memory": "80Gi", "interconnect": "PCIe"},
            "vcpu": 1, "memory": "1Gi", "disk": "1Gi", "regionClass": "us", "provider": "dev", "region": "local",
            "rateUSDPerHour": rate, "interruptible": spot, "billingIncrement": "60s", "minimumCharge": "1m",
            "relativeSpeed": "1"}
        if spot:
            o["interruptionsPerHour"] = "4"
        return o
    return parse({"pricebookVersion": "bench-accuracy", "storageUSDPerGiBMonth": "0.08", "offerings": [offering("spot", "1.10", True),
                                                                       offering("on-demand", "2.20", False)]})


def _bench_run(seed: int, book: PriceBook, continuity: str, at_once: int = 4) -> dict[bool, tuple[int, int, int]]:
    """One bench/estimate.py run of 30 Jobs without its daemons, from an empty record: every other Job on
    the interruptible offering; the run is the guess times a log-normal factor (sigma 0.3); a reclaim
    comes after an exponential time of running at the book's rate, and, as NodeService.Reclaim does, the
    attempt checkpoints in its grace and a replacement (5 s of boot and restore) goes on from there; each
    allocation is charged its boot, its share of the work and 3 s of teardown. Each Job is estimated
    through `quote` with the record of the Jobs before it and the boots measured so far, except that the
    first `at_once` (the bench's four nodes) are all created before any has finished or started.
    Returns, per interruptible or not, (Jobs whose charge is at or below their p50, at or below their
    p90, Jobs)."""
    rng = random.Random(seed)
    boot, teardown = 5.0, 3.0
    record: list[Decimal] = []
    starts: dict[bool, list[Decimal]] = {True: [], False: []}
    out = {True: (0, 0, 0), False: (0, 0, 0)}
    for j in range(30):
        spot = j % 2 == 0
        offering = book.offering("spot" if spot else "on-demand")
        assert offering is not None
        guess = 60 * rng.choice((3, 4, 5, 6, 8, 10, 12))
        left = work = guess * math.exp(rng.gauss(0, 0.3))
        allocations: list[float] = []
        while True:
            ran = rng.expovariate(4 / 3600) if spot else math.inf
            if ran >= left:
                allocations.append(boot + left + teardown)
                break
            allocations.append(boot + ran + teardown)
            left -= ran
        charged = sum((Tariff.of(offering).charge(Decimal(str(round(s, 3)))) for s in allocations), Decimal(0))
        spec = {"expectedDuration": f"{guess // 60}m", "recovery": {"continuity": continuity}}
        first = j < at_once
        e = quote(book, Shape.of(spec, overruns=[] if first else record), Preview(offering, ""),
                  Startup(cold=() if first else tuple(starts[spot])), 0.0)
        at50, at90, of = out[spot]
        out[spot] = (at50 + (charged <= Decimal(e["costUSD"]["p50"])), at90 + (charged <= Decimal(e["costUSD"]["p90"])),
                     of + 1)
        starts[spot] += [Decimal(str(boot))] * len(allocations)
        record.append(Decimal(str(round((work + (len(allocations) - 1) * boot) / guess, 3))))
    return out


def test_over_the_benchs_whole_run_about_half_the_charges_fall_at_or_below_the_p50() -> None:
    """The bench's 30 Jobs from an empty record (the first ones quoted as declared), over 60 seeded runs:
    about half the charges at or below the p50, on demand and on interruptible capacity alike. Placement's
    10-minute redo per reclaim in the estimate (what a Restartable Job is quoted) put two thirds of the
    interruptible charges at or below it, the bias that bench/results/estimate.txt showed."""
    book = _bench_book()
    runs = [_bench_run(seed, book, "Checkpointed") for seed in range(60)]
    for spot in (True, False):
        share = sum(r[spot][0] for r in runs) / sum(r[spot][2] for r in runs)
        assert 0.44 <= share <= 0.58, (spot, share)
    constant = [_bench_run(seed, book, "Restartable") for seed in range(60)]
    assert sum(r[True][0] for r in constant) / sum(r[True][2] for r in constant) > 0.62


def _p90_share(runs: list[dict[bool, tuple[int, int, int]]]) -> float:
    return sum(r[k][1] for r in runs for k in (True, False)) / sum(r[k][2] for r in runs for k in (True, False))


def test_over_the_benchs_whole_run_nine_in_ten_charges_fall_at_or_below_the_p90(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same runs' p90s: at least 90 % of the charges at or below them, the project's first Jobs (quoted
    with no record, four at once) included. Without the floor a thin record puts under the p90 (a record
    too short to show its own 90th percentile, quote.THIN_RECORD) those first Jobs' p90 is the run as
    declared, which half of them exceed, and the run as a whole falls short of 90 %."""
    book = _bench_book()
    assert _p90_share([_bench_run(seed, book, "Checkpointed") for seed in range(60)]) >= 0.90
    monkeypatch.setattr(quote_module, "UNMEASURED_OVERRUN", Decimal(1))
    assert _p90_share([_bench_run(seed, book, "Checkpointed") for seed in range(60)]) < 0.89
