"""Estimates through the real coordinator (--price-book: the example book plus the placement tests'
x1 offerings) and a real agent joined with --simulate-gpus and --offering: a dry run over REST shows
every status.estimate field with an ETag (a Sweep's sums its cells); a create sent with If-Match is bound to that estimate, still
admitted once the book it priced is no longer current (a new version raised the rate) and never placed
above its rate plus 10 %; an ETag of another spec answers 412 EstimateExpired with the fix, over REST and
through `nodus estimate` / `nodus apply --if-match`. Without a price book the estimate says Unpriced."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from conftest import Coordinator, job
from e2e import JOBS, attempts_of, get_job, grant, joined, settled, wait_status
from test_placement_price_e2e import ON_DEMAND, _agent, _book

FIELDS = ("costUSD", "overheadUSD", "rateUSDPerHour", "holdUSD", "concurrentHoldUSD", "gangHoldUSD",
          "assemblyBoundUSD", "minimumChargeUSD", "placementPreview", "pricebookVersion", "validUntil", "warnings",
          "blockingReasons", "startup")
ONE_GPU = {"gpu": {"count": 1}}
SWEEPS = JOBS.replace("/jobs", "/sweeps")


def _dry_run(c: Coordinator, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    r = c.session().post(c.url(JOBS), json=body, params={"dryRun": "All"})
    assert r.status_code == 201, r.text
    return r.json()["status"]["estimate"], r.headers["ETag"]


def _raised(book: Path, out: Path) -> Path:
    """The same book as a new version whose on-demand offering costs $3.00/h instead of $2.20."""
    doc = yaml.safe_load(book.read_text())
    doc["pricebookVersion"] += "-raised"
    next(o for o in doc["offerings"] if o["id"] == ON_DEMAND)["rateUSDPerHour"] = "3.00"
    out.write_text(yaml.safe_dump(doc))
    return out


def test_dry_run_estimate_if_match_binding_and_412(tmp_path: Path) -> None:
    book = _book(tmp_path / "pricebook.yaml")
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        grant(c)
        with joined([_agent(c, tmp_path, "n-ondemand", "A100", ON_DEMAND)], c):
            body = job("bound", resources=ONE_GPU, expectedDuration="1h", placement={"profile": "Cost"},
                       scaledownWindow="20m")
            estimate, etag = _dry_run(c, body)
            assert set(FIELDS) <= set(estimate), estimate
            # no finished Job of the project yet: the p90 lets the hour run half again (ADR 0068)
            assert estimate["rateUSDPerHour"] == "2.20" and estimate["costUSD"] == {"p50": "2.20", "p90": "3.30"}
            assert estimate["pricebookVersion"] == "2026-12-01-placement" and estimate["minimumChargeUSD"] == "0.18"
            preview = estimate["placementPreview"]
            assert preview["offering"] == ON_DEMAND and preview["regionClass"] == "us" and not preview["interruptible"]
            assert f"offering {ON_DEMAND}" in preview["explain"]
            assert "ColdStart" in [w["code"] for w in estimate["warnings"]] and estimate["blockingReasons"] == []
            assert etag.startswith('"e1.2026-12-01-placement.2.20.')
            assert get_job_missing(c, "bound"), "a dry run writes nothing"

            # Bound: admitted, and the binding is written on the Job for placement to hold to.
            r = c.session().post(c.url(JOBS), json=body, headers={"If-Match": etag})
            assert r.status_code == 201, r.text
            assert r.json()["status"]["estimate"]["binding"] == {
                "etag": etag, "pricebookVersion": "2026-12-01-placement", "rateUSDPerHour": "2.20",
                "maxRateUSDPerHour": "2.42"}
            assert settled(c, "bound")["phase"] == "Succeeded"
            (attempt,) = attempts_of(c, "bound")
            assert attempt["spec"]["rateUSDPerHour"] == "2.20"
            assert get_job(c, "bound")["status"]["estimate"]["binding"]["maxRateUSDPerHour"] == "2.42", "kept"

            # An ETag that is no estimate of this spec: 412 EstimateExpired, with the fix.
            other = job("other", resources=ONE_GPU, expectedDuration="2h", placement={"profile": "Cost"})
            r = c.session().post(c.url(JOBS), json=other, headers={"If-Match": etag})
            assert r.status_code == 412, r.text
            assert r.json()["reason"] == "EstimateExpired" and "dry run again" in r.json()["fix"]
            assert get_job_missing(c, "other")

            # The quoted prices stop being current (a new book raises the rate): the bound create is still
            # admitted, and its attempt is not placed above $2.20 + 10 %.
            later = job("later", resources=ONE_GPU, expectedDuration="1h", placement={"profile": "Cost"})
            warm, old_etag = _dry_run(c, later)
            # "bound" ended with scaledownWindow: its node is kept for the project, so no cold start.
            assert warm["placementPreview"]["warmReuse"] is True and "ColdStart" not in [
                w["code"] for w in warm["warnings"]], warm
            assert "kept warm" in warm["placementPreview"]["explain"]
            c.run("nodus", "pricebook", "apply", "-f", str(_raised(book, tmp_path / "raised.yaml")))
            fresh, fresh_etag = _dry_run(c, later)
            assert fresh["rateUSDPerHour"] == "3.00" and fresh_etag != old_etag
            r = c.session().post(c.url(JOBS), json=later, headers={"If-Match": old_etag})
            assert r.status_code == 201, r.text
            assert r.json()["status"]["estimate"]["binding"]["rateUSDPerHour"] == "2.20"
            waiting = wait_status(c, "later", lambda s: "If-Match" in (s.get("message") or ""),
                                  what="the bound Job to say why nothing fits")
            assert waiting["phase"] == "Queued"
            assert f"offering {ON_DEMAND} costs $3.00/h, above $2.42" in waiting["message"]
            assert c.session().delete(c.url(f"{JOBS}/later")).status_code == 200

            # A Sweep: its cells summed (three params × two repetitions of one A100 cell at the new rate).
            sweep = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "grid"}, "spec": {
                "template": {"kind": "Job", "spec": {"command": ["python3", "-c", "pass"], "resources": ONE_GPU,
                                                     "expectedDuration": "1h", "placement": {"profile": "Cost"}}},
                "matrix": {"params": {"LR": ["0.1", "0.01", "0.001"]}}, "repetitions": 2, "maxParallel": 2}}
            r = c.session().post(c.url(SWEEPS), json=sweep, params={"dryRun": "All"})
            assert r.status_code == 201, r.text
            grid = r.json()["status"]["estimate"]
            # "bound" ran on this offering, so its measured start is billed as overhead in every cell.
            assert grid["startup"]["cold"]["p50"] and "message" not in grid["startup"]["cold"]
            # (its p90: "bound" finished at once, so this project's record moves the p50 below the declared
            # hour, and a record of one run is too short to show a p90: each cell's lets the hour run half
            # again, 1.5 h at $3.00, ADR 0068)
            assert Decimal(grid["costUSD"]["p90"]) == 6 * Decimal("4.50") + Decimal(grid["overheadUSD"]["p90"])
            assert Decimal(grid["costUSD"]["p50"]) < Decimal(grid["costUSD"]["p90"])
            assert Decimal(grid["concurrentHoldUSD"]) == 2 * Decimal(grid["holdUSD"])  # maxParallel 2
            assert grid["rateUSDPerHour"] == "3.00" and r.headers["ETag"].startswith('"e1.')
            r = c.session().post(c.url(SWEEPS), json=sweep, headers={"If-Match": old_etag})
            assert r.status_code == 412 and r.json()["reason"] == "EstimateExpired", r.text

            # The CLI: the table with its ETag, and apply bound by it (or refused with the fix).
            path = tmp_path / "cli.yaml"
            path.write_text(yaml.safe_dump(job("cli", resources=ONE_GPU, expectedDuration="30m")))
            shown = c.run("nodus", "estimate", "-f", str(path)).stdout
            assert "rate per hour" in shown and "$3.00" in shown and f"offering {ON_DEMAND}" in shown
            by_kubectl = c.run("kubectl", "create", "--dry-run=server", "-f", str(path), "-o",
                               "jsonpath={.status.estimate.rateUSDPerHour} {.status.estimate.placementPreview.offering}")
            assert by_kubectl.stdout == f"3.00 {ON_DEMAND}"
            cli_etag = next(line.split()[-1] for line in shown.splitlines() if line.strip().startswith("etag "))
            refused = c.run("nodus", "apply", "-f", str(path), "--if-match", old_etag, check=False)
            assert refused.returncode == 1 and "not an estimate of this exact spec" in refused.stderr
            assert "run the dry run again" in refused.stderr
            c.run("nodus", "apply", "-f", str(path), "--if-match", cli_etag)
            assert get_job(c, "cli")["status"]["estimate"]["binding"]["rateUSDPerHour"] == "3.00"


def get_job_missing(c: Coordinator, name: str) -> bool:
    return c.session().get(c.url(f"{JOBS}/{name}")).status_code == 404


def test_without_a_price_book_the_estimate_is_unpriced_and_refuses_nothing(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start() as c:
        estimate, etag = _dry_run(c, job("free", expectedDuration="1h"))
        assert estimate["pricebookVersion"] == "" and [w["code"] for w in estimate["warnings"]] == ["Unpriced"]
        assert estimate["blockingReasons"] == [] and estimate["costUSD"] == {"p50": "0.00", "p90": "0.00"}
        r = c.session().post(c.url(JOBS), json=job("free", expectedDuration="1h"), headers={"If-Match": etag})
        assert r.status_code == 201, r.text
        assert "maxRateUSDPerHour" not in r.json()["status"]["estimate"]["binding"]
