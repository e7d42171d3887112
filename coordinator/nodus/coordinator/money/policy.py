"""Placement's money rules, pure: which offerings a Job's placement policy allows, and how its
profile ranks the rest (the scheduler applies them when a price book is active).

Filters, each refusal in the customer's words and naming the field:
- `placement.maxRateUSDPerHour`: the offering's customer rate (for the whole node) must not be above
  it; a node sold as no offering of the active book has no rate, so it is refused when this is set.
- `placement.interruptible`: Never (the default) refuses every interruptible offering; Prefer ranks
  interruptible offerings before the others, then by profile; Allow leaves it to the profile, whose
  expected cost and time count the expected restarts.

What an offering is expected to do for the Job (`Outlook`): `expectedDuration` is read as the run's
time on the reference accelerator (relativeSpeed 1), so on an offering of speed s it runs
duration / s. Reclaims are Poisson at the offering's interruptionsPerHour; each one costs
RESTART_OVERHEAD_S (a new node's boot, the restore, the work since the last checkpoint) in time and in
billed allocations. With `expectedDuration` the cost is `estimate.expected_charge` (increments, the
minimum charge, the restarts); without one offerings are compared on one hour of reference work at
their rate, restarts included, and the explanation says "per hour of work".

Profiles rank outlooks (`score`: the highest tuple wins):
- Cost: least expected cost, then earliest completion.
- Speed: earliest expected completion, then least cost.
- Balanced (the default, as spec/job.md's schema in api/job.py says): least expected cost × expected
  completion time. The product compares ratios, so an offering twice as fast wins when it costs less
  than twice as much, whatever the units; equal products go to the cheaper one.
A node sold as no offering of the book ranks after every priced one: its cost is unknown.

`completeByTime` (with `expectedDuration`) steers towards Speed: when the profile's choice would, at
the 90th percentile of its reclaims, finish after it, placement ranks by Speed instead and says so.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from ..api import units
from .estimate import SECONDS_PER_HOUR, Tariff, cents, expected_charge, restarts_at
from .estimate import clear_memo as clear_estimate_memo
from .pricebook import Offering

RESTART_OVERHEAD_S = Decimal(600)
"""Time one reclaim adds to a run: the replacement's boot, its restore and the work redone since the
last checkpoint (10 minutes, until the fleet's measured restore times replace it)."""
REFERENCE_WORK_S = SECONDS_PER_HOUR
"""Without expectedDuration offerings are compared on one hour of work on the reference accelerator."""


class Interruptible(enum.Enum):
    """`placement.interruptible`: may the Job run on capacity that can be reclaimed?"""

    NEVER = "Never"
    """Never on an interruptible offering (the default)."""
    ALLOW = "Allow"
    """Where its expected cost and time, restarts included, win under the profile."""
    PREFER = "Prefer"
    """Interruptible offerings first; others only when no interruptible one fits."""


class Profile(enum.Enum):
    """`placement.profile`: what placement optimizes among the offerings that pass the filters."""

    COST = "Cost"
    """Least expected total cost."""
    SPEED = "Speed"
    """Earliest expected completion."""
    BALANCED = "Balanced"
    """Least expected cost × expected completion time (the default)."""


def _enum(kind: type[enum.Enum], value: Any, default: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class Policy:
    """A Job's placement policy, as placement reads it."""

    interruptible: Interruptible = Interruptible.NEVER
    max_rate_usd_per_hour: Decimal | None = None
    profile: Profile = Profile.BALANCED
    duration_s: Decimal | None = None
    """spec.expectedDuration, on the reference accelerator; None when the Job declares none."""
    complete_within_s: Decimal | None = None
    """Seconds from the placement until spec.completeByTime; None when the Job sets none."""
    bound_usd_per_hour: Decimal | None = None
    """The rate bound of the estimate a create with If-Match was bound to (its rate plus 10 %)."""

    @classmethod
    def of(cls, placement: Mapping[str, Any] | None, expected_duration: str | None = None,
           complete_within_s: Decimal | None = None) -> Policy:
        """The policy of a Job's `placement`, `expectedDuration` and time left until `completeByTime`.
        Admission has validated them; a value that still does not read (an object stored before a
        field existed) counts as unset."""
        placement = placement or {}
        rate: Decimal | None = None
        try:
            if placement.get("maxRateUSDPerHour") not in (None, ""):
                rate = units.parse_money(placement["maxRateUSDPerHour"])
        except ValueError:
            rate = None
        duration: Decimal | None = None
        try:
            if expected_duration:
                duration = Decimal(units.parse_duration_ns(expected_duration)) / units.NS_PER_SECOND
        except (ValueError, InvalidOperation):
            duration = None
        return cls(_enum(Interruptible, placement.get("interruptible"), Interruptible.NEVER), rate,
                   _enum(Profile, placement.get("profile"), Profile.BALANCED), duration, complete_within_s)


def _usd(amount: Decimal) -> str:
    return "$" + units.format_money(amount)


def refusal(policy: Policy, offering: Offering | None, offering_id: str) -> str | None:
    """Why `policy` refuses a node sold as `offering` (None: the book does not sell `offering_id`),
    or None when it may be placed there."""
    limit = policy.max_rate_usd_per_hour
    if offering is None:
        if limit is None:
            return None  # a bound estimate was quoted on a priced offering; an unpriced node charges nothing
        sold = f"offering {offering_id} is not in the active price book" if offering_id else "it is sold as no offering"
        return f"{sold}, so it has no rate to hold to placement.maxRateUSDPerHour {_usd(limit)}"
    if offering.interruptible and policy.interruptible is Interruptible.NEVER:
        return f"offering {offering.id} is interruptible and placement.interruptible is Never"
    if limit is not None and offering.rate_usd_per_hour > limit:
        return (f"offering {offering.id} costs {_usd(offering.rate_usd_per_hour)}/h, above "
                f"placement.maxRateUSDPerHour {_usd(limit)}")
    bound = policy.bound_usd_per_hour
    if bound is not None and offering.rate_usd_per_hour > bound:
        return (f"offering {offering.id} costs {_usd(offering.rate_usd_per_hour)}/h, above {_usd(bound)}, the "
                "estimate this Job was created with (If-Match) plus 10 %")
    return None


@dataclass(frozen=True, slots=True)
class Outlook:
    """What running the Job on one offering is expected to cost and take."""

    offering: Offering
    cost_usd: Decimal
    """The whole run's expected cost; per hour of reference work when `per_hour`."""
    hours: Decimal
    """Expected hours until it completes, restarts included; per hour of reference work when `per_hour`."""
    per_hour: bool
    """The Job declares no expectedDuration."""
    hours_p90: Decimal = Decimal(0)
    """Hours until it completes at the 90th percentile of its reclaims."""


def outlook(policy: Policy, offering: Offering) -> Outlook:
    """What running the Job `policy` describes on `offering` is expected to cost and take. It reads
    only the declared duration, so it is memoized on that and the offering (one entry per offering of
    a price book version and duration: placement asks it of every fitting offering on every pass)."""
    return _outlook(policy.duration_s, offering)


def clear_memo() -> None:
    """Forgets every memoized outlook, and the bands and charges they and the estimates are built from."""
    _outlook.cache_clear()
    clear_estimate_memo()


@functools.lru_cache(maxsize=4096)
def _outlook(duration_s: Decimal | None, offering: Offering) -> Outlook:
    work_s = duration_s if duration_s is not None else REFERENCE_WORK_S
    run_s = work_s / offering.relative_speed
    per_hour = offering.interruptions_per_hour
    restarts = per_hour * run_s / SECONDS_PER_HOUR
    hours = (run_s + restarts * RESTART_OVERHEAD_S) / SECONDS_PER_HOUR
    if duration_s is None:
        cost = offering.rate_usd_per_hour * hours  # unrounded: a cent apart is still apart
    else:
        cost = expected_charge(Tariff.of(offering), run_s, interruptions_per_hour=per_hour,
                               restart_overhead_s=RESTART_OVERHEAD_S)
    p90 = (run_s + restarts_at(restarts, Decimal("0.9")) * RESTART_OVERHEAD_S) / SECONDS_PER_HOUR
    return Outlook(offering, cost, hours, duration_s is None, p90)


def late(policy: Policy, look: Outlook | None) -> str:
    """Why completeByTime overrides the profile for this choice ("" when it does not): the choice would
    finish after it at p90. Only with expectedDuration, since only then is there a finish time."""
    if (look is None or look.per_hour or policy.complete_within_s is None or policy.profile is Profile.SPEED
            or look.hours_p90 * SECONDS_PER_HOUR <= policy.complete_within_s):
        return ""
    left = max(policy.complete_within_s, Decimal(0)) / SECONDS_PER_HOUR
    return (f"completeByTime is in {_hours(left)} and {policy.profile.value}'s choice, offering {look.offering.id}, "
            f"would finish in {_hours(look.hours_p90)} at p90, so ranked by Speed")


def score(policy: Policy, look: Outlook | None) -> tuple[Decimal, ...]:
    """Ranks an outlook under `policy`; the highest tuple wins. None (an unpriced node) loses to any."""
    if look is None:
        return (Decimal(0), Decimal(0), Decimal(0), Decimal(0))
    first = Decimal(1 if policy.interruptible is Interruptible.PREFER and look.offering.interruptible else 0)
    if policy.profile is Profile.COST:
        keys = (-look.cost_usd, -look.hours)
    elif policy.profile is Profile.SPEED:
        keys = (-look.hours, -look.cost_usd)
    else:
        keys = (-look.cost_usd * look.hours, -look.cost_usd)
    return (Decimal(1), first, *keys)


def _hours(h: Decimal) -> str:
    return f"{h.quantize(Decimal('0.01'))}h"


def describe(look: Outlook) -> str:
    """`offering l4-24g-x1-eu ($0.85/h): expected $1.42 and 1.67h`, in the customer's words."""
    o = look.offering
    spot = ", interruptible" if o.interruptible else ""
    if look.per_hour:
        return (f"offering {o.id} ({_usd(o.rate_usd_per_hour)}/h{spot}): expected {_usd(cents(look.cost_usd))} and "
                f"{_hours(look.hours)} per hour of work")
    return f"offering {o.id} ({_usd(o.rate_usd_per_hour)}/h{spot}): expected {_usd(look.cost_usd)} and " \
           f"{_hours(look.hours)}"


WON = {Profile.COST: "the least expected cost", Profile.SPEED: "the earliest expected completion",
       Profile.BALANCED: "the least expected cost × time"}
"""How the chosen offering won, per profile."""


def lost(policy: Policy, best: Outlook, other: Outlook) -> str:
    """Why `other` lost to `best`, in the customer's words."""
    if (policy.interruptible is Interruptible.PREFER and best.offering.interruptible
            and not other.offering.interruptible):
        return f"{describe(other)}; placement.interruptible is Prefer and it is not interruptible"
    if policy.profile is Profile.SPEED and other.hours != best.hours:
        return f"{describe(other)}; {_hours(other.hours - best.hours)} later"
    if policy.profile is Profile.BALANCED and other.cost_usd * other.hours != best.cost_usd * best.hours:
        ratio = (other.cost_usd * other.hours) / (best.cost_usd * best.hours) if best.cost_usd * best.hours else None
        times = f"{ratio.quantize(Decimal('0.01'))}× " if ratio is not None else ""
        return f"{describe(other)}; cost × time {times}the chosen"
    if other.cost_usd != best.cost_usd:
        return f"{describe(other)}; {_usd(cents(other.cost_usd - best.cost_usd))} more"
    return f"{describe(other)}; the same outlook, and the chosen node has more room free or comes first by name"
