"""A Budget narrowed to one Sweep's cells (selector nodus.dev/sweep=NAME), through the real coordinator
with a price book and a real agent: the Sweep's dry run shows InsufficientCredits naming the Budget in
its blockingReasons (its cells are estimated with the labels the cell Jobs will carry), its create is
refused with the same words (402) instead of being admitted with cells that every create refuses, a
cell Job is refused by the Budget on its own, and another Sweep is not held back by it."""
from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from agent_double import wait_for
from conftest import Coordinator
from e2e import JOBS, grant, joined
from test_placement_price_e2e import ON_DEMAND, _agent, _book

SWEEPS = JOBS.replace("/jobs", "/sweeps")


def sweep(name: str) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "template": {"kind": "Job", "spec": {"command": ["python3", "-c", "pass"], "resources": {"gpu": {"count": 1}},
                                             "expectedDuration": "1h", "placement": {"profile": "Cost"}}},
        "matrix": {"params": {"LR": ["0.1", "0.01"]}}, "maxParallel": 2}}


def blocking(c: Coordinator, name: str) -> list[dict[str, Any]]:
    r = c.session().post(c.url(SWEEPS), json=sweep(name), params={"dryRun": "All"})
    assert r.status_code == 201, r.text
    return list(r.json()["status"]["estimate"]["blockingReasons"])


def test_a_budget_for_one_sweep_blocks_its_cells_and_no_other(tmp_path: Path) -> None:
    book = _book(tmp_path / "pricebook.yaml")
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        grant(c)
        c.run("nodus", "budgets", "set", "--project", "default", "--name", "grid-only", "--amount", "0.10",
              "--selector", "nodus.dev/sweep=grid")
        with joined([_agent(c, tmp_path, "n-ondemand", "A100", ON_DEMAND)], c):
            (reason,) = blocking(c, "grid")
            assert reason["code"] == "InsufficientCredits" and reason["budget"] == "grid-only", reason
            assert 'budget "grid-only" of project "default" (objects labelled nodus.dev/sweep=grid)' in reason["message"]
            assert "nodus budgets set --project default --name grid-only" in reason["fix"]
            assert blocking(c, "other") == [], "a Budget narrowed to another Sweep does not hold this one back"

            refused = c.session().post(c.url(SWEEPS), json=sweep("grid"))
            assert refused.status_code == 402 and refused.json()["reason"] == "InsufficientCredits", refused.text
            assert 'budget "grid-only"' in refused.json()["message"], refused.text
            # A cell Job as the Sweep controller creates it (its labels) is refused by the Budget on its own.
            cell = {"apiVersion": "nodus.dev/v1", "kind": "Job",
                    "metadata": {"name": "grid-0", "labels": {"nodus.dev/sweep": "grid", "nodus.dev/cell": "0"}},
                    "spec": sweep("grid")["spec"]["template"]["spec"]}
            r = c.session().post(c.url(JOBS), json=cell, params={"dryRun": "All"})
            assert r.status_code == 201 and [b["budget"] for b in r.json()["status"]["estimate"]["blockingReasons"]] \
                == ["grid-only"], r.text
            assert c.session().post(c.url(JOBS), json=cell).status_code == 402
            assert c.session().get(c.url(f"{SWEEPS}/grid")).status_code == 404


def test_a_budget_selecting_the_sweeps_own_label_caps_its_cells(tmp_path: Path) -> None:
    """The Sweep's labels (over its template's) reach every cell Job, so a Budget narrowed by one of them
    refuses the Sweep whose cells would pass it, and, raised, counts every cell's charge."""
    book = _book(tmp_path / "pricebook.yaml")
    labelled = sweep("vision")
    labelled["metadata"]["labels"] = {"team": "vision"}
    labelled["spec"]["template"]["metadata"] = {"labels": {"stage": "tune", "team": "other"}}
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        grant(c)
        c.run("nodus", "budgets", "set", "--project", "default", "--name", "team-vision", "--amount", "0.10",
              "--selector", "team=vision")
        with joined([_agent(c, tmp_path, "n-ondemand", "A100", ON_DEMAND)], c):
            r = c.session().post(c.url(SWEEPS), json=labelled, params={"dryRun": "All"})
            assert r.status_code == 201, r.text
            assert [b["budget"] for b in r.json()["status"]["estimate"]["blockingReasons"]] == ["team-vision"], r.text
            refused = c.session().post(c.url(SWEEPS), json=labelled)
            assert refused.status_code == 402 and 'budget "team-vision"' in refused.json()["message"], refused.text

            c.run("nodus", "budgets", "set", "--project", "default", "--name", "team-vision", "--amount", "50.00",
                  "--selector", "team=vision")
            created = c.session().post(c.url(SWEEPS), json=labelled)
            assert created.status_code == 201, created.text

            def cells() -> list[dict[str, Any]]:
                r = c.session().get(c.url(JOBS), params={"labelSelector": "nodus.dev/sweep=vision"})
                assert r.status_code == 200, r.text
                items = list(r.json()["items"])
                done = len(items) == 2 and all(((j.get("status") or {}).get("cost") or {}).get("final") for j in items)
                return items if done else []

            jobs = wait_for(cells, timeout=120, interval=0.5, what="both cells finished with their final cost")
            for job in jobs:
                assert job["status"]["phase"] == "Succeeded", job["status"]
                assert job["metadata"]["labels"] == {
                    "stage": "tune", "team": "vision", "nodus.dev/sweep": "vision",
                    "nodus.dev/cell": job["metadata"]["name"].removeprefix("vision-")}, job["metadata"]
            charged = sum(Decimal(j["status"]["cost"]["totalUSD"]) for j in jobs)
            assert charged > 0
            (budget,) = json.loads(c.run("nodus", "budgets", "-o", "json", "ls", "--project", "default").stdout)
            assert budget["name"] == "team-vision" and Decimal(budget["used_usd"]) == charged, (budget, charged)
