"""Budgets through the real daemons, on a clock the test moves forward: a Budget smaller than the
project's credits stops a running Job (Funded False, checkpoint, suspend) and refuses a second create
with the Budget named, a raised Budget resumes the Job from its checkpoint, and a Budget narrowed by a
selector leaves a Job without its label alone; operators manage them with `nodus budgets` and grpcurl,
customers see theirs in `nodus credits`.

The offering charges $6.00/h by the minute ($0.10 per increment); a first hold is 1.00 (ten minutes).
"""
from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Iterator

import pytest

from agent_double import wait_for
from conftest import Coordinator
from e2e import JOBS, grant
from offset_clock import Clock
from test_money_e2e import STEPPER, funded, money_fleet

pytestmark = pytest.mark.slow

PROJECT = "capped-team"
PS = "nodus.v1.ProjectService"


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> Clock:
    return Clock(tmp_path_factory.mktemp("clock") / "offset")


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[Coordinator]:
    with money_fleet(tmp_path_factory.mktemp("budgets"), clock, "b1") as coordinator:
        yield coordinator


def grpcurl(c: Coordinator, method: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    out = c.run("grpcurl", *c.grpcurl_tls(), "-format-error", "-H", f"authorization: Bearer {token}",
                "-d", json.dumps(body), c.grpc, f"{PS}/{method}", timeout=30)
    return dict(json.loads(out.stdout))


def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"command": ["python3", "-c", STEPPER], "recovery": {"checkpoint": {"interval": "1h"}}}}


def test_a_budget_stops_a_job_refuses_a_create_and_a_raise_resumes_it(c: Coordinator, clock: Clock) -> None:
    c.run("nodus", "project", "create", PROJECT)
    grant(c, "50.00", project=PROJECT)
    editor = c.session(c.grpc_token(PROJECT, "editor"))
    jobs = c.url(JOBS.replace("/default/", f"/{PROJECT}/"))
    # A budget for team b only, too small for any first hold, and one for the whole project.
    c.run("nodus", "budgets", "set", "--project", PROJECT, "--name", "team-b", "--amount", "0.10",
          "--selector", "team=b")
    out = c.run("nodus", "budgets", "set", "--project", PROJECT, "--name", "monthly", "--amount", "1.50").stdout
    assert "monthly" in out and "1.50 USD" in out

    # A team-b Job is refused by its budget, in a dry run's blockingReasons and on the real create.
    dry = editor.post(jobs + "?dryRun=All", json=job("bee", {"team": "b"}))
    assert dry.status_code == 201, dry.text
    (blocking,) = dry.json()["status"]["estimate"]["blockingReasons"]
    assert blocking["code"] == "InsufficientCredits" and 'budget "team-b"' in blocking["message"], blocking
    assert "nodus budgets set --project capped-team --name team-b" in blocking["fix"]
    refused = editor.post(jobs, json=job("bee", {"team": "b"}))
    assert refused.status_code == 402 and 'budget "team-b"' in refused.json()["message"], refused.text

    # A team-a Job does not count towards team-b: only "monthly" (1.50) limits it.
    assert editor.post(jobs, json=job("first", {"team": "a"})).status_code == 201

    def status(name: str) -> dict[str, Any]:
        return dict(editor.get(f"{jobs}/{name}").json().get("status") or {})

    wait_for(lambda: status("first").get("phase") == "Running", 60, interval=0.2, what="the first Job to run")
    for _ in range(30):
        if funded(status("first")).get("status") == "False":
            break
        clock.advance(60)
    stopped = status("first")
    assert funded(stopped)["reason"] == "InsufficientCredits", stopped
    assert 'budget "monthly"' in funded(stopped)["message"] and stopped.get("stopByTime"), stopped
    suspended = wait_for(lambda: (s := status("first")).get("phase") == "Suspended" and s, 60, interval=0.3,
                         what="the Job to suspend under its budget")
    (first,) = editor.get(c.url(f"/apis/nodus.dev/v1/namespaces/{PROJECT}/attempts")).json()["items"]
    assert first["status"].get("checkpoints"), "it checkpointed before it stopped"
    wait_for(lambda: status("first").get("cost", {}).get("heldUSD") == "0.00", 60, interval=0.3,
             what="the hold released")
    spent = Decimal(status("first")["cost"]["totalUSD"])
    assert spent <= Decimal("1.50"), suspended["cost"]
    credits = c.run("nodus", "-n", PROJECT, "credits").stdout
    assert Decimal(credits.splitlines()[1].split()[1]) > Decimal("45"), "the budget stopped it, not the credits"
    assert "monthly" in credits and f"{spent} USD" in credits, credits

    # A second create would pass the budget: refused, the budget named with its amounts.
    second = editor.post(jobs, json=job("second", {"team": "a"}))
    assert second.status_code == 402, second.text
    assert f'budget "monthly" of project "{PROJECT}" has used {spent} USD of its 1.50 USD' in second.json()["message"]

    # grpcurl: the operator lists the budgets and raises one; the Job resumes from its checkpoint.
    listed = grpcurl(c, "ListBudgets", {"project": PROJECT}, c.token)["budgets"]
    assert {b["name"]: b["used_usd"] for b in listed} == {"monthly": str(spent), "team-b": "0.00"}
    raised = grpcurl(c, "SetBudget", {"project": PROJECT, "name": "monthly", "amount_usd": "10.00"}, c.token)
    assert raised["left_usd"] == str(Decimal("10.00") - spent)
    wait_for(lambda: status("first").get("phase") == "Running", 60, interval=0.3, what="the raise to resume it")
    assert funded(status("first"))["status"] == "True"
    log = wait_for(lambda: "starts at step" in (out := c.run("nodus", "-n", PROJECT, "logs", "first", "--attempt",
                                                             "2", check=False).stdout) and out, 60, interval=0.3,
                   what="the resumed attempt's log")
    assert int(log.split("starts at step ")[1].split()[0]) > 0, "resumed from the checkpoint"
    # A customer's token may read its budgets but not set them; rm removes one.
    token = c.grpc_token(PROJECT, "admin")
    assert {b["name"] for b in grpcurl(c, "ListBudgets", {}, token)["budgets"]} == {"monthly", "team-b"}
    denied = c.run("grpcurl", *c.grpcurl_tls(), "-format-error", "-H", f"authorization: Bearer {token}", "-d",
                   json.dumps({"project": PROJECT, "name": "monthly", "amount_usd": "99.00"}), c.grpc,
                   f"{PS}/SetBudget", check=False, timeout=30)
    assert denied.returncode != 0 and "not a cluster operator" in denied.stderr, denied
    table = c.run("nodus", "budgets", "ls", "--project", PROJECT).stdout
    assert "team-b" in table and "team=b" in table and "(all)" in table and "10.00 USD" in table, table
    c.run("nodus", "budgets", "rm", "--project", PROJECT, "--name", "team-b")
    assert [b["name"] for b in grpcurl(c, "ListBudgets", {"project": PROJECT}, c.token)["budgets"]] == ["monthly"]
    r = editor.patch(f"{jobs}/first", data=json.dumps({"spec": {"state": "Cancelled"}}),
                     headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
