"""What running costs on an offering, in Decimal USD: billing increments, the minimum charge, and a
p50/p90 band for a known duration that counts the expected restarts on interruptible capacity.

Pure: no store, no clock. Admission and the ledger build on it (issue 12, parts 3 and 4).

Rounding, once: an allocation's charge is its rate times its billed seconds, rounded half up to the
cent. The ledger posts per increment as the difference between what is charged through this
increment and through the one before (`charged_through`), so however many increments post, their sum
is the allocation's charge to the cent and no fraction of a cent is lost or counted twice.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Sequence

from .pricebook import Offering

CENT = Decimal("0.01")
SECONDS_PER_HOUR = Decimal(3600)
TAIL = 0.9999
"""Restart counts are summed until this share of their probability is covered (the rest is negligible)."""
MAX_RESTARTS = 1000


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def _ceil(n: Decimal) -> int:
    return int(n.to_integral_value(rounding=ROUND_CEILING))


@dataclass(frozen=True, slots=True)
class Tariff:
    """How one offering charges an allocation."""

    rate_usd_per_hour: Decimal
    billing_increment_s: int
    minimum_charge_s: int

    @classmethod
    def of(cls, offering: Offering) -> Tariff:
        return cls(offering.rate_usd_per_hour, offering.billing_increment_s, offering.minimum_charge_s)

    def billed_seconds(self, seconds: Decimal) -> int:
        """An allocation that lasted `seconds`: every started increment, and at least the minimum."""
        increments = _ceil(max(seconds, Decimal(0)) / self.billing_increment_s)
        return max(increments * self.billing_increment_s, self.minimum_charge_s)

    def price(self, billed_seconds: int) -> Decimal:
        """`billed_seconds` at the rate, to the cent."""
        return cents(self.rate_usd_per_hour * billed_seconds / SECONDS_PER_HOUR)

    def charge(self, seconds: Decimal) -> Decimal:
        """What one allocation of `seconds` costs, to the cent."""
        return self.price(self.billed_seconds(seconds))

    def charged_through(self, increments: int) -> Decimal:
        """What an allocation has been charged once `increments` increments have started (the minimum
        charge covers the first ones); the ledger posts the differences."""
        if increments <= 0:
            return Decimal("0.00")
        return self.charge(Decimal(increments * self.billing_increment_s))

    @property
    def minimum_charge_usd(self) -> Decimal:
        return self.charge(Decimal(0))


@dataclass(frozen=True, slots=True)
class Band:
    """Costs at the median and the 90th percentile."""

    p50: Decimal
    p90: Decimal


def _poisson(mean: float) -> list[float]:
    """P(N = k) for k = 0, 1, … until TAIL of the probability is covered (probabilities are floats:
    they weigh amounts, they are not amounts; each term from logs, so a large mean does not underflow)."""
    if mean <= 0:
        return [1.0]
    log_mean = math.log(mean)
    out: list[float] = []
    total, k = 0.0, 0
    while total < TAIL and k <= MAX_RESTARTS:
        p = math.exp(k * log_mean - mean - math.lgamma(k + 1))
        out.append(p)
        total += p
        k += 1
    return out


def restarts_at(mean: Decimal, q: Decimal) -> int:
    """The number of reclaims not exceeded with probability `q`, when they are Poisson with `mean`."""
    covered = 0.0
    probabilities = _poisson(float(mean))
    for k, p in enumerate(probabilities):
        covered += p
        if covered >= float(q):
            return k
    return len(probabilities) - 1


def _cumulative(outcomes: list[tuple[Decimal, float]]) -> list[tuple[Decimal, float]]:
    """(cost, P(charged <= cost)) for each distinct cost, cheapest first; outcomes are (cost, probability)."""
    total = sum(p for _, p in outcomes)
    merged: dict[Decimal, float] = {}
    for cost, p in outcomes:
        merged[cost] = merged.get(cost, 0.0) + p
    out, covered = [], 0.0
    for cost in sorted(merged):
        covered += merged[cost]
        out.append((cost, covered / total))
    return out


QUANTILE_SLACK = 1e-9
"""Shares are sums of floats: a share of exactly 0.9 may add up to 0.8999999999999999."""


def _quantile(steps: list[tuple[Decimal, float]], q: float) -> Decimal:
    """The smallest cost whose cumulative probability reaches `q` (steps as `_cumulative` gives them)."""
    return next((cost for cost, covered in steps if covered >= q - QUANTILE_SLACK), steps[-1][0])


def _nearest_half(steps: list[tuple[Decimal, float]]) -> Decimal:
    """The p50 of a charge: the cost c for which P(charged <= c) is nearest one half. Charges come in
    whole increments, so the distribution is a staircase and its median (the first step at or past a
    half) can hold far more than half at or below it: one increment may carry a third of the outcomes.
    The step before it is reported when it is nearer a half (a tie goes to the median)."""
    at = next((i for i, (_, covered) in enumerate(steps) if covered >= 0.5 - QUANTILE_SLACK), len(steps) - 1)
    if at > 0 and 0.5 - steps[at - 1][1] < steps[at][1] - 0.5 - QUANTILE_SLACK:
        return steps[at - 1][0]
    return steps[at][0]


def _outcomes(tariff: Tariff, duration_s: Decimal, startup_s: Decimal, interruptions_per_hour: Decimal,
              restart_overhead_s: Decimal, factors: Sequence[Decimal] = ()) -> list[tuple[Decimal, float]]:
    """(cost, probability) per run length and number of reclaims, as `cost_band` describes."""
    if duration_s < 0 or startup_s < 0 or interruptions_per_hour < 0 or restart_overhead_s < 0 or \
            any(f < 0 for f in factors):
        raise ValueError("durations and rates must not be negative")
    weight = 1.0 / len(factors) if factors else 1.0
    increment, minimum = tariff.billing_increment_s, tariff.minimum_charge_s
    # Whole microseconds, rounded up (integer arithmetic: an estimate sums hundreds of outcomes).
    boot_us, redo_us, increment_us = _micros(startup_s), _micros(restart_overhead_s), increment * MICROS
    duration_us, per_us = duration_s * MICROS, float(interruptions_per_hour) / float(SECONDS_PER_HOUR) / MICROS
    billed: dict[int, float] = {}
    """Seconds billed over all allocations -> probability."""
    for run_us in [_ceil(duration_us * f) for f in factors] if factors else [_ceil(duration_us)]:
        reclaims = _poisson(per_us * (run_us + boot_us)) if per_us > 0 else [1.0]
        for restarts, probability in enumerate(reclaims):
            allocations = restarts + 1
            # each allocation boots, then does its even share of the work and of the restarts' redone work
            increments = -(-(boot_us * allocations + run_us + restarts * redo_us) // (allocations * increment_us))
            seconds = max(increments * increment, minimum) * allocations
            billed[seconds] = billed.get(seconds, 0.0) + probability * weight
    return [(tariff.price(seconds), p) for seconds, p in billed.items()]


MICROS = 1_000_000


def _micros(seconds: Decimal) -> int:
    return _ceil(seconds * MICROS)


def cost_band(tariff: Tariff, duration_s: Decimal, *, startup_s: Decimal = Decimal(0),
              interruptions_per_hour: Decimal = Decimal(0), restart_overhead_s: Decimal = Decimal(0),
              factors: Sequence[Decimal] = ()) -> Band:
    """p50/p90 of what work that runs `duration_s` once started, on one node, is charged.

    Both are quantiles of the charge the model below gives (whole increments, the minimum charge, each
    allocation's boot, the reclaims), not the charge of a typical run: the p90 is the smallest charge
    at least 90 % of outcomes stay within, the p50 the one with the share at or below it nearest a half
    (`_nearest_half`).

    The run takes `duration_s` × one of `factors`, each as likely (the spread of this fleet's own record:
    quote.Shape.factors); none: exactly `duration_s`. Each allocation boots for `startup_s` before the
    work runs. On interruptible capacity the number of reclaims over the run is Poisson with mean
    `interruptions_per_hour` × the run's hours; each reclaim ends the allocation (its increments and
    minimum charge apply) and the replacement boots again and redoes `restart_overhead_s` of work
    (restoring, and what ran since the last checkpoint). The work is taken as split evenly between the
    allocations, and the billed seconds are priced once.

    Memoized (`MEMO_SIZE` inputs): the band is a pure function of exactly these arguments, so a repeated
    estimate (the same Job's dry runs, a Sweep's like cells) sums its outcomes once per record and book."""
    return _band(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s, tuple(factors))


MEMO_SIZE = 4096
"""Distinct inputs of `cost_band` and `expected_charge` kept (each entry a Band or an amount and its key:
at most a record's SPREAD_POINTS factors)."""


def clear_memo() -> None:
    """Forgets every memoized band and expected charge (bench/estimate.py times an estimate that misses)."""
    _band.cache_clear()
    _expected.cache_clear()


@functools.lru_cache(maxsize=MEMO_SIZE)
def _band(tariff: Tariff, duration_s: Decimal, startup_s: Decimal, interruptions_per_hour: Decimal,
          restart_overhead_s: Decimal, factors: tuple[Decimal, ...]) -> Band:
    steps = _cumulative(_outcomes(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s, factors))
    return Band(_nearest_half(steps), _quantile(steps, 0.9))


def expected_charge(tariff: Tariff, duration_s: Decimal, *, startup_s: Decimal = Decimal(0),
                    interruptions_per_hour: Decimal = Decimal(0), restart_overhead_s: Decimal = Decimal(0)) -> Decimal:
    """The mean cost over the same outcomes as `cost_band`, to the cent. Placement ranks by it: a p50
    would hide the restarts of a rarely reclaimed offering, the mean counts each at its probability.
    Memoized as `cost_band` is: placement asks it of every fitting offering on every pass."""
    return _expected(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _expected(tariff: Tariff, duration_s: Decimal, startup_s: Decimal, interruptions_per_hour: Decimal,
              restart_overhead_s: Decimal) -> Decimal:
    outcomes = _outcomes(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s)
    total = Decimal(sum(p for _, p in outcomes))
    return cents(sum((c * Decimal(p) for c, p in outcomes), Decimal(0)) / total)
