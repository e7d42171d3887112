"""Placement by price through the real coordinator (--price-book: the example book plus three offerings
this test machine's host fits) and three real agents joined with --simulate-gpus and --offering: one
cheap interruptible, one pricier on-demand, one fast. Cost picks the cheapest eligible offering, Speed
the fastest, Never never lands on the interruptible node, maxRateUSDPerHour filters, and the Job's
status.placement (read over REST, as kubectl does) shows the offering and its frozen rate. A node
kept warm after a Job with scaledownWindow is reused by its project and refused to another project
until the window has passed. A node joined with --pool PROJECT/NAME takes only that project's Jobs, and a
Job naming the pool goes there."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from conftest import job
from e2e import AGENT_ENV, JOBS, NS, attempts_of, create, get_job, grant, joined, settled, wait_status

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"
SPOT, ON_DEMAND, FAST = "a100-x1-dev-spot", "a100-x1-dev", "h100-x1-dev"


def _book(path: Path) -> Path:
    """The example book plus x1 offerings small enough for this host (1 vCPU, 1Gi) to fit."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    h100 = next(o for o in doc["offerings"] if o["id"] == "h100-sxm-80g-x1-us")

    def dev(oid: str, family: str, rate: str, speed: str, spot: bool = False) -> dict[str, Any]:
        o = dict(h100, id=oid, vcpu=1, memory="1Gi", disk="1Gi", rateUSDPerHour=rate, relativeSpeed=speed,
                 interruptible=spot)
        o["accelerator"] = dict(h100["accelerator"], id=f"nvidia-{family.lower()}-sxm-80g", family=family)
        if spot:
            o["interruptionsPerHour"] = "0.05"
        return o

    doc["offerings"] += [dev(SPOT, "A100", "1.10", "1", spot=True), dev(ON_DEMAND, "A100", "2.20", "1"),
                         dev(FAST, "H100", "4.00", "1.5")]
    doc["pricebookVersion"] = "2026-12-01-placement"
    path.write_text(yaml.safe_dump(doc))
    return path


def _agent(c: Coordinator, root: Path, name: str, gpu: str, offering: str, spot: bool = False) -> AgentProcess:
    return AgentProcess(root / name, c.grpc, c.join_token, node=name, env=AGENT_ENV, extra_args=(
        "--simulate-gpus", f"{gpu}:1:80Gi", "--offering", offering, "--region", "us",
        "--interruptible", "true" if spot else "false")).start()


