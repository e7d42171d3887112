"""`nodus checkpoint now JOB`: the `nodus.dev/checkpoint-requested-at` annotation takes a checkpoint of
the running attempt at once (reason Requested, beside the hourly cadence) and is recorded in
status.handledRequests; a bad value or a Job without checkpoints is refused at admission naming the
annotation. The pure parts first, then through the daemons and the installed CLI."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conftest import Coordinator
from e2e import JOBS, MERGE, attempts_of, create, get_job, start_agent, units, wait_job
from nodus.coordinator.clock import rfc3339
from nodus.coordinator.controllers.attempts import AttemptPhase
from nodus.coordinator.controllers.job_requests import checkpoint_handled, pending_checkpoint
from nodus.coordinator.controllers.views import AttemptView

T = 1_767_225_600.0
ASKED = rfc3339(T)


def attempt(phase: str = "Running", checkpoint_at: float | None = None, rank: int | None = None) -> AttemptView:
    spec: dict[str, Any] = {"job": "j", "jobUID": "u", "index": 0, "number": 1, "id": "a1", "node": "n"}
    if rank is not None:
        spec["gang"] = {"epoch": 1, "rank": rank, "size": 2}
    status: dict[str, Any] = {"phase": phase}
    if checkpoint_at is not None:
        status["checkpoints"] = [{"seq": 1, "time": rfc3339(checkpoint_at)}]
    return AttemptView.from_object({"metadata": {"name": f"j-0-{rank or 0}", "namespace": "p"},
                                    "spec": spec, "status": status})


def test_a_request_is_handled_once_every_checkpointing_attempt_took_one_after_it() -> None:
    assert pending_checkpoint({"nodus.dev/checkpoint-requested-at": ASKED}, {}) == T
    assert pending_checkpoint({"nodus.dev/checkpoint-requested-at": ASKED}, {"checkpoint": ASKED}) is None
    assert pending_checkpoint({}, {}) is None

    assert checkpoint_handled(ASKED, {}, [attempt()], ended=False) is None, "no checkpoint yet"
    assert checkpoint_handled(ASKED, {}, [attempt(checkpoint_at=T - 60)], ended=False) is None, "an older one"
    assert checkpoint_handled(ASKED, {}, [attempt(checkpoint_at=T + 2)], ended=False) == ASKED
    assert checkpoint_handled(ASKED, {"checkpoint": ASKED}, [attempt(checkpoint_at=T + 2)], ended=False) is None
    # Nothing running: taken when the Job runs again, or handled once it has ended.
    assert checkpoint_handled(ASKED, {}, [attempt("Pending")], ended=False) is None
    assert checkpoint_handled(ASKED, {}, [], ended=True) == ASKED
    # A gang's Snapshot is rank 0's: the other ranks take none.
    assert checkpoint_handled(ASKED, {}, [attempt(checkpoint_at=T + 1, rank=0), attempt(rank=1)], ended=False) == ASKED
    assert AttemptPhase.RUNNING.value == "Running"


PROGRAM = r"""
import os, signal, sys, time
from nodus import progress
path = os.path.join(os.environ["NODUS_STATE_DIR"], "counter")
n = int(open(path).read()) if os.path.exists(path) else 0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    progress.report(stage="count", completed=n, total=100_000)
    time.sleep(0.1)
"""


def test_checkpoint_now_takes_one_at_once_and_records_it(coordinator: Coordinator, tmp_path: Path) -> None:
    c = coordinator
    with start_agent(c, tmp_path / "agent"):
        create(c, "asked", command=[sys.executable, "-c", PROGRAM],
               recovery={"checkpoint": {"interval": "1h"}})
        wait_job(c, "asked", lambda j: units(j) >= 3, what="the program to count")
        done = c.run("nodus", "checkpoint", "now", "asked", timeout=120)
        assert "job asked: checkpoint taken (checkpoint 1)" in done.stdout, done.stdout + done.stderr
        job = get_job(c, "asked")
        value = job["metadata"]["annotations"]["nodus.dev/checkpoint-requested-at"]
        assert job["status"]["handledRequests"] == {"checkpoint": value}
        [record] = attempts_of(c, "asked")[0]["status"]["checkpoints"]
        assert record["reason"] == "Requested" and record["time"] >= value
        table = c.run("nodus", "checkpoint", "ls", "--job", "asked").stdout.splitlines()
        assert table[1].split()[3] == "Requested", table
        # A second request takes a second checkpoint; the cadence (1h) would not have.
        again = c.run("nodus", "checkpoint", "now", "asked", timeout=120)
        assert "checkpoint taken (checkpoint 2)" in again.stdout, again.stdout + again.stderr
        c.run("nodus", "cancel", "asked")

    r = c.session().patch(c.url(f"{JOBS}/asked"), headers=MERGE,
                          json={"metadata": {"annotations": {"nodus.dev/checkpoint-requested-at": "soon"}}})
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"][0]["field"] == "metadata.annotations[nodus.dev/checkpoint-requested-at]"
    none = c.session().post(c.url(JOBS), json={
        "apiVersion": "nodus.dev/v1", "kind": "Job",
        "metadata": {"name": "stateless", "annotations": {"nodus.dev/checkpoint-requested-at": ASKED}},
        "spec": {"command": ["true"], "recovery": {"continuity": "Restartable"}}})
    assert none.status_code == 422 and "keeps no checkpoints" in none.text, none.text
