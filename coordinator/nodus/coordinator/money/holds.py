"""How large a hold is: the one rule placement, the money controller and the estimate's holdUSD share.

A hold covers HOLD_AHEAD_S of billing ahead (in whole increments, at least the minimum charge) and
never more than what the object's maxCostUSD leaves; it is renewed as it is used
(controllers/billing.py).
"""
from __future__ import annotations

from decimal import Decimal

from .estimate import CENT, Tariff

HOLD_AHEAD_S = 600
"""A hold covers this much billing ahead (rounded up to whole increments)."""


def step(tariff: Tariff) -> Decimal:
    """One billing increment at `tariff`."""
    return tariff.price(tariff.billing_increment_s)


def ahead(tariff: Tariff) -> Decimal:
    """What HOLD_AHEAD_S of billing costs, in whole increments."""
    increments = -(-HOLD_AHEAD_S // tariff.billing_increment_s)
    return tariff.price(increments * tariff.billing_increment_s)


def first_hold(tariff: Tariff, spent: Decimal, max_cost: Decimal | None) -> Decimal:
    """The hold taken before an attempt is bound to capacity at `tariff`: the minimum charge and
    HOLD_AHEAD_S of billing (at least a cent), never more than what maxCostUSD leaves after `spent`
    (0: nothing left)."""
    amount = max(tariff.charged_through(1), ahead(tariff), CENT)  # a hold is at least a cent
    if max_cost is not None:
        amount = min(amount, max(max_cost - spent, Decimal("0.00")))
    return amount


def restart_need(tariff: Tariff) -> Decimal:
    """What a new start at `tariff` needs below the cap: its first increment (with the minimum
    charge) and one more for its final checkpoint and teardown."""
    return tariff.charged_through(1) + step(tariff)
