"""Sweeps through the real daemons: a 2 GPU × 2 regions × 2 params × 2 repetitions Sweep with maxParallel
2 on a loopback fleet of four agents, simulated A100s and H100s in regions us and eu, each sold as an
offering of a price book, creates one Job per cell (named `<sweep>-<index>`, labelled and owned by the
Sweep), never runs more than two cells at once, hands each cell its NODUS_PARAM_* and its GPU, runs each
cell on the node of its GPU type and region, charges each cell at its offering's rate, succeeds with
every cell, and names the best cells from the charged cost and the reported throughput; a suspended
Sweep suspends its running cells and resumes them; deleting a Sweep deletes its cells; a kill -9 of the
coordinator creates no cell twice."""
from __future__ import annotations

import json
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_double import AgentProcess, restart_ports, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, JOBS, attempts_of, get_job, grant, joined

pytestmark = pytest.mark.slow

SWEEPS = JOBS.replace("/jobs", "/sweeps")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"

CELL = textwrap.dedent("""
    import os, sys, time
    from nodus import progress
    log, lr = sys.argv[1], os.environ["NODUS_PARAM_LR"]
    name = os.environ.get("NODUS_JOB", "?")
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    with open(log, "a") as f:
        f.write(f"start {time.monotonic()} {lr} {name} {gpus or '-'}\\n")
    units = 10 if lr == "0.1" else 20  # the higher learning rate gets through twice the units
    for i in range(units):
        progress.report(stage="train", completed=i + 1, total=units)
    time.sleep(0.6)
    with open(log, "a") as f:
        f.write(f"end {time.monotonic()} {lr} {name} {gpus or '-'}\\n")
""")

# (node, GPU, region, offering, $/h): one node per grid point; a rate a whole number of cents a minute.
FLEET = (("n-a100-us", "A100", "us", "a100-x1-us-dev", "3.00"), ("n-a100-eu", "A100", "eu", "a100-x1-eu-dev", "3.60"),
         ("n-h100-us", "H100", "us", "h100-x1-us-dev", "6.00"), ("n-h100-eu", "H100", "eu", "h100-x1-eu-dev", "4.80"))


