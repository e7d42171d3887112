"""Placement by price and policy, as pure functions (scheduler.fit/place with the active price book,
money/policy.py): interruptible Never/Allow/Prefer, maxRateUSDPerHour, the Cost/Speed/Balanced
profiles, exact variants and NVLink read from the offering, explanations naming why each other
offering lost, and no price book meaning placement exactly as before."""
from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from nodus.coordinator.controllers.placement import _request, job_placement, placed_on, warm_holds
from nodus.coordinator.controllers.views import AttemptView
from nodus.coordinator.money.estimate import Tariff, cost_band, expected_charge, restarts_at
from nodus.coordinator.money.policy import Interruptible, Policy, Profile, outlook
from nodus.coordinator.money.pricebook import PriceBook, parse
from nodus.coordinator.scheduler import (POOL_LABEL, PROCESS, Amount, Candidate, Gpu, NodeView, Request, Reservation,
                                         fit, place, place_all)
from nodus.coordinator.scheduler_gang import place_gang

GI = 1 << 30


def offering(oid: str, family: str, rate: str, *, speed: str = "1", spot: str = "", region: str = "us",
             gpus: int = 1, interconnect: str = "PCIe") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": oid, "accelerator": {"id": f"nvidia-{family.lower()}-sxm-80g", "family": family, "gpusPerNode": gpus,
                                   "memory": "80Gi", "interconnect": interconnect},
        "vcpu": 8, "memory": "32Gi", "regionClass": region, "provider": "lab", "region": f"{region}-1",
        "rateUSDPerHour": rate, "billingIncrement": "60s", "minimumCharge": "1m", "relativeSpeed": speed}
    if spot:
        doc.update(interruptible=True, interruptionsPerHour=spot)
    return doc


BOOK: PriceBook = parse({"pricebookVersion": "test-1", "storageUSDPerGiBMonth": "0.08", "offerings": [
    offering("a100-x1-us-spot", "A100", "1.00", spot="0.1"),
    offering("a100-x1-us", "A100", "2.00"),
    offering("h100-x1-us", "H100", "5.00", speed="2"),
    offering("a100-x1-us-flaky", "A100", "1.90", spot="6"),
    offering("h100-x2-eu-nvl", "H100", "9.00", speed="2", region="eu", gpus=2, interconnect="NVLink"),
]})


def node(name: str, offering_id: str, family: str = "A100", gpus: int = 1, region: str = "us") -> NodeView:
    return NodeView(name, True, False, frozenset({PROCESS}), Amount(8000, 32 * GI, 100 * GI, gpus),
                    tuple(Gpu(i, family, 80 * GI) for i in range(gpus)), {}, region, offering_id)


SPOT, ON_DEMAND, FAST, FLAKY = (node("n-spot", "a100-x1-us-spot"), node("n-ondemand", "a100-x1-us"),
                                node("n-fast", "h100-x1-us", "H100"), node("n-flaky", "a100-x1-us-flaky"))
FLEET = [SPOT, ON_DEMAND, FAST]


def req(gpu: dict[str, Any] | None = None, expected: str | None = None, **placement: Any) -> Request:
    return Request.of({"gpu": gpu or {"count": 1}}, None, placement, expected)


def test_policy_defaults_follow_the_spec() -> None:
    assert Policy.of({}) == Policy(Interruptible.NEVER, None, Profile.BALANCED, None)
    p = Policy.of({"interruptible": "Prefer", "maxRateUSDPerHour": "2.50", "profile": "Speed"}, "1h30m")
    assert p == Policy(Interruptible.PREFER, Decimal("2.50"), Profile.SPEED, Decimal(5400))
    assert req().policy == Policy(), "Request.of reads the policy; unset is Never and Balanced"


def test_never_never_lands_on_interruptible_capacity() -> None:
    why = fit(req(), SPOT, [], BOOK)
    assert why == "offering a100-x1-us-spot is interruptible and placement.interruptible is Never"
    for profile in ("Cost", "Speed", "Balanced"):
        assert place(req(profile=profile), FLEET, [], book=BOOK).node != "n-spot"
    alone = place(req(interruptible="Never"), [SPOT], [], book=BOOK)
    assert alone.node is None and "n-spot: offering a100-x1-us-spot is interruptible" in alone.explain
    assert isinstance(fit(req(interruptible="Allow"), SPOT, [], BOOK), Candidate)


