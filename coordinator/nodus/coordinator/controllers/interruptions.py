"""How often each offering loses its capacity, for the `auto` checkpoint cadence (Young–Daly).

An offering's mean time between interruptions is measured on the attempts that ran on it
(controllers/checkpoints.py `offering_mtbi`); that reads every attempt in the cache, so each
offering's figure is kept for a minute, which is nothing next to a cadence of 1m-6h.
"""
from __future__ import annotations

from ..clock import Clock
from .cache import Cache
from .checkpoints import offering_mtbi

TTL = 60.0


class Interruptions:
    def __init__(self, cache: Cache, clock: Clock, ttl: float = TTL) -> None:
        self.cache, self.clock, self.ttl = cache, clock, ttl
        self._memo: dict[str, tuple[float, float]] = {}

    def of_offering(self, offering: str) -> float | None:
        """The MTBI of `offering` (an AttemptView's); None for "" (not placed yet)."""
        if not offering:
            return None
        now = self.clock.now()
        hit = self._memo.get(offering)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = offering_mtbi(self.cache.attempts(), offering, now)
        self._memo[offering] = (now, value)
        return value