def price_book(path: Path) -> Path:
    """The example book plus one x1 offering per (GPU, region) small enough for this host (1 vCPU, 1Gi)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    h100 = next(o for o in doc["offerings"] if o["id"] == "h100-sxm-80g-x1-us")
    for _, gpu, region, offering, rate in FLEET:
        doc["offerings"].append(dict(h100, id=offering, vcpu=1, memory="1Gi", disk="1Gi", regionClass=region,
                                     rateUSDPerHour=rate, minimumCharge="1m", billingIncrement="60s",
                                     accelerator=dict(h100["accelerator"], id=f"nvidia-{gpu.lower()}-sxm-80g",
                                                      family=gpu)))
    doc["pricebookVersion"] = "2026-12-02-sweep"
    path.write_text(yaml.safe_dump(doc))
    return path


def sweep_body(name: str, log: Path, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["python3", "-c", CELL, str(log)]}},
        "matrix": {"gpu": [{"type": ["A100"], "count": 1}, {"type": ["H100"], "count": 1}],
                   "regions": ["us", "eu"], "params": {"LR": ["0.1", "0.2"]}},
        "repetitions": 2, "maxParallel": 2, **spec}}


def sweep_status(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{SWEEPS}/{name}"))
    assert r.status_code == 200, r.text
    return dict(r.json().get("status") or {})


def most_at_once(log: Path) -> int:
    events = sorted((float(line.split()[1]), 1 if line.startswith("start") else -1)
                    for line in log.read_text().splitlines())
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def units_done(job: dict[str, Any]) -> int:
    return int(job["status"]["progress"]["units"]["completed"])


def test_a_sweep_runs_every_cell_within_max_parallel_and_names_the_best(tmp_path: Path) -> None:
    log = tmp_path / "cells.log"
    book = price_book(tmp_path / "pricebook.yaml")
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        grant(c, "100.00")
        agents = [AgentProcess(tmp_path / node, c.grpc, c.join_token, node=node, env=AGENT_ENV, extra_args=(
            "--simulate-gpus", f"{gpu}:1:80Gi", "--offering", offering, "--region", region)).start()
            for node, gpu, region, offering, _ in FLEET]
        with joined(agents, c):
            r = c.session().post(c.url(SWEEPS), json=sweep_body("grid", log))
            assert r.status_code == 201, r.text
            wait_for(lambda: sweep_status(c, "grid").get("phase") == "Succeeded", 300, interval=0.5,
                     what="the Sweep to succeed")
            # The final charges post after the cells end; the Sweep's rows follow the cells' status.cost.
            jobs = wait_for(lambda: (js := [get_job(c, f"grid-{i}") for i in range(16)]) and
                            all(j["status"].get("cost", {}).get("final") for j in js) and js, 60, interval=0.5,
                            what="every cell's final charge")
            charged = {i: Decimal(j["status"]["cost"]["totalUSD"]) for i, j in enumerate(jobs)}
            done = wait_for(lambda: (s := sweep_status(c, "grid")) and
                            [Decimal(cell["costUSD"]) for cell in s["cells"]] == list(charged.values()) and s, 60,
                            interval=0.5, what="the Sweep's rows to show the charged costs")
            cells = done["cells"]
            assert [cell["index"] for cell in cells] == list(range(16))
            assert all(cell["phase"] == "Succeeded" for cell in cells), cells
            assert most_at_once(log) <= 2, "maxParallel 2: never more than two cells at once"
            # The index order: GPU outermost, then the region, then the params, the repetition innermost.
            assert [(cell["gpu"], cell["region"], cell["params"]["LR"], cell["repetition"]) for cell in cells[:6]] == [
                ("A100:1", "us", "0.1", 0), ("A100:1", "us", "0.1", 1), ("A100:1", "us", "0.2", 0),
                ("A100:1", "us", "0.2", 1), ("A100:1", "eu", "0.1", 0), ("A100:1", "eu", "0.1", 1)]
            assert cells[8]["gpu"] == "H100:1" and cells[8]["region"] == "us"
            rates = {(gpu, region): (node, Decimal(rate)) for node, gpu, region, _, rate in FLEET}
            seen = {line.split()[3]: line.split()[4] for line in log.read_text().splitlines()
                    if line.startswith("start")}
            for cell, job in zip(cells, jobs):
                assert job["metadata"]["labels"] == {"nodus.dev/sweep": "grid", "nodus.dev/cell": str(cell["index"])}
                assert job["metadata"]["ownerReferences"][0]["kind"] == "Sweep"
                env = {e["name"]: e.get("value") for e in job["spec"].get("env") or []}
                assert env["NODUS_PARAM_LR"] == cell["params"]["LR"]
                assert job["spec"]["placement"]["regions"] == [cell["region"]]
                assert seen[cell["object"]] == "0", "the cell's program sees its one GPU"
                node, rate = rates[(cell["gpu"].split(":")[0], cell["region"])]
                (attempt,) = attempts_of(c, cell["object"])
                assert attempt["spec"]["node"] == node, "each cell runs on its GPU type in its region"
                assert Decimal(attempt["spec"]["rateUSDPerHour"]) == rate
                assert charged[cell["index"]] > 0, "every cell is charged"
            # best: computed here from what each cell was charged and what it reported.
            per_unit = {i: charged[i] / units_done(j) for i, j in enumerate(jobs)}
            assert done["best"]["byCost"] == min(per_unit, key=lambda i: (per_unit[i], i))
            fastest = max(cells, key=lambda cell: (Decimal(cell["unitsPerSecond"]), -cell["index"]))
            assert done["best"]["byThroughput"] == fastest["index"]
            assert Decimal(done["cost"]["totalUSD"]) == sum(charged.values())
            # The CLI: the Sweep's row (cells done/total, cost, best), then its cell table with the best marked.
            shown = c.run("nodus", "get", "sweep", "grid").stdout.splitlines()
            assert shown[0].split()[:5] == ["NAME", "PHASE", "CELLS", "COST", "BEST"]
            assert shown[1].split()[:4] == ["grid", "Succeeded", "16/16", done["cost"]["totalUSD"]]
            assert f"speed:{fastest['index']}" in shown[1]
            table = shown[shown.index("") + 1:]
            assert table[0].split() == ["INDEX", "PARAMS", "GPU", "REGION", "REP", "PHASE", "COST", "UNITS/S", "BEST"]
            marked = next(line for line in table[1:] if line.split()[0] == str(fastest["index"]))
            assert "*" in marked and "throughput" in marked and "LR=" in marked

            # Deleting the Sweep deletes its cells.
            assert c.session().delete(c.url(f"{SWEEPS}/grid")).status_code == 200
            wait_for(lambda: not [j for j in c.session().get(c.url(JOBS)).json()["items"]
                                  if j["metadata"].get("labels", {}).get("nodus.dev/sweep") == "grid"], 60,
                     interval=0.3, what="the cells to be deleted with their Sweep")


def test_a_suspended_sweep_suspends_its_cells_and_resumes_them(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold = ["python3", "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"]
    with Coordinator(tmp_path / "data").start() as c:
        with joined([AgentProcess(tmp_path / "n1", c.grpc, c.join_token, node="n1", env=AGENT_ENV).start()], c):
            body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "held"}, "spec": {
                "template": {"kind": "Job", "spec": {"command": hold}},
                "matrix": {"params": {"SEED": ["1", "2", "3"]}}, "maxParallel": 2}}
            assert c.session().post(c.url(SWEEPS), json=body).status_code == 201
            wait_for(lambda: sum(cell["phase"] == "Running" for cell in sweep_status(c, "held").get("cells", [])) == 2,
                     60, interval=0.3, what="two cells running")
            patch = {"Content-Type": "application/merge-patch+json"}
            r = c.session().patch(c.url(f"{SWEEPS}/held"), data=json.dumps({"spec": {"state": "Suspended"}}),
                                  headers=patch)
            assert r.status_code == 200, r.text
            suspended = wait_for(lambda: (s := sweep_status(c, "held")).get("phase") == "Suspended" and
                                 [cell["phase"] for cell in s["cells"]] == ["Suspended", "Suspended", "Pending"] and s,
                                 60, interval=0.3, what="the running cells to suspend, and no new cell")
            assert get_job(c, "held-0")["spec"]["state"] == "Suspended"
            assert suspended["reason"] == "Suspended"
            r = c.session().patch(c.url(f"{SWEEPS}/held"), data=json.dumps({"spec": {"state": "Running"}}),
                                  headers=patch)
            assert r.status_code == 200, r.text
            gate.touch()
            done = wait_for(lambda: (s := sweep_status(c, "held")).get("phase") == "Succeeded" and s, 120,
                            interval=0.3, what="the resumed Sweep to finish")
            assert [cell["phase"] for cell in done["cells"]] == ["Succeeded"] * 3
            assert len(attempts_of(c, "held-0")) == 2, "the suspended cell resumed with a new attempt"


def test_a_kill_9_of_the_coordinator_mid_sweep_creates_no_cell_twice_and_the_sweep_finishes(tmp_path: Path) -> None:
    log = tmp_path / "cells.log"
    port = restart_ports()
    c = Coordinator(tmp_path / "data").start(grpc_port=port)
    try:
        with joined([AgentProcess(tmp_path / "n1", c.grpc, c.join_token, node="n1", env=AGENT_ENV).start()], c):
            body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "tough"}, "spec": {
                "template": {"kind": "Job", "spec": {"command": ["python3", "-c", CELL, str(log)]}},
                "matrix": {"params": {"LR": ["0.1", "0.2", "0.3"]}}, "repetitions": 2, "maxParallel": 3}}
            assert c.session().post(c.url(SWEEPS), json=body).status_code == 201
            wait_for(lambda: any(cell["phase"] == "Running" for cell in sweep_status(c, "tough").get("cells", [])),
                     60, interval=0.1, what="a cell running")
            c.kill()  # mid-Sweep: cells created, some running, the rest not yet
            c.start(grpc_port=port)
            done = wait_for(lambda: (s := sweep_status(c, "tough")).get("phase") == "Succeeded" and s, 180,
                            interval=0.5, what="the Sweep to finish after the restart")
            cells = [j for j in c.session().get(c.url(JOBS)).json()["items"]
                     if j["metadata"].get("labels", {}).get("nodus.dev/sweep") == "tough"]
            assert sorted(j["metadata"]["name"] for j in cells) == [f"tough-{i}" for i in range(6)]
            assert all(cell["phase"] == "Succeeded" for cell in done["cells"])
            starts = [line for line in log.read_text().splitlines() if line.startswith("start")]
            assert len(starts) == 6, "every cell ran once: a running cell was re-adopted, not started again"
    finally:
        c.stop()
