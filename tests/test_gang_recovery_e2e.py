"""Gangs that lose a member or never assemble, end to end on loopback with real daemons.

The coordinator runs on a clock the test moves forward (--clock-offset-file), so a 60 s lease, a
1 minute checkpoint interval and a 5 minute startupTimeout play out in seconds: the clock moves in
steps shorter than the lease, each one waiting until the live nodes have heartbeated at the new
time, so no healthy node looks lost however loaded the machine is.

- Killing one member's agent and workload mid-run: its node's lease expires, the gang is stopped
  as a whole and restarts at epoch 2 (rank 1 on another node, rank 0 on its own), every member
  restores the latest checkpoint, status.gang.restarts is 1, and the Job succeeds.
- A member that never becomes ready: the gang is placed again after startupTimeout (that rank on
  another node), and after maxAssemblyRetries fails with GangAssemblyTimeout, holding nothing.
"""
from __future__ import annotations

import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from conftest import Coordinator
from e2e import attempts_of, create, fleet, get_job, wait_job
from agent_double import AgentProcess, wait_for
from nodus.v1 import node_pb2, node_pb2_grpc
from offset_clock import STEP, Clock

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> Clock:
    return Clock(tmp_path_factory.mktemp("clock") / "offset")


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, clock: Clock) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("gang-recovery") / "data").start(extra_args=(
            "--lease-duration", "60s", "--heartbeat-interval", "0.5s", "--clock-offset-file", str(clock.path),
            "--gang-probe", "off")) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def agents(c: Coordinator, clock: Clock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AgentProcess]]:
    with fleet(c, tmp_path_factory.mktemp("recovery-agents"), 3, "rec") as started:
        clock.coordinator, clock.agents = c, started
        yield started


def kill_agent_and_workload(a: AgentProcess) -> None:
    """kill -9 of the agent and everything it started (the node is gone)."""
    root = psutil.Process(a.proc.pid)
    family = [root, *root.children(recursive=True)]
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    a.proc.wait()
    a.proc = None


STEPPER = textwrap.dedent("""
    import json, os, sys, time
    from nodus import progress
    state = os.path.join(os.environ["NODUS_STATE_DIR"], "step")
    step = int(open(state).read()) if os.path.exists(state) else 0
    rank = os.environ["NODUS_RANK"]
    # Epoch 1 steps slowly enough to be running still when its member is lost; a restarted epoch only has
    # to finish from the checkpoint, which it does at once.
    pause = 0.25 if os.environ["NODUS_GANG_EPOCH"] == "1" else 0.01
    print(f"rank {rank} epoch {os.environ['NODUS_GANG_EPOCH']} starts at step {step}", flush=True)
    if os.environ.get("NODUS_RANK") == "0":
        with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], f"start-epoch-{os.environ['NODUS_GANG_EPOCH']}"), "w") as f:
            f.write(str(step))
    while step < int(sys.argv[1]):
        step += 1
        with open(state + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(state + ".tmp", state)
        progress.report(stage="train", completed=step, total=int(sys.argv[1]))
        time.sleep(pause)
""")