def _run(c: Coordinator, name: str, **placement: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs a one-GPU Job under `placement` to the end; its status and its (only) attempt."""
    create(c, name, resources={"gpu": {"count": 1}}, placement=placement)
    status = settled(c, name)
    assert status["phase"] == "Succeeded", status
    (attempt,) = attempts_of(c, name)
    return status, attempt


def test_offerings_chosen_by_profile_and_policy(tmp_path: Path) -> None:
    book = _book(tmp_path / "pricebook.yaml")
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        grant(c)
        with joined([_agent(c, tmp_path, "n-spot", "A100", SPOT, spot=True),
                     _agent(c, tmp_path, "n-ondemand", "A100", ON_DEMAND),
                     _agent(c, tmp_path, "n-fast", "H100", FAST)], c):
            status, attempt = _run(c, "cheapest", profile="Cost", interruptible="Allow")
            assert status["placement"] == {"offering": SPOT, "rateUSDPerHour": "1.10", "regionClass": "us",
                                           "interruptible": True, "warmReuse": False}
            assert attempt["spec"]["node"] == "n-spot" and attempt["spec"]["rateUSDPerHour"] == "1.10"
            shown = c.run("kubectl", "get", "job", "cheapest", "-o",
                          "jsonpath={.status.placement.offering} {.status.placement.rateUSDPerHour}").stdout
            assert shown == f"{SPOT} 1.10"

            status, attempt = _run(c, "never", profile="Cost")  # interruptible defaults to Never
            assert status["placement"]["offering"] == ON_DEMAND and status["placement"]["rateUSDPerHour"] == "2.20"
            assert status["placement"]["interruptible"] is False and attempt["spec"]["node"] == "n-ondemand"
            explain = attempt["status"]["placement"]["explain"]
            assert f"offering {SPOT} is interruptible and placement.interruptible is Never" in explain
            assert f"n-fast: offering {FAST} ($4.00/h)" in explain and "more" in explain

            status, attempt = _run(c, "fastest", profile="Speed", interruptible="Allow")
            assert status["placement"]["offering"] == FAST and attempt["spec"]["node"] == "n-fast"
            assert "the earliest expected completion (Speed)" in attempt["status"]["placement"]["explain"]

            status, attempt = _run(c, "capped", profile="Speed", maxRateUSDPerHour="3.00")
            assert status["placement"]["offering"] == ON_DEMAND
            assert f"offering {FAST} costs $4.00/h, above placement.maxRateUSDPerHour $3.00" in \
                attempt["status"]["placement"]["explain"]

            create(c, "too-cheap", resources={"gpu": {"count": 1}}, placement={"maxRateUSDPerHour": "1.00"})
            waiting = wait_status(c, "too-cheap", lambda s: "maxRateUSDPerHour" in (s.get("message") or ""),
                                  what="the Job to say why nothing fits")
            assert waiting["phase"] == "Queued" and "placement" not in waiting
            assert f"offering {ON_DEMAND} costs $2.20/h, above placement.maxRateUSDPerHour $1.00" in waiting["message"]
            assert c.session().delete(c.url(f"{JOBS}/too-cheap")).status_code == 200
            assert get_job(c, "cheapest")["status"]["placement"]["offering"] == SPOT, "kept after the Job ended"


def test_without_a_price_book_the_job_has_no_placement_price(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start() as c:
        with joined([_agent(c, tmp_path, "n-spot", "A100", SPOT, spot=True)], c):
            status, attempt = _run(c, "free", profile="Cost")  # Never, but nothing is priced: placed as before
            assert "placement" not in status and attempt["spec"]["node"] == "n-spot"
            assert attempt["spec"]["offering"] == SPOT and "rateUSDPerHour" not in attempt["spec"]


def test_a_warm_node_is_reused_by_its_project_and_released_after_the_window(tmp_path: Path) -> None:
    book = _book(tmp_path / "pricebook.yaml")
    gate = tmp_path / "gate"
    hold = ["python3", "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"]
    one_gpu = {"gpu": {"count": 1}}
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        with joined([_agent(c, tmp_path, "n-ondemand", "A100", ON_DEMAND)], c):
            c.run("nodus", "project", "create", "other")
            grant(c)
            grant(c, project="other")
            other = c.session(c.grpc_token("other", "editor"))
            other_jobs = c.url(NS.replace("/default", "/other") + "/jobs")
            create(c, "first", command=hold, resources=one_gpu, scaledownWindow="6s")
            wait_status(c, "first", lambda s: s.get("phase") == "Running", what="the first Job to run")
            # Both wait for the only node while it is busy; the other project's Job is the older one.
            r = other.post(other_jobs, json=job("elsewhere", resources=one_gpu, placement={"profile": "Cost"}))
            assert r.status_code == 201, r.text
            # Its window is long enough for a loaded machine to show the other project's Job waiting on it.
            create(c, "second", resources=one_gpu, placement={"profile": "Speed"}, scaledownWindow="15s")
            wait_status(c, "second", lambda s: s.get("phase") == "Queued" and s.get("message"),
                        what="the second Job to wait for capacity")
            gate.touch()
            assert settled(c, "first")["placement"]["warmReuse"] is False
            second = settled(c, "second")
            assert second["phase"] == "Succeeded" and second["placement"]["warmReuse"] is True
            assert second["placement"]["offering"] == ON_DEMAND
            (attempt,) = attempts_of(c, "second")
            explain = attempt["status"]["placement"]["explain"]
            assert "reuses the node its project kept warm (scaledownWindow)" in explain

            def elsewhere() -> dict[str, Any]:
                got = other.get(f"{other_jobs}/elsewhere")
                assert got.status_code == 200, got.text
                return dict(got.json().get("status") or {})

            waited = wait_for(lambda: "kept warm for project default" in (elsewhere().get("message") or ""), 60,
                              interval=0.1, what="the other project's Job to say the node is kept warm")
            assert waited
            done = wait_for(lambda: (s := elsewhere()).get("phase") == "Succeeded" and s, 60, interval=0.2,
                            what="the other project's Job to run once the window has passed")
            assert done["placement"] == {"offering": ON_DEMAND, "rateUSDPerHour": "2.20", "regionClass": "us",
                                         "interruptible": False, "warmReuse": False}


def test_a_pool_node_takes_only_its_projects_jobs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold = ["python3", "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"]
    one_gpu = {"gpu": {"count": 1}}
    with Coordinator(tmp_path / "data").start() as c:
        pool = AgentProcess(tmp_path / "n-pool", c.grpc, c.join_token, node="n-pool", env=AGENT_ENV,
                            extra_args=("--pool", "default/own", "--simulate-gpus", "A100:1")).start()
        plain = AgentProcess(tmp_path / "n-plain", c.grpc, c.join_token, node="n-plain", env=AGENT_ENV,
                             extra_args=("--simulate-gpus", "A100:1")).start()
        with joined([pool, plain], c):
            c.run("nodus", "project", "create", "other")
            other = c.session(c.grpc_token("other", "editor"))
            other_jobs = c.url(NS.replace("/default", "/other") + "/jobs")

            def theirs() -> dict[str, Any]:
                got = other.get(f"{other_jobs}/theirs")
                assert got.status_code == 200, got.text
                return dict(got.json().get("status") or {})

            create(c, "busy", command=hold, resources=one_gpu)
            wait_status(c, "busy", lambda s: s.get("phase") == "Running", what="the busy Job to run")
            (busy,) = attempts_of(c, "busy")
            assert busy["spec"]["node"] == "n-plain", "equal nodes: the first by name"
            r = other.post(other_jobs, json=job("theirs", resources=one_gpu))
            assert r.status_code == 201, r.text
            waiting = wait_for(lambda: "dedicated to pool own of project default" in (theirs().get("message") or "")
                               and theirs(), 60, interval=0.1, what="the other project's Job to say why it waits")
            assert waiting["phase"] == "Queued"

            create(c, "mine", resources=one_gpu, placement={"pool": "own"})
            assert settled(c, "mine")["phase"] == "Succeeded"
            (mine,) = attempts_of(c, "mine")
            assert mine["spec"]["node"] == "n-pool"

            gate.touch()
            done = wait_for(lambda: (s := theirs()).get("phase") == "Succeeded" and s, 60, interval=0.2,
                            what="the other project's Job to run on the freed node")
            assert done["phase"] == "Succeeded"
            listed = other.get(c.url(NS.replace("/default", "/other") + "/attempts"),
                               params={"labelSelector": "nodus.dev/job=theirs"}).json()["items"]
            assert [a["spec"]["node"] for a in listed] == ["n-plain"]
