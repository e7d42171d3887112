"""What running costs on an offering, in Decimal USD: billing increments, the minimum charge, and a
p50/p90 band for a known duration that counts the expected restarts on interruptible capacity.

Pure: no store, no clock. Admission and the ledger build on it (issue 12, parts 3 and 4).

Rounding, once: an allocation's charge is its rate times its billed seconds, rounded half up to the
cent. The ledger posts per increment as the difference between what is charged through this
increment and through the one before (`charged_through`), so however many increments post, their sum
is the allocation's charge to the cent and no fraction of a cent is lost or counted twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from .pricebook import Offering

CENT = Decimal("0.01")
SECONDS_PER_HOUR = Decimal(3600)
TAIL = Decimal("0.9999")
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


def _poisson(mean: Decimal) -> list[Decimal]:
    """P(N = k) for k = 0, 1, … until TAIL of the probability is covered."""
    p = (-mean).exp()
    out, total, k = [p], p, 0
    while total < TAIL and k < MAX_RESTARTS:
        k += 1
        p = p * mean / k
        out.append(p)
        total += p
    return out


def restarts_at(mean: Decimal, q: Decimal) -> int:
    """The number of reclaims not exceeded with probability `q`, when they are Poisson with `mean`."""
    covered = Decimal(0)
    probabilities = _poisson(mean)
    for k, p in enumerate(probabilities):
        covered += p
        if covered >= q:
            return k
    return len(probabilities) - 1


def _quantile(outcomes: list[tuple[Decimal, Decimal]], q: Decimal) -> Decimal:
    """The smallest cost whose cumulative probability reaches `q`; outcomes are (cost, probability)."""
    covered = Decimal(0)
    total = sum((p for _, p in outcomes), Decimal(0))
    for cost, p in sorted(outcomes):
        covered += p
        if covered >= q * total:
            return cost
    return max(c for c, _ in outcomes)


def _outcomes(tariff: Tariff, duration_s: Decimal, startup_s: Decimal, interruptions_per_hour: Decimal,
              restart_overhead_s: Decimal) -> list[tuple[Decimal, Decimal]]:
    """(cost, probability) per number of reclaims, as `cost_band` describes."""
    if duration_s < 0 or startup_s < 0 or interruptions_per_hour < 0 or restart_overhead_s < 0:
        raise ValueError("durations and rates must not be negative")
    mean = interruptions_per_hour * (duration_s + startup_s) / SECONDS_PER_HOUR
    outcomes = []
    for restarts, probability in enumerate(_poisson(mean)):
        allocations = restarts + 1
        working = duration_s + restarts * restart_overhead_s
        per_allocation = startup_s + working / allocations
        outcomes.append((tariff.price(tariff.billed_seconds(per_allocation) * allocations), probability))
    return outcomes


def cost_band(tariff: Tariff, duration_s: Decimal, *, startup_s: Decimal = Decimal(0),
              interruptions_per_hour: Decimal = Decimal(0), restart_overhead_s: Decimal = Decimal(0)) -> Band:
    """p50/p90 cost of work that runs `duration_s` once started, on one node.

    Each allocation boots for `startup_s` before the work runs. On interruptible capacity the number of
    reclaims over the run is Poisson with mean `interruptions_per_hour` × the run's hours; each reclaim
    ends the allocation (its increments and minimum charge apply) and the replacement boots again and
    redoes `restart_overhead_s` of work (restoring, and what ran since the last checkpoint). The work is
    taken as split evenly between the allocations, and the billed seconds are priced once."""
    outcomes = _outcomes(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s)
    return Band(_quantile(outcomes, Decimal("0.5")), _quantile(outcomes, Decimal("0.9")))


def expected_charge(tariff: Tariff, duration_s: Decimal, *, startup_s: Decimal = Decimal(0),
                    interruptions_per_hour: Decimal = Decimal(0), restart_overhead_s: Decimal = Decimal(0)) -> Decimal:
    """The mean cost over the same outcomes as `cost_band`, to the cent. Placement ranks by it: a p50
    would hide the restarts of a rarely reclaimed offering, the mean counts each at its probability."""
    outcomes = _outcomes(tariff, duration_s, startup_s, interruptions_per_hour, restart_overhead_s)
    total = sum((p for _, p in outcomes), Decimal(0))
    return cents(sum((c * p for c, p in outcomes), Decimal(0)) / total)
