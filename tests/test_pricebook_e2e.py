"""The price book through the real coordinator: loaded at start with --price-book, replaced live
through PriceBookService with grpcurl and with `nodus pricebook apply`, every version kept across a
restart, and none at all when none was given (no price book, no money)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import BIN, Coordinator
from test_grpcurl import grpcurl

PB = "nodus.v1.PriceBookService"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"
INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED = 3, 5, 6, 7


def example(**top: Any) -> dict[str, Any]:
    doc = dict(yaml.safe_load(EXAMPLE.read_text()))
    doc.update(top)
    return doc


def ok(c: Coordinator, method: str, body: dict[str, Any], token: str | None = None) -> Any:
    return json.loads(grpcurl(c, f"{PB}/{method}", body, token=c.token if token is None else token).stdout)


def refused(c: Coordinator, method: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    result = grpcurl(c, f"{PB}/{method}", body, token=c.token if token is None else token, check=False)
    assert result.returncode != 0, result.stdout
    error: dict[str, Any] = json.loads(result.stderr)
    return error


def test_loaded_at_start_and_replaced_live(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(EXAMPLE))) as c:
        active = ok(c, "GetPriceBook", {})
        assert active["version"] == "2026-12-01" and active["active"] is True
        h100 = next(o for o in active["offerings"] if o["id"] == "h100-sxm-80g-x8-us")
        assert h100["rate_usd_per_hour"] == "23.92" and h100["billing_increment"] == "60s"
        assert h100["accelerator"]["gpus_per_node"] == 8

        cheaper = example(pricebookVersion="2026-12-02")
        cheaper["offerings"][0]["rateUSDPerHour"] = "21.50"
        applied = ok(c, "ApplyPriceBook", {"document": yaml.safe_dump(cheaper)})
        assert applied["outcome"] == "APPLY_OUTCOME_CREATED" and applied["price_book"]["version"] == "2026-12-02"
        assert ok(c, "GetPriceBook", {})["offerings"][0]["rate_usd_per_hour"] == "21.50"

        # A version never changes: the old one still says what it said, and other content under it is refused.
        old = ok(c, "GetPriceBook", {"version": "2026-12-01"})
        assert old["offerings"][0]["rate_usd_per_hour"] == "23.92" and "active" not in old
        changed = example()
        changed["offerings"][0]["rateUSDPerHour"] = "1.00"
        error = refused(c, "ApplyPriceBook", {"document": yaml.safe_dump(changed)})
        assert error["code"] == ALREADY_EXISTS and "new pricebookVersion" in error["message"]

        bad = example(pricebookVersion="2026-12-03")
        bad["offerings"][2]["rateUSDPerHour"] = 9.6
        error = refused(c, "ApplyPriceBook", {"document": yaml.safe_dump(bad)})
        assert error["code"] == INVALID_ARGUMENT
        violations = [v for d in error["details"] for v in d.get("field_violations", [])]
        assert [v["field"] for v in violations] == ["offerings[2].rateUSDPerHour"]
        assert 'must be a decimal string like "2.50"' in violations[0]["description"]
        assert ok(c, "GetPriceBook", {})["version"] == "2026-12-02"  # a refused book changes nothing

        viewer = c.grpc_token("default", "viewer")
        assert refused(c, "ApplyPriceBook", {"document": yaml.safe_dump(example())}, token=viewer)["code"] == \
            PERMISSION_DENIED
        assert ok(c, "GetPriceBook", {}, token=viewer)["version"] == "2026-12-02"  # customers read prices

        # the CLI: apply an older version again (activated, not stored twice), show it, list the versions
        out = c.run("nodus", "pricebook", "apply", "-f", str(EXAMPLE)).stdout
        assert out.strip() == "pricebook/2026-12-01 activated again (5 offerings, active)"
        shown = c.run("nodus", "pricebook", "get").stdout
        assert shown.startswith("price book 2026-12-01 (active") and "a100-sxm-80g-x8-eu-spot" in shown
        assert "yes (0.05/h)" in shown and "23.92" in shown
        listed = c.run("nodus", "pricebook", "versions").stdout.splitlines()
        assert [line.split()[0] for line in listed[1:]] == ["2026-12-01", "2026-12-02"]
        assert listed[1].rstrip().endswith("yes") and not listed[2].rstrip().endswith("yes")
        float_rate = tmp_path / "float.yaml"
        float_rate.write_text(EXAMPLE.read_text().replace('"23.92"', "23.92").replace("2026-12-01", "v9"))
        failed = c.run("nodus", "pricebook", "apply", "-f", str(float_rate), check=False)
        assert failed.returncode == 1 and "offerings[0].rateUSDPerHour" in failed.stderr

        c.stop()
        c.start()  # the versions are in the store: no flag needed to keep them
        assert ok(c, "GetPriceBook", {})["version"] == "2026-12-01"
        assert len(ok(c, "ListPriceBookVersions", {})["price_books"]) == 2


def test_without_a_price_book_nothing_is_priced(coordinator: Coordinator) -> None:
    assert PB in grpcurl(coordinator, "list").stdout.split()  # reflection names the service
    health = json.loads(grpcurl(coordinator, "grpc.health.v1.Health/Check", {"service": PB}).stdout)
    assert health["status"] == "SERVING"
    error = refused(coordinator, "GetPriceBook", {})
    assert error["code"] == NOT_FOUND and "charges nothing" in error["message"]
    result = coordinator.run("nodus", "pricebook", "get", check=False)
    assert result.returncode == 1 and "charges nothing" in result.stderr and "pricebook apply" in result.stderr
    assert ok(coordinator, "ListPriceBookVersions", {}) == {}


def test_a_bad_price_book_stops_the_start_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("billingIncrement: 30s", "billingIncrement: soon"))
    result = subprocess.run([str(BIN / "nodus-coordinator"), "--data-dir", str(tmp_path / "data"), "--http-listen",
                             "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--price-book", str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "offerings[2].billingIncrement" in result.stderr and "fix:" in result.stderr
