"""An API request is counted under its transport, verb, resource and code and timed under its transport and
verb (metrics.observe_request, which looks each label set's children up once), as /metrics shows them."""
from __future__ import annotations

from nodus.coordinator.metrics import REGISTRY, observe_request


def test_each_request_is_counted_and_timed_under_its_labels_every_time() -> None:
    labels = {"transport": "rest", "verb": "get", "resource": "unit-test-kind", "code": "200"}
    timed = {"transport": "rest", "verb": "get"}
    count = REGISTRY.get_sample_value("nodus_api_requests_total", labels) or 0.0
    durations = REGISTRY.get_sample_value("nodus_api_request_duration_seconds_count", timed) or 0.0
    fast = REGISTRY.get_sample_value("nodus_api_request_duration_seconds_bucket", {**timed, "le": "0.005"}) or 0.0
    observe_request("rest", "get", "unit-test-kind", "200", 0.003)
    observe_request("rest", "get", "unit-test-kind", "200", 0.3)
    observe_request("rest", "get", "unit-test-kind", "404", 0.001)
    assert REGISTRY.get_sample_value("nodus_api_requests_total", labels) == count + 2
    assert REGISTRY.get_sample_value("nodus_api_requests_total", {**labels, "code": "404"}) == 1.0
    assert REGISTRY.get_sample_value("nodus_api_request_duration_seconds_count", timed) == durations + 3
    assert REGISTRY.get_sample_value("nodus_api_request_duration_seconds_bucket", {**timed, "le": "0.005"}) == fast + 2