def test_max_rate_filters_offerings_above_it() -> None:
    why = fit(req(maxRateUSDPerHour="4.99"), FAST, [], BOOK)
    assert why == "offering h100-x1-us costs $5.00/h, above placement.maxRateUSDPerHour $4.99"
    assert isinstance(fit(req(maxRateUSDPerHour="5.00"), FAST, [], BOOK), Candidate), "at the limit is allowed"
    assert place(req(profile="Speed", maxRateUSDPerHour="3"), FLEET, [], book=BOOK).node == "n-ondemand"
    none = place(req(maxRateUSDPerHour="0.50", interruptible="Allow"), FLEET, [], book=BOOK)
    assert none.node is None and "above placement.maxRateUSDPerHour $0.50" in none.explain
    unpriced = node("n-unpriced", "")
    assert "sold as no offering, so it has no rate" in str(fit(req(maxRateUSDPerHour="9"), unpriced, [], BOOK))
    stale = node("n-stale", "tpu-v5-x4-us")
    assert "offering tpu-v5-x4-us is not in the active price book" in str(
        fit(req(maxRateUSDPerHour="9"), stale, [], BOOK))


def test_cost_picks_the_cheapest_eligible_offering() -> None:
    assert place(req(profile="Cost", interruptible="Allow"), FLEET, [], book=BOOK).node == "n-spot"
    chosen = place(req(profile="Cost"), FLEET, [], book=BOOK)
    assert chosen.node == "n-ondemand" and chosen.offering is not None and chosen.offering.id == "a100-x1-us"
    assert chosen.explain.startswith("n-ondemand: offering a100-x1-us ($2.00/h): expected $2.00 and 1.00h per hour "
                                     "of work, the least expected cost (Cost) of 2 fitting offerings")
    assert "n-fast: offering h100-x1-us ($5.00/h): expected $2.50 and 0.50h per hour of work; $0.50 more" in \
        chosen.explain
    assert "n-spot: offering a100-x1-us-spot is interruptible and placement.interruptible is Never" in chosen.explain


def test_allow_counts_the_expected_restarts() -> None:
    # Reclaimed six times an hour, each costing 10 minutes again: its lower rate does not make it cheaper.
    fleet = [FLAKY, ON_DEMAND]
    chosen = place(req(profile="Cost", interruptible="Allow"), fleet, [], book=BOOK)
    assert chosen.node == "n-ondemand"
    assert "n-flaky: offering a100-x1-us-flaky ($1.90/h, interruptible): expected $3.80 and 2.00h per hour of " \
           "work; $1.80 more" in chosen.explain
    assert place(req(profile="Cost", interruptible="Allow"), [SPOT, ON_DEMAND], [], book=BOOK).node == "n-spot"
    # With a duration the expected charge comes from the estimate (increments, minimum, restarts).
    timed = place(req(expected="2h", profile="Cost", interruptible="Allow"), fleet, [], book=BOOK)
    assert timed.node == "n-ondemand" and "expected $4.00 and 2.00h" in timed.explain


def test_prefer_takes_interruptible_capacity_first() -> None:
    chosen = place(req(profile="Speed", interruptible="Prefer"), FLEET, [], book=BOOK)
    assert chosen.node == "n-spot"
    assert "n-fast: offering h100-x1-us ($5.00/h): expected $2.50 and 0.50h per hour of work; " \
           "placement.interruptible is Prefer and it is not interruptible" in chosen.explain
    assert place(req(profile="Speed", interruptible="Prefer"), [ON_DEMAND, FAST], [], book=BOOK).node == "n-fast", \
        "without interruptible capacity Prefer falls back to the profile"


def test_speed_picks_the_fastest_and_balanced_weighs_cost_by_time() -> None:
    speed = place(req(profile="Speed"), FLEET, [], book=BOOK)
    assert speed.node == "n-fast" and "the earliest expected completion (Speed)" in speed.explain
    assert "n-ondemand: offering a100-x1-us ($2.00/h): expected $2.00 and 1.00h per hour of work; 0.50h later" in \
        speed.explain
    # Balanced: fast costs 2.50 × 0.5h = 1.25 against 2.00 × 1h; twice as fast for 25 % more wins.
    balanced = place(req(), FLEET, [], book=BOOK)
    assert balanced.node == "n-fast" and "the least expected cost × time (Balanced)" in balanced.explain
    assert "n-ondemand" in balanced.explain and "cost × time 1.60× the chosen" in balanced.explain
    # ... but not at any price: at 4× the cost for twice the speed, the cheaper one wins.
    pricey = parse({"pricebookVersion": "test-2", "storageUSDPerGiBMonth": "0", "offerings": [
        offering("a100-x1-us", "A100", "2.00"), offering("h100-x1-us", "H100", "16.00", speed="2")]})
    assert place(req(), FLEET[1:], [], book=pricey).node == "n-ondemand"