def test_losing_a_member_restarts_the_whole_gang_at_epoch_2_from_the_latest_checkpoint(
        c: Coordinator, agents: list[AgentProcess], clock: Clock, tmp_path: Path) -> None:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    create(c, "lose-one", command=[sys.executable, str(script), "160"], distributed={"nodes": 2},
           recovery={"checkpoint": {"interval": "1m", "format": "Snapshot"}})
    first = wait_job(c, "lose-one", lambda o: ((o.get("status") or {}).get("gang") or {}).get("phase") == "Running",
                     what="the gang to run")
    members = {m["rank"]: m for m in first["status"]["gang"]["members"]}
    by_id = {a["spec"]["id"]: a for a in attempts_of(c, "lose-one")}
    node_of = {r: by_id[m["attempt"]]["spec"]["node"] for r, m in members.items()}
    wait_for(lambda: ((get_job(c, "lose-one").get("status") or {}).get("progress") or {}).get("units", {})
             .get("completed", 0) >= 8, 60, what="some progress")
    clock.advance(61)  # the checkpoint interval passes: rank 0 snapshots its state
    done = wait_job(c, "lose-one", lambda o: ((o.get("status") or {}).get("checkpoint") or {}).get("seq", 0) >= 1,
                    what="a committed checkpoint")
    saved_at = done["status"]["progress"]["units"]["completed"]
    victim = next(a for a in agents if a.node == node_of[1])
    kill_agent_and_workload(victim)
    # rank 1's node stops heartbeating: past its lease it is lost, and the gang restarts as a whole
    second = wait_job(c, "lose-one", lambda o: ((o.get("status") or {}).get("gang") or {}).get("epoch") == 2,
                      what="epoch 2", tick=lambda: clock.advance(STEP))
    assert second["status"]["gang"]["restarts"] == 1, second["status"]["gang"]
    end = wait_job(c, "lose-one", lambda o: (o.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                   timeout=180, what="the Job to end")
    status = end["status"]
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["epoch"] == 2 and status["gang"]["restarts"] == 1, status["gang"]
    epoch2 = [a for a in attempts_of(c, "lose-one") if a["spec"]["gang"]["epoch"] == 2]
    assert len(epoch2) == 2 and all(a["status"].get("restoredFromSeq", 0) >= 1 for a in epoch2), epoch2
    nodes2 = {a["spec"]["gang"]["rank"]: a["spec"]["node"] for a in epoch2}
    assert nodes2[0] == node_of[0], "rank 0 keeps its node"
    assert nodes2[1] not in (node_of[1], node_of[0]), "rank 1 moved off the lost node"
    lost = [a for a in attempts_of(c, "lose-one") if a["spec"]["gang"]["epoch"] == 1 and a["spec"]["gang"]["rank"] == 1]
    assert lost[0]["status"]["phase"] == "Lost", lost[0]["status"]
    assert saved_at > 0
    # the node comes back (a new agent on it): the next test has three nodes again
    registrations = victim.log().count("registered node")
    victim.start()
    wait_for(lambda: victim.log().count("registered node") > registrations, 30, what="the node to come back")


def test_reclaiming_a_members_node_checkpoints_the_whole_gang_and_restarts_it_elsewhere(
        c: Coordinator, agents: list[AgentProcess], tmp_path: Path) -> None:
    from test_gangs_e2e import dcp_gang  # the torch.distributed.checkpoint program: save, idle; or load, finish
    marks = dcp_gang(c, "reclaim-dcp", tmp_path)
    running = wait_job(c, "reclaim-dcp", lambda o: o["status"]["gang"]["phase"] == "Running", what="Running")
    by_id = {a["spec"]["id"]: a for a in attempts_of(c, "reclaim-dcp")}
    rank1 = next(m for m in running["status"]["gang"]["members"] if m["rank"] == 1)
    reclaimed = by_id[rank1["attempt"]]["spec"]["node"]
    with c.channel() as channel:
        nodes = node_pb2_grpc.NodeServiceStub(channel)
        md = (("authorization", f"Bearer {c.token}"),)
        nodes.Reclaim(node_pb2.ReclaimRequest(name=reclaimed, grace_seconds=60, message="spot reclaim"), metadata=md,
                      timeout=10)
        try:
            end = wait_job(c, "reclaim-dcp", lambda o: o["status"]["phase"] in ("Succeeded", "Failed"),
                           timeout=150, what="the Job to end")
        finally:
            nodes.Uncordon(node_pb2.UncordonRequest(name=reclaimed), metadata=md, timeout=10)
    status = end["status"]
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["epoch"] == 2 and status["gang"]["restarts"] == 1, status["gang"]
    first = {a["spec"]["gang"]["rank"]: a for a in attempts_of(c, "reclaim-dcp") if a["spec"]["gang"]["epoch"] == 1}
    assert first[1]["status"]["phase"] == "Lost" and first[1]["status"]["reason"] == "Preempted", first[1]["status"]
    assert first[0]["status"]["reason"] == "GangRestart", first[0]["status"]
    # every rank stored its part of the reclaim's checkpoint, and epoch 2 loaded all of them
    assert {len(a["status"].get("checkpoints") or []) for a in first.values()} == {1}
    second = [a for a in attempts_of(c, "reclaim-dcp") if a["spec"]["gang"]["epoch"] == 2]
    assert reclaimed not in {a["spec"]["node"] for a in second}
    assert (marks / "resumed-0").read_text() == "7 6.0" and (marks / "resumed-1").read_text() == "7 6.0"


def test_a_member_that_never_becomes_ready_is_re_placed_then_the_job_fails_holding_nothing(
        c: Coordinator, agents: list[AgentProcess], clock: Clock) -> None:
    live = [a for a in agents if a.proc is not None]
    assert len(live) >= 2
    create(c, "never-ready", command=["true"],
           initCommand={"command": ["sh", "-c", '[ "$NODUS_RANK" != 1 ] || exec sleep 100000']},
           distributed={"nodes": 2, "startupTimeout": "5m", "maxAssemblyRetries": 1})
    first = wait_job(c, "never-ready",
                     lambda o: ((o.get("status") or {}).get("gang") or {}).get("phase") == "Assembling",
                     what="the gang to assemble")
    assert first["status"]["gang"]["ready"] <= 1
    clock.advance(301)
    second = wait_job(c, "never-ready", lambda o: ((o.get("status") or {}).get("gang") or {}).get("epoch") == 2
                      and o["status"]["gang"]["phase"] == "Assembling", what="the re-placement")
    assert second["status"]["phase"] != "Failed"
    clock.advance(301)
    end = wait_job(c, "never-ready", lambda o: (o.get("status") or {}).get("phase") == "Failed", what="the failure")
    status = end["status"]
    assert status["reason"] == "GangAssemblyTimeout", status
    assert "rank(s) 1 never became ready" in status["message"], status["message"]
    assert "startupTimeout" in status["fix"]
    wait_for(lambda: all(a["status"]["phase"] in ("Cancelled", "Succeeded", "Failed", "Lost")
                         for a in attempts_of(c, "never-ready")), 30, what="every member to end")
    assert len(attempts_of(c, "never-ready")) == 4  # two epochs of two ranks
    wait_job(c, "never-ready", lambda o: o["status"]["gang"]["phase"] == "Done", what="the gang to hold nothing")
