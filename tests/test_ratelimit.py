"""Per-token rate limits through the real daemon: a burst above the limit answers 429 with
Retry-After and a TooManyRequests Status, the real kubectl waits and retries by itself, gRPC answers
RESOURCE_EXHAUSTED with a RetryInfo; operator tokens are exempt (docs/adr/0046-tokens-rate-limits-audit.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import Coordinator
from nodus.coordinator.errors import NodusError
from nodus.coordinator.ratelimit import RateSettings, TokenBuckets
from nodus.v1 import resource_pb2, resource_pb2_grpc

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("ratelimit") / "data").start(
            extra_args=("--rate-limit", "1", "--rate-burst", "2")) as c:
        yield c


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    now = [0.0]
    buckets = TokenBuckets(RateSettings(rate=2, burst=3), clock=lambda: now[0])
    assert [buckets.wait("t") for _ in range(3)] == [0, 0, 0]
    assert buckets.wait("t") == pytest.approx(0.5)
    assert buckets.wait("other") == 0  # each token its own bucket
    now[0] = 0.5
    assert buckets.wait("t") == 0 and buckets.wait("t") > 0
    now[0] = 100.0
    assert [buckets.wait("t") for _ in range(4)][:3] == [0, 0, 0]  # refilled to the burst, not beyond
    with pytest.raises(NodusError) as e:
        buckets.take("t", "ci")
    assert e.value.reason == "TooManyRequests" and e.value.retry_after == 1
    assert TokenBuckets(RateSettings(rate=0)).wait("t") == 0  # 0: off


def test_a_burst_above_the_limit_answers_429_with_retry_after(c: Coordinator) -> None:
    token = c.grpc_token("default", "viewer")
    token_id = token.split("_")[1]
    s = c.session(token)
    answers = [s.get(c.url(JOBS)) for _ in range(20)]
    limited = [r for r in answers if r.status_code == 429]
    assert limited, [r.status_code for r in answers]
    assert {r.status_code for r in answers} <= {200, 429}
    r = limited[0]
    assert r.headers["Retry-After"] == "1"
    status = r.json()
    assert status["reason"] == "TooManyRequests" and status["code"] == 429
    assert status["details"] == {"name": token_id, "kind": "tokens", "retryAfterSeconds": 1}
    assert "--rate-limit" in status["fix"] and status["requestId"] == r.headers["X-Request-Id"]
    # The operator's token is exempt by default.
    admin = c.session()
    assert all(admin.get(c.url(JOBS)).status_code == 200 for _ in range(20))


def test_grpc_answers_resource_exhausted_with_retry_info(c: Coordinator) -> None:
    token = c.grpc_token("default", "viewer")
    errors = []
    with c.channel() as channel:
        stub = resource_pb2_grpc.ResourceServiceStub(channel)
        for _ in range(20):
            try:
                stub.List(resource_pb2.ListRequest(kind="Job", project="default"),
                          metadata=(("authorization", f"Bearer {token}"),), timeout=10)
            except grpc.RpcError as e:
                errors.append(e)
    assert errors and all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in errors)
    status = rpc_status.from_call(errors[0])
    assert status is not None and "TooManyRequests" in status.message
    retry = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert retry
    info = error_details_pb2.RetryInfo()
    retry[0].Unpack(info)
    assert info.retry_delay.seconds == 1


def test_kubectl_waits_and_retries_by_itself(c: Coordinator, tmp_path: Path) -> None:
    config = yaml.safe_load(c.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = c.grpc_token("default", "viewer")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    # A cold discovery cache: kubectl sends several requests, more than the burst of 2.
    out = c.run("kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"), "-v=6",
                "get", "jobs", "-n", "default", env={"HOME": str(tmp_path)}, timeout=120)
    assert "429 Too Many Requests" in out.stderr, out.stderr
    assert "No resources found in default namespace." in out.stderr + out.stdout