def test_exact_variants_and_nvlink_read_from_the_offering() -> None:
    # Simulated GPUs carry only a model name; the offering says which variant and which interconnect.
    nvl = node("n-nvl", "h100-x2-eu-nvl", "H100", gpus=2, region="eu")
    exact = req({"count": 1, "type": ["nvidia-h100-sxm-80g"], "exact": True})
    assert isinstance(fit(exact, nvl, [], BOOK), Candidate)
    assert "gpu: wants 1 × nvidia-h100-sxm-80g, 0 free" == fit(exact, nvl, []), "without a book: measured names only"
    assert "gpu: wants 1 × nvidia-a100-sxm-80g" in str(fit(req({"count": 1, "type": ["nvidia-a100-sxm-80g"],
                                                                "exact": True}), nvl, [], BOOK))
    linked = req({"count": 2, "interconnect": "NVLink"}, profile="Cost")
    assert isinstance(fit(linked, nvl, [], BOOK), Candidate)
    assert "on NVLink" in str(fit(linked, nvl, []))
    assert "gpu: wants 2 × H100" in str(fit(req({"count": 2, "type": ["H100"]}), FAST, [], BOOK))


def test_without_a_price_book_placement_is_as_before() -> None:
    # Never, a rate limit and a profile are read only with a book: the spot node places by spread.
    strict = req(interruptible="Never", maxRateUSDPerHour="0.01", profile="Cost")
    assert isinstance(fit(strict, SPOT, []), Candidate)
    before = place(Request.of({"gpu": {"count": 1}}, None), FLEET, [])
    assert place(strict, FLEET, []) == before and before.offering is None
    assert before.explain == "n-fast: the most free capacity of 3 fitting nodes"


def test_unpriced_nodes_rank_after_priced_ones() -> None:
    unpriced = node("a-unpriced", "")
    assert place(req(profile="Cost"), [unpriced, ON_DEMAND], [], book=BOOK).node == "n-ondemand"
    only = place(req(), [unpriced], [], book=BOOK)
    assert only.node == "a-unpriced" and only.offering is None and "sold as no offering" in only.explain


def test_place_all_and_gangs_keep_the_policy() -> None:
    second = node("n-ondemand-2", "a100-x1-us")
    placed = place_all([("a", req(profile="Cost")), ("b", req(profile="Cost"))], [SPOT, ON_DEMAND, second], [],
                       book=BOOK)
    assert {placed["a"].node, placed["b"].node} == {"n-ondemand", "n-ondemand-2"}, "one GPU each, never the spot"
    gang = place_gang([(0, req(profile="Cost")), (1, req(profile="Cost"))], [SPOT, ON_DEMAND], [], "Global",
                      book=BOOK)
    assert all(p.node is None for p in gang.values()) and "interruptible is Never" in gang[0].explain
    gang = place_gang([(0, req(profile="Cost")), (1, req(profile="Cost"))], [FAST, ON_DEMAND, SPOT], [], "Global",
                      book=BOOK)
    assert [gang[0].node, gang[1].node] == ["n-ondemand", "n-fast"] and gang[1].offering is not None


def test_expected_charge_counts_restarts_at_their_probability() -> None:
    tariff = Tariff(Decimal("2.00"), 60, 60)
    assert expected_charge(tariff, Decimal(3600)) == Decimal("2.00")
    spot = expected_charge(tariff, Decimal(3600), interruptions_per_hour=Decimal("1"), restart_overhead_s=Decimal(600))
    band = cost_band(tariff, Decimal(3600), interruptions_per_hour=Decimal("1"), restart_overhead_s=Decimal(600))
    assert band.p50 <= spot <= band.p90 and spot > Decimal("2.00")
    o = BOOK.offering("h100-x1-us")
    assert o is not None and outlook(Policy(duration_s=Decimal(7200)), o).hours == Decimal(1), \
        "expectedDuration is reference time: twice the speed halves it"


