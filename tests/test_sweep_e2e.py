"""Sweeps through the real daemons: a 2 GPU × 2 params × 2 repetitions Sweep with maxParallel 2 on a
loopback fleet of two agents with simulated A100s and H100s creates one Job per cell (named
`<sweep>-<index>`, labelled and owned by the Sweep), never runs more than two cells at once, hands each
cell its NODUS_PARAM_* and its GPU, succeeds with every cell, and names the best cells from what they
reported; a suspended Sweep suspends its running cells and resumes them; deleting a Sweep deletes its
cells."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agent_double import AgentProcess, free_port, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, JOBS, attempts_of, get_job, joined

pytestmark = pytest.mark.slow

SWEEPS = JOBS.replace("/jobs", "/sweeps")

CELL = textwrap.dedent("""
    import os, sys, time
    from nodus import progress
    log, lr = sys.argv[1], os.environ["NODUS_PARAM_LR"]
    name = os.environ.get("NODUS_JOB", "?")
    with open(log, "a") as f:
        f.write(f"start {time.monotonic()} {lr}\\n")
    units = 10 if lr == "0.1" else 20  # the higher learning rate gets through twice the units
    for i in range(units):
        progress.report(stage="train", completed=i + 1, total=units)
    time.sleep(0.6)
    with open(log, "a") as f:
        f.write(f"end {time.monotonic()} {lr}\\n")
""")


def sweep_body(name: str, log: Path, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["python3", "-c", CELL, str(log)]}},
        "matrix": {"gpu": [{"type": ["A100"], "count": 1}, {"type": ["H100"], "count": 1}],
                   "params": {"LR": ["0.1", "0.2"]}},
        "repetitions": 2, "maxParallel": 2, **spec}}


def sweep_status(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{SWEEPS}/{name}"))
    assert r.status_code == 200, r.text
    return dict(r.json().get("status") or {})


def most_at_once(log: Path) -> int:
    events = sorted((float(t), 1 if kind == "start" else -1) for kind, t, _ in
                    (line.split() for line in log.read_text().splitlines()))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_a_sweep_runs_every_cell_within_max_parallel_and_names_the_best(tmp_path: Path) -> None:
    log = tmp_path / "cells.log"
    with Coordinator(tmp_path / "data").start() as c:
        agents = [AgentProcess(tmp_path / n, c.grpc, c.join_token, node=n, env=AGENT_ENV,
                               extra_args=("--simulate-gpus", f"{gpu}:1")).start()
                  for n, gpu in (("n-a100", "A100"), ("n-h100", "H100"))]
        with joined(agents, c):
            r = c.session().post(c.url(SWEEPS), json=sweep_body("grid", log))
            assert r.status_code == 201, r.text
            done = wait_for(lambda: (s := sweep_status(c, "grid")).get("phase") == "Succeeded" and s, 240,
                            interval=0.5, what="the Sweep to succeed")
            cells = done["cells"]
            assert [cell["index"] for cell in cells] == list(range(8))
            assert all(cell["phase"] == "Succeeded" for cell in cells), cells
            assert most_at_once(log) <= 2, "maxParallel 2: never more than two cells at once"
            # The index order: GPU outermost, then the params, the repetition innermost.
            assert [(cell["gpu"], cell["params"]["LR"], cell["repetition"]) for cell in cells[:4]] == [
                ("A100:1", "0.1", 0), ("A100:1", "0.1", 1), ("A100:1", "0.2", 0), ("A100:1", "0.2", 1)]
            for cell in cells:
                job = get_job(c, cell["object"])
                assert job["metadata"]["labels"] == {"nodus.dev/sweep": "grid", "nodus.dev/cell": str(cell["index"])}
                assert job["metadata"]["ownerReferences"][0]["kind"] == "Sweep"
                env = {e["name"]: e.get("value") for e in job["spec"].get("env") or []}
                assert env["NODUS_PARAM_LR"] == cell["params"]["LR"]
                (attempt,) = attempts_of(c, cell["object"])
                assert attempt["spec"]["node"] == ("n-a100" if cell["gpu"] == "A100:1" else "n-h100"), \
                    "each cell runs on its GPU"
            fastest = max(cells, key=lambda cell: (float(cell["unitsPerSecond"]), -cell["index"]))
            assert done["best"]["byThroughput"] == fastest["index"]
            assert done["best"]["byCost"] in range(8)  # no price book: every cell cost 0.00
            assert done["cost"]["totalUSD"] == "0.00"
            # The CLI: the Sweep's row (cells done/total, cost, best), then its cell table with the best marked.
            shown = c.run("nodus", "get", "sweep", "grid").stdout.splitlines()
            assert shown[0].split()[:5] == ["NAME", "PHASE", "CELLS", "COST", "BEST"]
            assert shown[1].split()[:4] == ["grid", "Succeeded", "8/8", "0.00"]
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
    port = free_port()
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
