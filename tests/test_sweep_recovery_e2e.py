"""A Sweep's cells through faults, with the real daemons: a cell whose node is lost (the agent and its
workload killed with SIGKILL, the lease run out) is recovered by its Job's own recovery policy on the
other node and the Sweep still succeeds; a cell whose program fails for the customer is reported, the
other cells run on to Succeeded, and only then does the Sweep end Failed/CellsFailed naming that cell."""
from __future__ import annotations

import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, JOBS, attempts_of, get_job, joined
from test_node_loss import kill_workload
from nodus.coordinator.clock import parse

pytestmark = pytest.mark.slow

SWEEPS = JOBS.replace("/jobs", "/sweeps")

GATED = textwrap.dedent("""
    import os, sys, time
    log, gate, seed = sys.argv[1], sys.argv[2], os.environ["NODUS_PARAM_SEED"]
    with open(log, "a") as f:
        f.write(f"start {os.environ['NODUS_JOB']} {os.environ['NODUS_ATTEMPT_NUMBER']} {os.getpid()}\\n")
    if seed == sys.argv[3]:
        raise SystemExit(1)  # this cell's parameter breaks the program: the customer's failure
    while not os.path.exists(gate):
        time.sleep(0.05)
""")
"""argv: LOG GATE FAILING_SEED: the cell whose SEED is FAILING_SEED exits 1 at once; the others wait for GATE."""


def sweep(c: Coordinator, name: str, log: Path, gate: Path, failing: str, seeds: list[str]) -> None:
    body = {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["python3", "-c", GATED, str(log), str(gate), failing],
                                             "backoffLimit": 0}},
        "matrix": {"params": {"SEED": seeds}}, "maxParallel": 1}}
    r = c.session().post(c.url(SWEEPS), json=body)
    assert r.status_code == 201, r.text


def sweep_status(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{SWEEPS}/{name}"))
    assert r.status_code == 200, r.text
    return dict(r.json().get("status") or {})


def starts(log: Path) -> list[list[str]]:
    return [line.split()[1:] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_cell_whose_node_is_lost_is_recovered_on_the_other_node_and_the_sweep_succeeds(tmp_path: Path) -> None:
    log, gate = tmp_path / "cells.log", tmp_path / "gate"
    with (Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "2s", "--heartbeat-interval",
                                                           "0.5s")) as c,
          joined([AgentProcess(tmp_path / n, c.grpc, c.join_token, node=n, env=AGENT_ENV).start()
                  for n in ("node-a", "node-b")], c) as started):
        agents = {a.node: a for a in started}
        sweep(c, "lossy", log, gate, "none", ["1", "2"])
        wait_for(lambda: len(starts(log)) == 1, 60, interval=0.1, what="the first cell to start")
        (first,) = attempts_of(c, "lossy-0")
        victim = agents[first["spec"]["node"]]
        other = next(name for name in agents if name != victim.node)

        # The whole node goes: the agent, its supervisors and the cell's program, with no goodbye.
        assert victim.signal(signal.SIGKILL) == -signal.SIGKILL
        kill_workload(int(starts(log)[0][2]))
        lost = wait_for(lambda: next((a for a in attempts_of(c, "lossy-0") if a["spec"]["number"] == 1 and
                                      (a.get("status") or {}).get("phase") == "Lost"), None), 30, interval=0.2,
                        what="the cell's attempt to be Lost once the node's lease runs out")
        assert lost["status"]["reason"] == "NodeLost", lost["status"]
        wait_for(lambda: len(starts(log)) == 2, 60, interval=0.1, what="the cell's replacement to start")
        assert starts(log)[1][:2] == ["lossy-0", "2"], "the same cell, its second attempt"
        during = sweep_status(c, "lossy")
        assert during["phase"] == "Running" and during["cells"][0]["phase"] != "Failed", during
        gate.touch()

        done = wait_for(lambda: (s := sweep_status(c, "lossy")).get("phase") in ("Succeeded", "Failed") and s, 120,
                        interval=0.3, what="the Sweep to finish")
        assert done["phase"] == "Succeeded" and "reason" not in done, done
        assert [cell["phase"] for cell in done["cells"]] == ["Succeeded", "Succeeded"]
        attempts = attempts_of(c, "lossy-0")
        assert [(a["spec"]["number"], a["status"]["phase"]) for a in attempts] == [(1, "Lost"), (2, "Succeeded")]
        assert attempts[1]["spec"]["node"] == other, "the replacement ran on the node that was left"
        cell = get_job(c, "lossy-0")["status"]
        assert cell["phase"] == "Succeeded" and cell.get("failed", 0) == 0, "lost capacity is not the customer's failure"
        assert [line[0] for line in starts(log)] == ["lossy-0", "lossy-0", "lossy-1"]


def test_a_customer_failure_ends_the_sweep_failed_naming_the_cell_after_the_others_finished(tmp_path: Path) -> None:
    log, gate = tmp_path / "cells.log", tmp_path / "gate"
    with Coordinator(tmp_path / "data").start() as c:
        with joined([AgentProcess(tmp_path / "n1", c.grpc, c.join_token, node="n1", env=AGENT_ENV).start()], c):
            sweep(c, "broken", log, gate, "1", ["1", "2", "3"])  # cell 0 (SEED=1) exits 1
            # The Sweep goes on past its failed cell: the next one runs while cell 0 is already Failed.
            going = wait_for(lambda: (s := sweep_status(c, "broken")).get("cells") and
                             [cell["phase"] for cell in s["cells"]][:2] == ["Failed", "Running"] and s, 60,
                             interval=0.2, what="cell 0 Failed and cell 1 running")
            assert going["phase"] == "Running" and "reason" not in going, going
            gate.touch()
            done = wait_for(lambda: (s := sweep_status(c, "broken")).get("phase") in ("Succeeded", "Failed") and s,
                            120, interval=0.3, what="the Sweep to finish")
            assert [cell["phase"] for cell in done["cells"]] == ["Failed", "Succeeded", "Succeeded"], done["cells"]
            assert (done["phase"], done["reason"]) == ("Failed", "CellsFailed"), done
            assert "broken-0" in done["message"] and "broken-1" not in done["message"], done["message"]
            failed = next(cond for cond in done["conditions"] if cond["type"] == "Failed")
            assert failed["status"] == "True" and failed["reason"] == "CellsFailed" and "broken-0" in failed["message"]
            # As instants, not strings: RFC 3339 drops trailing zeros ("29.04Z" is before "29.042Z").
            ends = [parse(get_job(c, f"broken-{i}")["status"]["completionTime"]) for i in range(3)]
            assert ends[0] <= ends[1] <= ends[2] <= parse(done["completionTime"]), (ends, done["completionTime"])
            assert get_job(c, "broken-0")["status"]["reason"] == "BackoffLimitExceeded"
            assert [line[0] for line in starts(log)] == ["broken-0", "broken-1", "broken-2"], "each cell ran once"