def test_the_job_and_the_attempt_get_the_frozen_rate() -> None:
    chosen = place(req(profile="Cost"), FLEET, [], book=BOOK)
    assert job_placement(chosen, ON_DEMAND) == {"offering": "a100-x1-us", "rateUSDPerHour": "2.00",
                                                "regionClass": "us", "interruptible": False, "warmReuse": False}
    job = {"metadata": {"name": "j"}, "status": {"phase": "Queued"}}
    written = placed_on(chosen, ON_DEMAND)(job)
    assert written is not None and written["status"]["phase"] == "Queued"
    assert written["status"]["placement"]["rateUSDPerHour"] == "2.00"
    assert placed_on(chosen, ON_DEMAND)(written) is None, "written once"


def test_the_jobs_policy_reaches_the_attempts_request() -> None:
    attempt = AttemptView.from_object({"metadata": {"name": "j-0-1", "namespace": "p"}, "spec": {
        "job": "j", "index": 0, "number": 1, "resources": {"gpu": {"count": 1}}, "placement": {"regions": ["us"]}},
        "status": {"phase": "Pending"}})
    job = {"spec": {"expectedDuration": "30m", "placement": {"interruptible": "Allow", "profile": "Cost",
                                                             "maxRateUSDPerHour": "3", "regions": ["eu"]}}}
    r = _request(attempt, job)
    assert r.regions == ("us",) and r.project == "p", "the attempt's own hard constraints win"
    assert r.policy == Policy(Interruptible.ALLOW, Decimal("3"), Profile.COST, Decimal(1800))
    assert _request(attempt).policy == Policy()


@pytest.mark.parametrize("profile,node_name", [("Cost", "n-spot"), ("Speed", "n-fast"), ("Balanced", "n-spot")])
def test_profiles_with_interruptible_allowed(profile: str, node_name: str) -> None:
    assert place(req(profile=profile, interruptible="Allow"), FLEET, [], book=BOOK).node == node_name


def test_complete_by_time_steers_towards_speed() -> None:
    # 2h of reference work: the on-demand A100 takes 2h, the H100 (speed 2) 1h.
    def cost(within_s: int | None) -> Request:
        return Request.of({"gpu": {"count": 1}}, None, {"profile": "Cost"}, "2h",
                          None if within_s is None else Decimal(within_s))

    assert place(cost(None), FLEET, [], book=BOOK).node == "n-ondemand"
    assert place(cost(3 * 3600), FLEET, [], book=BOOK).node == "n-ondemand", "the cheapest finishes in time"
    steered = place(cost(90 * 60), FLEET, [], book=BOOK)
    assert steered.node == "n-fast"
    assert "(completeByTime is in 1.50h and Cost's choice, offering a100-x1-us, would finish in 2.00h at p90, " \
           "so ranked by Speed)" in steered.explain
    without_duration = Request.of({"gpu": {"count": 1}}, None, {"profile": "Cost"}, None, Decimal(60))
    assert place(without_duration, FLEET, [], book=BOOK).node == "n-ondemand", "no duration, no finish time"
    # p90 counts the reclaims: six an hour on the flaky one adds restarts beyond the mean at p90.
    flaky = BOOK.offering("a100-x1-us-flaky")
    assert flaky is not None
    look = outlook(Policy(duration_s=Decimal(3600)), flaky)
    assert look.hours_p90 > look.hours > Decimal(1)


def test_restarts_at_a_quantile() -> None:
    assert restarts_at(Decimal(0), Decimal("0.9")) == 0
    assert restarts_at(Decimal(6), Decimal("0.9")) == 9  # Poisson(6): P(N ≤ 8) ≈ 0.847, P(N ≤ 9) ≈ 0.916


WARM = Reservation("n-ondemand", Amount(), warm_for="p1", until=1_767_225_600.0)


def test_a_warm_node_is_kept_for_its_project_and_reused_first() -> None:
    def of(project: str, **placement: Any) -> Request:
        return replace(req(**placement), project=project)

    assert fit(of("p2"), ON_DEMAND, [WARM], BOOK) == \
        "kept warm for project p1 until 2026-01-01T00:00:00Z (the scaledownWindow of its last Job)"
    other = place(of("p2", profile="Cost"), FLEET, [WARM], book=BOOK)
    assert other.node == "n-fast" and "n-ondemand: kept warm for project p1" in other.explain
    mine = place(of("p1", profile="Speed"), FLEET, [WARM], book=BOOK)
    assert mine.node == "n-ondemand" and mine.warm_reuse, "its warm node first, though n-fast is faster"
    assert "reuses the node its project kept warm (scaledownWindow)" in mine.explain
    assert not place(of("p1", profile="Speed"), FLEET, [], book=BOOK).warm_reuse
    # Taken once: the second attempt of the project goes by its profile (and the node's GPU is taken).
    both = place_all([("a", of("p1", profile="Speed")), ("b", of("p1", profile="Speed"))], FLEET, [WARM], book=BOOK)
    assert (both["a"].node, both["a"].warm_reuse, both["b"].node, both["b"].warm_reuse) == (
        "n-ondemand", True, "n-fast", False)
    # Without a price book there is no warm hold: placement as before.
    assert isinstance(fit(of("p2"), ON_DEMAND, [WARM]), Candidate)


