"""Prometheus metrics of the coordinator (served at /metrics)."""
from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("nodus_api_requests_total", "API requests by transport, verb, resource and code.",
                   ["transport", "verb", "resource", "code"], registry=REGISTRY)
LATENCY = Histogram("nodus_api_request_duration_seconds", "API request latency by transport and verb.",
                    ["transport", "verb"], registry=REGISTRY,
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))


@functools.lru_cache(maxsize=4096)
def _request_meters(transport: str, verb: str, resource: str, code: str) -> tuple[Counter, Histogram]:
    return REQUESTS.labels(transport, verb, resource, code), LATENCY.labels(transport, verb)


def observe_request(transport: str, verb: str, resource: str, code: str, seconds: float) -> None:
    """Counts an API request and its latency; each label set's children are looked up once (`labels()`, its
    lock and its string checks, cost a GET ~20 µs a request on a loaded host, 8 µs cached)."""
    count, latency = _request_meters(transport, verb, resource, code)
    count.inc()
    latency.observe(seconds)


WATCHERS = Gauge("nodus_api_watchers", "Open watch streams.", ["transport"], registry=REGISTRY)
STORE_REVISION = Gauge("nodus_store_revision", "The store-wide revision.", registry=REGISTRY)
STORE_COMPACTED = Gauge("nodus_store_compacted_revision", "History at or below this revision is gone.",
                        registry=REGISTRY)
STORE_WRITE_LATENCY = Histogram("nodus_store_write_duration_seconds",
                                "Store writes, from submit to durable (or refused), group commit included.",
                                registry=REGISTRY,
                                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
WATCH_LAG = Gauge("nodus_store_watch_lag_revisions",
                  "Revisions committed to the store that this replica's watches (its cache) have not read yet.",
                  registry=REGISTRY)
LEADER = Gauge("nodus_leader", "1 while this replica holds the controllers' lease and runs the controllers.",
               registry=REGISTRY)
LEASE_EPOCH = Gauge("nodus_leader_lease_epoch", "The controllers' lease epoch as this replica last saw it.",
                    registry=REGISTRY)
LEASE_CHANGES = Counter("nodus_leader_lease_changes_total",
                        "Times this replica acquired or lost the controllers' lease.", ["change"], registry=REGISTRY)
