"""Recovery end to end: a real coordinator and real agents; the program keeps a counter in
$NODUS_STATE_DIR, and what must not be lost is the count it reached before a suspend or a node loss."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Coordinator, job
from e2e import JOBS, attempts_of, joined, patch_state, start_agent, suspend, units, wait_events, wait_job
from agent_double import AgentProcess, wait_for

# Counts to TARGET, one step every 0.1 s, keeping the count in the state dir (written atomically);
# records where each run started, so the test sees what a resumed run restored.
COUNTER = r"""
import json, os, signal, sys, time
from nodus import progress
state = os.environ["NODUS_STATE_DIR"]
path = os.path.join(state, "counter")
target = int(sys.argv[2])
n = int(open(path).read()) if os.path.exists(path) else 0
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"attempt": os.environ["NODUS_ATTEMPT_NUMBER"], "start": n}) + "\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while n < target:
    n += 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(n))
    os.replace(tmp, path)
    progress.report(stage="count", completed=n, total=target)
    time.sleep(0.1)
print("reached", n, flush=True)
"""


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with start_agent(coordinator, tmp_path / "agent", "recovery-node") as a:
        yield a


def starts(marker: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in marker.read_text().splitlines() if line.strip()]


def test_suspend_checkpoints_and_resume_restores(coordinator: Coordinator, agent: AgentProcess,
                                                 tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    body = job("count", command=[sys.executable, "-c", COUNTER, str(marker), "60"])
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_job(coordinator, "count", lambda j: units(j) >= 8, what="the counter to pass 8")

    j = suspend(coordinator, "count")
    first = attempts_of(coordinator, "count")[0]
    assert first["status"]["phase"] == "Cancelled" and first["status"]["reason"] == "Suspended", first["status"]
    committed = first["status"]["checkpoints"]
    assert [c["seq"] for c in committed] == [1] and committed[0]["reason"] == "Suspend"
    assert committed[0]["uri"] == "blob://sha256/" + committed[0]["sha256"] and committed[0]["size"] > 0
    assert j["status"]["checkpoint"]["seq"] == 1 and j["status"]["checkpoint"]["size"] == committed[0]["size"]
    assert j["status"]["storage"]["bytes"] >= committed[0]["size"]
    suspended_at = units(j)
    assert suspended_at >= 8

    patch_state(coordinator, "count", "Running")
    j = wait_job(coordinator, "count", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"),
                 timeout=90, what="the resumed Job to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert j["status"]["checkpoint"]["restoredFromSeq"] == 1
    runs = starts(marker)
    assert [r["attempt"] for r in runs] == ["1", "2"]
    assert runs[0]["start"] == 0
    # The resumed run started from the checkpointed count: what ran before the suspend was not lost.
    assert 8 <= runs[1]["start"] <= suspended_at, runs
    second = attempts_of(coordinator, "count")[1]
    assert second["status"]["restoredFromSeq"] == 1
    reasons = [e["reason"] for e in wait_events(coordinator, "count", {"Checkpointed", "Suspended", "Resumed",
                                                                        "Succeeded"})]
    assert reasons.index("Checkpointed") < reasons.index("Resumed") < reasons.index("Succeeded"), reasons
    described = coordinator.run("kubectl", "describe", "job.nodus.dev", "count").stdout
    assert "Events:" in described and "saved checkpoint 1 (Suspend)" in described, described[-2000:]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Coordinator, dict[str, AgentProcess]]]:
    """A coordinator with short leases and two real agents."""
    with Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "2s", "--heartbeat-interval",
                                                          "0.4s")) as c:
        with joined([AgentProcess(tmp_path / n, c.grpc, c.join_token, node=n).start()
                     for n in ("node-a", "node-b")], c) as started:
            yield c, {a.node: a for a in started}


def node_of(c: Coordinator, name: str, number: int) -> str:
    found = [a for a in attempts_of(c, name) if a["spec"]["number"] == number]
    return found[0]["spec"].get("node", "") if found else ""


def test_reclaim_with_grace_checkpoints_then_replaces_elsewhere(cluster: tuple[Coordinator, dict[str, AgentProcess]],
                                                                tmp_path: Path) -> None:

    from nodus.v1 import node_pb2, node_pb2_grpc

    c, agents = cluster
    marker = tmp_path / "starts"
    assert c.session().post(c.url(JOBS), json=job("reclaimed", command=[sys.executable, "-c", COUNTER, str(marker),
                                                                        "50"])).status_code == 201
    wait_job(c, "reclaimed", lambda j: units(j) >= 8, what="the counter to pass 8")
    first_node = node_of(c, "reclaimed", 1)
    with c.channel() as channel:
        node_pb2_grpc.NodeServiceStub(channel).Reclaim(
            node_pb2.ReclaimRequest(name=first_node, grace_seconds=20, message="spot capacity reclaimed"),
            metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)
    j = wait_job(c, "reclaimed", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=90,
                 what="the replacement to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    first, second = attempts_of(c, "reclaimed")[:2]
    assert first["status"]["phase"] == "Lost" and first["status"]["reason"] == "Preempted", first["status"]
    assert [(cp["seq"], cp["reason"]) for cp in first["status"]["checkpoints"]] == [(1, "Preemption")]
    assert second["spec"]["node"] != first_node and second["status"]["restoredFromSeq"] == 1
    assert j["status"]["checkpoint"]["restoredFromSeq"] == 1
    runs = starts(marker)
    assert runs[0]["start"] == 0 and runs[1]["start"] >= 8, runs


def test_node_loss_replacement_on_another_node_restores_the_latest(
        cluster: tuple[Coordinator, dict[str, AgentProcess]], tmp_path: Path) -> None:
    c, agents = cluster
    marker = tmp_path / "starts"
    assert c.session().post(c.url(JOBS), json=job("lossy", command=[sys.executable, "-c", COUNTER, str(marker),
                                                                    "60"])).status_code == 201
    wait_job(c, "lossy", lambda j: units(j) >= 8, what="the counter to pass 8")
    # A checkpoint to lose nothing of: suspend (checkpoint 1), resume (attempt 2 restores it).
    suspend(c, "lossy")
    patch_state(c, "lossy", "Running")
    wait_job(c, "lossy", lambda j: (j["status"].get("checkpoint") or {}).get("restoredFromSeq") == 1
             and j["status"].get("phase") == "Running", what="attempt 2 to restore and run")
    # Running is reported once the program is spawned; its start line follows. Killing the node
    # before that line would leave the marker without attempt 2 (a race of the test, not the code).
    wait_for(lambda: "2" in [r["attempt"] for r in starts(marker)], 30, what="attempt 2's program to start")
    lost_node = node_of(c, "lossy", 2)
    # The node dies with its work: the agent and every process of the attempt, at once.
    victim = agents[lost_node]
    victim.proc.kill()
    victim.proc.wait()
    victim._kill_workloads()
    j = wait_job(c, "lossy", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=90,
                 what="the replacement to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    third = attempts_of(c, "lossy")[2]
    assert attempts_of(c, "lossy")[1]["status"]["phase"] == "Lost"
    assert third["spec"]["node"] != lost_node and third["status"]["restoredFromSeq"] == 1
    runs = starts(marker)
    assert [r["attempt"] for r in runs] == ["1", "2", "3"]
    assert runs[2]["start"] == runs[1]["start"] >= 8, runs  # both restored the latest committed checkpoint


def test_a_suspend_whose_checkpoint_keeps_failing_leaves_the_job_running(coordinator: Coordinator,
                                                                         agent: AgentProcess,
                                                                         tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    body = job("stubborn", command=[sys.executable, "-c", COUNTER, str(marker), "80"],
               recovery={"checkpoint": {"paths": ["/nodus/state/not-there"]}})
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_job(coordinator, "stubborn", lambda j: units(j) >= 3, what="the counter to start")
    patch_state(coordinator, "stubborn", "Suspended")
    j = wait_job(coordinator, "stubborn", lambda j: j["status"].get("reason") == "SuspendFailed", timeout=30,
                 what="SuspendFailed")
    st = j["status"]
    assert st["phase"] == "Running" and st["suspendFailures"] == 3, st
    assert any(c["type"] == "SuspendFailed" and c["status"] == "True" for c in st["conditions"])
    [only] = attempts_of(coordinator, "stubborn")
    assert only["status"]["phase"] == "Running" and not only["spec"].get("stop"), "it was never stopped"
    before = units(j)
    wait_job(coordinator, "stubborn", lambda j: units(j) > before + 3, what="the program to keep counting")
    patch_state(coordinator, "stubborn", "Running")
    j = wait_job(coordinator, "stubborn", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=60,
                 what="the Job to finish")
    assert j["status"]["phase"] == "Succeeded" and "suspendFailures" not in j["status"], j["status"]
    assert [r["attempt"] for r in starts(marker)] == ["1"]