def _ended(name: str, node_name: str, finished: str | None, phase: str = "Succeeded",
           project: str = "p1") -> AttemptView:
    status: dict[str, Any] = {"phase": phase}
    if finished:
        status["finishTime"] = finished
    return AttemptView.from_object({"metadata": {"name": name, "namespace": project}, "spec": {
        "job": name, "index": 0, "number": 1, "node": node_name}, "status": status})


def test_warm_holds_come_from_ended_attempts_within_their_window() -> None:
    t0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    attempts = [_ended("old", "n1", "2026-01-01T00:00:00Z"), _ended("new", "n1", "2026-01-01T00:01:00Z"),
                _ended("lost", "n2", "2026-01-01T00:01:00Z", "Lost"), _ended("busy", "n3", "2026-01-01T00:01:00Z"),
                _ended("live", "n3", None, "Running"), _ended("nowindow", "n4", "2026-01-01T00:01:00Z")]
    windows = {"old": 30.0, "new": 120.0, "lost": 600.0, "busy": 600.0, "live": 600.0}

    def window(project: str, job: str) -> float | None:
        return windows.get(job)

    assert warm_holds(attempts, window, t0 + 90) == [
        Reservation("n1", Amount(), warm_for="p1", until=t0 + 180)], "the newest ended attempt of a node counts"
    assert warm_holds(attempts, window, t0 + 180) == [], "released when the window has passed"


def test_a_pool_is_dedicated_to_its_project() -> None:
    pooled = NodeView("n-pool", True, False, frozenset({PROCESS}), Amount(8000, 32 * GI, 100 * GI, 1),
                      (Gpu(0, "A100", 80 * GI),), {POOL_LABEL: "p1/own"}, "us", "")
    plain = node("n-plain", "a100-x1-us")

    def of(project: str, **placement: Any) -> Request:
        return replace(req(**placement), project=project)

    assert fit(of("p2"), pooled, []) == "dedicated to pool own of project p1"
    assert fit(of("p2", pool="own"), pooled, []) == "dedicated to pool own of project p1", "a pool of p1, not p2's"
    assert isinstance(fit(of("p1"), pooled, []), Candidate), "its project may use it without naming it"
    assert place(of("p1", pool="own"), [plain, pooled], []).node == "n-pool"
    assert fit(of("p1", pool="other"), pooled, []) == "in pool own, and placement.pool is other"
    assert fit(of("p1", pool="own"), plain, []) == "in no pool, and placement.pool is own"
    priced = place(of("p2", profile="Cost"), [plain, pooled], [], book=BOOK)
    assert priced.node == "n-plain" and "n-pool: dedicated to pool own of project p1" in priced.explain


def test_offerings_of_the_same_outlook_are_explained_as_a_tie() -> None:
    twins = parse({"pricebookVersion": "twins", "storageUSDPerGiBMonth": "0", "offerings": [
        offering("a100-x1-us", "A100", "2.00"), offering("a100-x1-us-b", "A100", "2.00")]})
    chosen = place(req(profile="Cost"), [node("n-b", "a100-x1-us-b"), node("n-a", "a100-x1-us")], [], book=twins)
    assert chosen.node == "n-a" and "n-b: offering a100-x1-us-b ($2.00/h): expected $2.00 and 1.00h per hour of " \
        "work; the same outlook, and the chosen node has more room free or comes first by name" in chosen.explain


def test_a_job_placed_again_on_an_unpriced_node_names_no_earlier_offering() -> None:
    unpriced = place(req(), [node("n-unpriced", "")], [], book=BOOK)
    assert job_placement(unpriced, None) is None
    job = {"metadata": {"name": "j"}, "status": {"phase": "Running", "placement": {"offering": "a100-x1-us"}}}
    written = placed_on(unpriced, None)(job)
    assert written is not None and "placement" not in written["status"] and written["status"]["phase"] == "Running"
    assert placed_on(unpriced, None)({"metadata": {"name": "j"}, "status": {}}) is None
