"""Faults with real processes: the agent killed with SIGKILL mid-run, and a whole node lost.

(a) kill -9 of the agent alone: its workloads run on (own session, own supervisor), the restarted
agent re-adopts them, learns the end of one that finished while it was away, and nothing runs twice.
(b) node loss: the agent *and* its workload are killed on one of two nodes; the coordinator's lease
runs out, the attempt is Lost and replaced on the other node, counted against recovery.maxAttempts and
not backoffLimit.

Commands append to marker files in the test's tmp dir, so a test can count what really started.
Every wait polls with a bounded deadline.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from conftest import Coordinator
from e2e import attempts_of, create, joined, settled, start_agent, status, wait_events
from agent_double import AgentProcess, wait_for

PY = sys.executable

PER_INDEX = r"""
import os, sys, time
from pathlib import Path
i = os.environ["NODUS_INDEX"]
with open(sys.argv[1], "a") as f:
    f.write(f"start {i} {os.environ['NODUS_ATTEMPT_NUMBER']} {os.environ['NODUS_ATTEMPT']} {os.getpid()}\n")
while not Path(sys.argv[2] + i).exists():
    time.sleep(0.05)
with open(sys.argv[1], "a") as f:
    f.write(f"end {i}\n")
print("index", i, "done", flush=True)
raise SystemExit(int(sys.argv[3 + int(i)]))
"""
"""argv: MARKER GO_PREFIX EXIT0 EXIT1 …: index i waits for GO_PREFIX+i, then exits with EXIT<i>."""


def starts(marker: Path) -> list[str]:
    return [ln for ln in marker.read_text().splitlines() if ln.startswith("start")] if marker.exists() else []


def kill_workload(command_pid: int) -> None:
    """SIGKILL the attempt's supervisor (the command's parent) and then the command's process group,
    found through the process tree: the supervisor never gets to report anything."""
    command = psutil.Process(command_pid)
    supervisor = command.parent()
    assert supervisor is not None and "supervisor" in " ".join(supervisor.cmdline()), supervisor
    supervisor.kill()
    os.killpg(os.getpgid(command_pid), signal.SIGKILL)

    def dead() -> bool:
        try:
            return psutil.Process(command_pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(dead, 10, what="the workload to die")


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with start_agent(coordinator, tmp_path / "agent", "loss-a") as a:
        yield a


@pytest.mark.slow
def test_kill9_of_the_agent_readopts_running_attempts_and_runs_none_twice(coordinator: Coordinator,
                                                                          agent: AgentProcess,
                                                                          tmp_path: Path) -> None:
    c = coordinator
    marker, go = tmp_path / "marker", tmp_path / "go"
    # Index 0 ends well and index 1 exits 3 (backoffLimit 0: no retry may hide a second run).
    create(c, "readopt", command=[PY, "-c", PER_INDEX, str(marker), str(go), "0", "3"], completions=2,
           parallelism=2, backoffLimit=0)
    wait_for(lambda: len(starts(marker)) == 2, 60, what="both attempts to start")
    wait_for(lambda: all((a.get("status") or {}).get("phase") == "Running" for a in attempts_of(c, "readopt")),
             30, what="both Attempts Running")
    assert agent.signal(signal.SIGKILL) == -signal.SIGKILL

    # While the agent is away: index 0 finishes on its own (the agent must learn that end later).
    Path(f"{go}0").touch()
    wait_for(lambda: "end 0" in marker.read_text(), 30, what="index 0 to end while the agent is down")
    assert status(c, "readopt").get("phase") == "Running", "the coordinator heard of no end yet"

    agent.start()
    wait_for(lambda: "re-adopted attempt" in agent.log(), 30, what="the re-adoption")
    a0 = wait_for(lambda: next((a for a in attempts_of(c, "readopt") if a["spec"]["index"] == 0 and
                                (a.get("status") or {}).get("phase") == "Succeeded"), None), 30,
                  what="index 0's end, reported after the restart")
    assert a0["status"]["exitCode"] == 0
    Path(f"{go}1").touch()  # index 1 is still running, under the re-adopting agent
    st = settled(c, "readopt")
    assert st["phase"] == "Failed" and st["reason"] == "BackoffLimitExceeded" and "exit code 3" in st["message"], st
    got = [(a["spec"]["index"], a["spec"]["number"], a["status"]["phase"], a["status"].get("exitCode"))
           for a in attempts_of(c, "readopt")]
    assert got == [(0, 1, "Succeeded", 0), (1, 1, "Failed", 3)]
    assert st["attempts"]["total"] == 2 and st["succeeded"] == 1 and st["failed"] == 1
    assert sorted(ln.rsplit(" ", 1)[0] for ln in starts(marker)) == \
        sorted(f"start {a['spec']['index']} 1 {a['spec']['id']}" for a in attempts_of(c, "readopt")), \
        "each command ran exactly once"


@pytest.mark.slow
def test_node_loss_replaces_the_attempt_on_another_node_against_max_attempts(tmp_path: Path) -> None:
    # Both nodes Ready before the Job exists, so the replacement has somewhere to go.
    with (Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "2s", "--heartbeat-interval",
                                                           "0.5s")) as c,
          joined([AgentProcess(tmp_path / name, c.grpc, c.join_token, node=name).start()
                  for name in ("node-a", "node-b")], c) as started):
        agents = {a.node: a for a in started}
        marker, go = tmp_path / "marker", tmp_path / "go"
        create(c, "lost", command=[PY, "-c", PER_INDEX, str(marker), str(go), "0"], backoffLimit=0,
               recovery={"maxAttempts": 1})
        wait_for(lambda: len(starts(marker)) == 1, 60, what="the first attempt to start")
        first = attempts_of(c, "lost")[0]
        victim = agents[first["spec"]["node"]]
        other = next(name for name in agents if name != victim.node)

        # The whole node goes: the agent, its supervisors and the workload, with no goodbye.
        assert victim.signal(signal.SIGKILL) == -signal.SIGKILL
        kill_workload(int(starts(marker)[0].split()[-1]))

        lost = wait_for(lambda: next((a for a in attempts_of(c, "lost")
                                      if a["spec"]["number"] == 1 and a["status"]["phase"] == "Lost"), None),
                        30, what="the first attempt to be Lost once the lease runs out")
        assert lost["status"]["reason"] == "NodeLost", lost["status"]
        wait_for(lambda: len(starts(marker)) == 2, 60, what="the replacement to start")
        second = attempts_of(c, "lost")[1]
        assert second["spec"]["index"] == 0 and second["spec"]["number"] == 2 and second["spec"]["node"] == other
        Path(f"{go}0").touch()
        st = settled(c, "lost")
        assert st["phase"] == "Succeeded", st
        assert st.get("failed", 0) == 0, "a lost node is not the customer's failure"
        assert st["attempts"] == {"current": 2, "max": 1, "total": 2}, st["attempts"]
        assert [a["status"]["phase"] for a in attempts_of(c, "lost")] == ["Lost", "Succeeded"]
        # Its story in Events (kubectl get events / describe): the node loss is a Warning naming the node.
        events = wait_events(c, "lost", {"NodeLost", "Replaced", "Succeeded"})
        lost_event = next(e for e in events if e["reason"] == "NodeLost")
        assert lost_event["type"] == "Warning" and victim.node in lost_event["message"], lost_event
        replaced = next(e for e in events if e["reason"] == "Replaced")
        assert replaced["message"].startswith(f"attempt {second['metadata']['name']} replaces"), replaced
