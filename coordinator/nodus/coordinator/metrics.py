"""Prometheus metrics of the coordinator (served at /metrics)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("nodus_api_requests_total", "API requests by transport, verb, resource and code.",
                   ["transport", "verb", "resource", "code"], registry=REGISTRY)
LATENCY = Histogram("nodus_api_request_duration_seconds", "API request latency by transport and verb.",
                    ["transport", "verb"], registry=REGISTRY,
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
WATCHERS = Gauge("nodus_api_watchers", "Open watch streams.", ["transport"], registry=REGISTRY)
STORE_REVISION = Gauge("nodus_store_revision", "The store-wide revision.", registry=REGISTRY)
STORE_COMPACTED = Gauge("nodus_store_compacted_revision", "History at or below this revision is gone.",
                        registry=REGISTRY)
