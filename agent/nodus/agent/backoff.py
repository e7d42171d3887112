"""Exponential backoff with jitter while the coordinator is away."""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Delays grow base·2ⁿ up to `cap`; each is drawn from [d/2, d] so agents do not reconnect in step."""

    base: float = 0.2
    cap: float = 10.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        self.failures += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0
