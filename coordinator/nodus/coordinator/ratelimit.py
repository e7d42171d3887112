"""Per-token rate limits: a token bucket per bearer token (docs/adr/0046-tokens-rate-limits-audit.md).

Each token may send `rate` requests a second on average and `burst` at once; a request over that
is refused with TooManyRequests (429 on REST with `Retry-After`, RESOURCE_EXHAUSTED with a RetryInfo
on gRPC) saying how long until one more fits. kubectl and client-go wait that long and retry by
themselves. Operator tokens (admin of every project) are exempt unless asked, as kube-apiserver's
priority and fairness exempts system:masters.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import NodusError

DEFAULT_RATE = 100.0
"""Requests a second each token may send on average."""
DEFAULT_BURST = 200
"""Requests a token may send at once (kubectl's discovery of a cold cache is about 10)."""
_MAX_BUCKETS = 100_000


@dataclass(frozen=True, slots=True)
class RateSettings:
    rate: float = DEFAULT_RATE
    """0 turns the limits off."""
    burst: int = DEFAULT_BURST
    operators: bool = False
    """Whether operator tokens (admin of every project) are limited too."""

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"--rate-limit must not be negative (got {self.rate})")
        if self.rate > 0 and self.burst < 1:
            raise ValueError(f"--rate-burst must be at least 1 (got {self.burst})")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


@dataclass(slots=True)
class TokenBuckets:
    """One bucket per key (a token id), refilled at `settings.rate` up to `settings.burst`."""

    settings: RateSettings = field(default_factory=RateSettings)
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def wait(self, key: str) -> float:
        """Takes one request from `key`'s bucket: 0 when it fits, else the seconds until one would."""
        rate, burst = self.settings.rate, float(self.settings.burst)
        if rate <= 0:
            return 0.0
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= _MAX_BUCKETS:  # idle buckets are full ones: forgetting them is exact
                self._buckets = {k: b for k, b in self._buckets.items()
                                 if b.tokens + (now - b.stamp) * rate < burst}
            bucket = self._buckets[key] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / rate

    def take(self, key: str, subject: str) -> None:
        """Raises TooManyRequests (with the whole seconds to wait) when `key` is over its limit."""
        wait = self.wait(key)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise NodusError(
                "TooManyRequests",
                f'token "{key}" ({subject}) sent more than {self.settings.burst} requests at once or '
                f"{self.settings.rate:g} a second; retry after {seconds}s",
                fix=f"wait {seconds}s (Retry-After) and send it again; kubectl and client-go do so by themselves. "
                    "An operator raises the limits with --rate-limit and --rate-burst",
                retry_after=seconds, name=key, kind="tokens")
