"""Money through the real daemons, on a clock the test moves forward: a Job at a known rate is charged
per billing increment into its status.cost, suspends through a checkpoint with MaxCostReached within
one increment of its spec.maxCostUSD, and resumes from that checkpoint when the cap is raised; a
project whose credits run out turns the Job's Funded condition False, it checkpoints and suspends
before stopByTime, and a grant resumes it; a create whose first hold the credits cannot take is
refused with InsufficientCredits (and a dry run shows it in blockingReasons).

The offering charges $6.00/h by the minute ($0.10 per increment, at least one): every amount below
is a whole number of increments.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
import yaml

from agent_double import AgentProcess, restart_ports, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, JOBS, attempts_of, create, get_job, grant, joined
from nodus.coordinator.money.ledger import Kind, fold
from nodus.coordinator.money.ledger_store import Ledger
from nodus.coordinator.store import SqliteStore
from offset_clock import Clock

pytestmark = pytest.mark.slow

OFFERING = "cpu-1-1g-dev"
INCREMENT = Decimal("0.10")

STEPPER = textwrap.dedent("""
    import os, time
    from nodus import progress
    state = os.path.join(os.environ["NODUS_STATE_DIR"], "step")
    step = int(open(state).read()) if os.path.exists(state) else 0
    print(f"starts at step {step}", flush=True)
    while True:
        step += 1
        with open(state + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(state + ".tmp", state)
        progress.report(stage="train", completed=step)
        time.sleep(0.2)
""")


def _book(path: Path, version: str = "2026-12-02-money", storage_rate: str = "0.08") -> Path:
    path.write_text(yaml.safe_dump({
        "pricebookVersion": version, "storageUSDPerGiBMonth": storage_rate,
        "offerings": [{"id": OFFERING, "vcpu": 1, "memory": "1Gi", "disk": "1Gi", "regionClass": "us",
                       "provider": "dev", "region": "local", "rateUSDPerHour": "6.00", "interruptible": False,
                       "billingIncrement": "60s", "minimumCharge": "1m", "relativeSpeed": "1"}]}))
    return path


@contextlib.contextmanager
def money_fleet(root: Path, clock: Clock, node: str, *extra_args: str, book: Path | None = None,
                lease: str = "60s", moved_agents: bool = True) -> Iterator[Coordinator]:
    """A priced coordinator on the moved clock with one agent sold as OFFERING (the money e2e tests' fleet).
    `moved_agents=False`: the clock does not wait for the agent's heartbeats at each step."""
    with Coordinator(root / "data").start(extra_args=(
            "--price-book", str(book or _book(root / "book.yaml")), "--lease-duration", lease,
            "--heartbeat-interval", "1s", "--clock-offset-file", str(clock.path), *extra_args)) as coordinator:
        agent = AgentProcess(root / "agent", coordinator.grpc, coordinator.join_token, node=node, env=AGENT_ENV,
                             extra_args=("--offering", OFFERING, "--region", "us")).start()
        with joined([agent], coordinator):
            clock.coordinator, clock.agents = coordinator, [agent] if moved_agents else []
            yield coordinator


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> Clock:
    return Clock(tmp_path_factory.mktemp("clock") / "offset")


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[Coordinator]:
    with money_fleet(tmp_path_factory.mktemp("money"), clock, "m1") as coordinator:
        yield coordinator


def cost(c: Coordinator, name: str) -> dict[str, Any]:
    return dict((get_job(c, name).get("status") or {}).get("cost") or {})


def funded(status: dict[str, Any]) -> dict[str, Any]:
    return next((cond for cond in status.get("conditions") or [] if cond["type"] == "Funded"), {})


def run_until(c: Coordinator, clock: Clock, name: str, predicate: Any, what: str, limit: int = 40) -> dict[str, Any]:
    """Moves the clock a minute at a time until `predicate(status)` holds."""
    for _ in range(limit):
        status = dict(get_job(c, name).get("status") or {})
        if predicate(status):
            return status
        clock.advance(60)
    raise AssertionError(f"{what}: not after {limit} minutes; last status: {get_job(c, name).get('status')}")


def restored_step(c: Coordinator, name: str, number: int) -> int:
    """The step the attempt `number` started at, from its log (restored state, or 0)."""
    def started() -> int | None:
        for a in attempts_of(c, name):
            if int(a["spec"]["number"]) == number:
                log = c.run("nodus", "logs", name, "--attempt", str(number), check=False).stdout
                for line in log.splitlines():
                    if line.startswith("starts at step "):
                        return int(line.split()[-1])
        return None
    return int(wait_for(started, 60, interval=0.3, what=f"attempt {number} of {name} to start"))


def test_a_capped_job_suspends_at_its_cap_and_resumes_when_it_is_raised(c: Coordinator, clock: Clock) -> None:
    grant(c, "20.00")
    create(c, "capped", command=["python3", "-c", STEPPER], maxCostUSD="1.00",
           recovery={"checkpoint": {"interval": "1h"}})
    wait_for(lambda: get_job(c, "capped")["status"].get("phase") == "Running", 60, interval=0.2,
             what="the capped Job to run")
    status = run_until(c, clock, "capped", lambda s: funded(s).get("status") == "False", "MaxCostReached")
    assert funded(status)["reason"] == "MaxCostReached" and "spec.maxCostUSD 1.00" in funded(status)["message"]
    suspended = wait_for(lambda: (s := get_job(c, "capped")["status"]).get("phase") == "Suspended" and s, 60,
                         interval=0.3, what="the capped Job to suspend")
    assert suspended["reason"] == "MaxCostReached"
    (first,) = attempts_of(c, "capped")
    assert first["spec"]["stop"].get("checkpointSeq"), "a money suspend checkpoints first"
    assert first["status"].get("checkpoints"), "the suspend checkpoint committed"
    final = wait_for(lambda: (x := cost(c, "capped")).get("heldUSD") == "0.00" and x, 60, interval=0.3,
                     what="the hold to be released")
    total = Decimal(final["totalUSD"])
    assert Decimal("0.90") <= total <= Decimal("1.00") + INCREMENT, final
    assert final["limitUSD"] == "1.00" and Decimal(final["bySegment"]["runningUSD"]) > 0
    clock.advance(120)
    assert Decimal(cost(c, "capped")["totalUSD"]) == total, "nothing is charged while suspended"
    # unitMetrics follows: the cost per completed unit the program reported.
    per_unit = wait_for(lambda: (s := get_job(c, "capped")["status"]).get("unitMetrics", {}).get("costPerUnitUSD")
                        and s, 30, interval=0.3, what="costPerUnitUSD")["unitMetrics"]
    assert Decimal(per_unit["costPerUnitUSD"]) == (total / per_unit["completed"]).quantize(Decimal("0.000001"))
    # The COST column shows it, in kubectl's table and in `nodus get jobs`.
    for argv in (("kubectl", "get", "job", "capped"), ("nodus", "get", "jobs", "capped")):
        header, row = c.run(*argv).stdout.splitlines()[:2]
        assert header.split()[-2:] == ["COST", "AGE"] and row.split()[-2] == final["totalUSD"], (argv, header, row)

    # Raising the cap resumes it from the suspend checkpoint.
    r = c.session().patch(c.url(f"{JOBS}/capped"), data=json.dumps({"spec": {"maxCostUSD": "2.00"}}),
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    wait_for(lambda: funded(get_job(c, "capped")["status"]).get("status") == "True", 60, interval=0.3,
             what="Funded to turn True")
    assert restored_step(c, "capped", 2) > 0, "the resumed attempt starts from the checkpoint's step"
    status = run_until(c, clock, "capped", lambda s: funded(s).get("status") == "False", "MaxCostReached again")
    wait_for(lambda: get_job(c, "capped")["status"].get("phase") == "Suspended", 60, interval=0.3,
             what="the capped Job to suspend again")
    again = wait_for(lambda: (x := cost(c, "capped")).get("heldUSD") == "0.00" and x, 60, interval=0.3,
                     what="the hold to be released again")
    assert Decimal(again["totalUSD"]) <= Decimal("2.00") + INCREMENT, again
    credits = c.run("nodus", "credits").stdout.splitlines()[1].split()
    assert Decimal(credits[5]) == Decimal(again["totalUSD"]), "the project's spend is the Job's status.cost"


def test_running_out_of_credits_suspends_before_stop_by_time_and_a_grant_resumes(
        c: Coordinator, clock: Clock) -> None:
    c.run("nodus", "project", "create", "lean")
    lean = c.session(c.grpc_token("lean", "editor"))
    jobs = c.url(JOBS.replace("/default/", "/lean/"))

    # No credits: the dry run says why, the real create is refused with the amounts and the fix.
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "lean"},
            "spec": {"command": ["python3", "-c", STEPPER], "recovery": {"checkpoint": {"interval": "1h"}}}}
    dry = lean.post(jobs + "?dryRun=All", json=body)
    assert dry.status_code == 201, dry.text
    (blocking,) = dry.json()["status"]["estimate"]["blockingReasons"]
    assert blocking["code"] == "InsufficientCredits" and "needs 1.00 USD" in blocking["message"]
    refused = lean.post(jobs, json=body)
    assert refused.status_code == 402, refused.text
    assert refused.json()["reason"] == "InsufficientCredits" and "credits grant" in refused.text

    grant(c, "1.30", project="lean")  # the first hold (1.00) and three more increments
    assert lean.post(jobs, json=body).status_code == 201

    def lean_job() -> dict[str, Any]:
        return dict(lean.get(f"{jobs}/lean").json().get("status") or {})

    wait_for(lambda: lean_job().get("phase") == "Running", 60, interval=0.2, what="the lean Job to run")
    for _ in range(30):
        if funded(lean_job()).get("status") == "False":
            break
        clock.advance(60)
    status = lean_job()
    assert funded(status)["reason"] == "InsufficientCredits", status
    stop_by = status["stopByTime"]
    suspended = wait_for(lambda: (s := lean_job()).get("phase") == "Suspended" and s, 60, interval=0.3,
                         what="the lean Job to suspend")
    (first,) = [a for a in lean.get(c.url("/apis/nodus.dev/v1/namespaces/lean/attempts")).json()["items"]]
    assert first["status"].get("checkpoints"), "it checkpointed before it stopped"
    # instants, not strings: RFC 3339 drops trailing zeros, so "29.04Z" sorts after "29.042Z"
    assert datetime.fromisoformat(first["status"]["finishTime"]) <= datetime.fromisoformat(stop_by), \
        "suspended before the funded edge"
    assert Decimal(suspended["cost"]["totalUSD"]) <= Decimal("1.30")

    grant(c, "5.00", project="lean")
    wait_for(lambda: lean_job().get("phase") == "Running", 60, interval=0.3, what="the grant to resume it")
    assert funded(lean_job())["status"] == "True"
    r = lean.patch(f"{jobs}/lean", data=json.dumps({"spec": {"state": "Cancelled"}}),
                   headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    done = wait_for(lambda: (s := lean_job()).get("cost", {}).get("final") and s, 60, interval=0.3,
                    what="the final charge")
    assert done["cost"]["heldUSD"] == "0.00" and Decimal(done["cost"]["totalUSD"]) > Decimal(suspended["cost"]["totalUSD"])


def test_a_kill_9_in_the_middle_of_posting_charges_nothing_twice(tmp_path: Path) -> None:
    """The coordinator's clock jumps ten minutes at once (ten increments and a renewal to post) and the
    coordinator is killed with SIGKILL a moment later, three times; restarted on the same ports, the
    agent reconnects and the Job runs on. Then the store holds every posting once, the ledger folds to
    its balances, each attempt's increments are charged once each with none skipped, and the Job's
    status.cost is the sum of its postings to the cent."""
    offset = tmp_path / "offset"
    offset.write_text("0")
    port = restart_ports()
    args = ("--price-book", str(_book(tmp_path / "book.yaml")), "--lease-duration", "30m",
            "--heartbeat-interval", "1s", "--clock-offset-file", str(offset))
    c = Coordinator(tmp_path / "data").start(grpc_port=port, extra_args=args)
    agent = AgentProcess(tmp_path / "agent", c.grpc, c.join_token, node="k1", env=AGENT_ENV,
                         extra_args=("--offering", OFFERING, "--region", "us")).start()
    try:
        with joined([agent], c):
            grant(c, "100.00")
            create(c, "steady", command=["python3", "-c", STEPPER], recovery={"checkpoint": {"interval": "1h"}})
            wait_for(lambda: get_job(c, "steady")["status"].get("phase") == "Running", 60, interval=0.2,
                     what="the Job to run")
            shift = 0.0
            for pause in (0.05, 0.15, 0.3):
                shift += 600
                offset.write_text(str(shift))
                time.sleep(pause)
                c.kill()  # mid-posting: some charges booked, one perhaps half-appended, some not yet posted
                c.start(grpc_port=port, extra_args=args)
            owed = wait_for(lambda: Decimal(cost(c, "steady").get("totalUSD") or 0) >= Decimal("3.00") and
                            cost(c, "steady"), 60, interval=0.3, what="every increment of the 30 minutes charged")
            assert Decimal(owed["totalUSD"]) <= Decimal("3.10"), owed
            r = c.session().patch(c.url(f"{JOBS}/steady"), data=json.dumps({"spec": {"state": "Cancelled"}}),
                                  headers={"Content-Type": "application/merge-patch+json"})
            assert r.status_code == 200, r.text
            final = wait_for(lambda: (x := cost(c, "steady")).get("final") and x, 60, interval=0.3,
                             what="the final charge")
    finally:
        c.stop()

    async def stored() -> None:
        store = await SqliteStore.open(tmp_path / "data" / "store.db")
        try:
            ledger = Ledger(store)
            postings = await ledger.postings("default")
            keys = [p.key for p in postings]
            assert len(keys) == len(set(keys)), "a key is booked once"
            assert fold("default", postings) == await ledger.accounts("default"), "the balances are the postings"
            charges = [p for p in postings if p.kind is Kind.CHARGE]
            by_attempt: dict[str, list[int]] = {}
            for p in charges:
                by_attempt.setdefault(p.obj, []).append(int(p.key.rsplit("/", 1)[1]))
            for attempt, numbers in by_attempt.items():
                assert sorted(numbers) == list(range(1, max(numbers) + 1)), f"{attempt}: each increment once"
            job = orjson.loads((await store.get("jobs/default/steady")).value)  # type: ignore[union-attr]
            assert sum((p.amount for p in charges), Decimal(0)) == Decimal(job["status"]["cost"]["totalUSD"])
            assert Decimal(final["totalUSD"]) == Decimal(job["status"]["cost"]["totalUSD"])
            assert (await ledger.accounts("default")).held == 0, "the hold went back"
        finally:
            await store.close()

    asyncio.run(stored())


def test_a_sweeps_shared_cap_suspends_every_running_cell_and_a_raise_resumes_them(
        c: Coordinator, clock: Clock) -> None:
    """Two cells run at once at $6/h each under one $1.00 cap: each may spend only what the other has
    not, so both suspend through their checkpoints with MaxCostReached before the cells together pass
    the cap by more than an increment each; raising the Sweep's cap resumes them."""
    grant(c, "20.00")
    sweeps = JOBS.replace("/jobs", "/sweeps")
    body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "shared"}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["python3", "-c", STEPPER], "resources": {"cpu": "100m"},
                                             "recovery": {"checkpoint": {"interval": "1h"}}}},
        "matrix": {"params": {"SEED": ["1", "2"]}}, "maxParallel": 2, "maxCostUSD": "1.00"}}
    r = c.session().post(c.url(sweeps), json=body)
    assert r.status_code == 201, r.text

    def sweep() -> dict[str, Any]:
        return dict(c.session().get(c.url(f"{sweeps}/shared")).json().get("status") or {})

    wait_for(lambda: [cell["phase"] for cell in sweep().get("cells", [])] == ["Running", "Running"], 60, interval=0.3,
             what="both cells running")
    for _ in range(20):
        if sweep().get("reason") == "MaxCostReached":
            break
        clock.advance(60)
    capped = wait_for(lambda: (s := sweep()).get("reason") == "MaxCostReached" and
                      [cell["phase"] for cell in s["cells"]] == ["Suspended", "Suspended"] and s, 60, interval=0.3,
                      what="both cells suspended by the shared cap")
    assert capped["phase"] == "Suspended"
    for name in ("shared-0", "shared-1"):
        assert funded(get_job(c, name)["status"])["reason"] == "MaxCostReached"
    settled = wait_for(lambda: all(cost(c, n).get("heldUSD") == "0.00" for n in ("shared-0", "shared-1")) and
                       sweep(), 60, interval=0.3, what="the cells' holds released")
    assert Decimal(settled["cost"]["totalUSD"]) <= Decimal("1.00") + 2 * INCREMENT, settled["cost"]
    r = c.session().patch(c.url(f"{sweeps}/shared"), data=json.dumps({"spec": {"maxCostUSD": "5.00"}}),
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    wait_for(lambda: [cell["phase"] for cell in sweep().get("cells", [])] == ["Running", "Running"], 60,
             interval=0.3, what="the raise to resume both cells")
    assert sweep().get("phase") == "Running"
    r = c.session().patch(c.url(f"{sweeps}/shared"), data=json.dumps({"spec": {"state": "Cancelled"}}),
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    wait_for(lambda: sweep().get("phase") == "Cancelled", 60, interval=0.3, what="the Sweep cancelled")


def test_a_dry_run_while_every_node_is_busy_is_priced_as_the_offering_it_waits_for(c: Coordinator) -> None:
    grant(c, "5.00")
    whole = {"cpu": "2"}  # the node's whole measured CPU
    create(c, "busy", command=["python3", "-c", STEPPER], resources=whole)
    wait_for(lambda: get_job(c, "busy")["status"].get("phase") == "Running", 60, interval=0.2, what="busy running")
    body = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "later"},
            "spec": {"command": ["true"], "resources": whole, "expectedDuration": "10m"}}
    r = c.session().post(c.url(JOBS), json=body, params={"dryRun": "All"})
    assert r.status_code == 201, r.text
    estimate = r.json()["status"]["estimate"]
    assert estimate["placementPreview"]["offering"] == OFFERING, estimate
    assert estimate["rateUSDPerHour"] == "6.00" and Decimal(estimate["costUSD"]["p50"]) >= Decimal("1.00")  # 10 min + boot
    assert estimate["placementPreview"]["explain"].startswith("no capacity is free now; once it is:")
    assert "Unpriced" not in [w["code"] for w in estimate["warnings"]]
    r = c.session().patch(c.url(f"{JOBS}/busy"), data=json.dumps({"spec": {"state": "Cancelled"}}),
                          headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
