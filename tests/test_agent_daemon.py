"""The agent daemon against a protocol double of the coordinator: a real `nodus-agent` process.

The double (agent_double.FakeCoordinator) speaks agent.proto's conversation from the
coordinator's end and records every message; the coordinator's real servicer is tested end to end
in test_agent_e2e.py.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from agent_double import AgentProcess, FakeCoordinator, fake, restart_ports, wait_for
from nodus.v1 import agent_pb2

PY = sys.executable


def assignment(attempt_id: str, code: str, **fields: object) -> agent_pb2.Assignment:
    a = agent_pb2.Assignment(attempt_id=attempt_id, index=0, attempt_number=1, command=[PY, "-c", code], **fields)
    a.job.project, a.job.name, a.job.uid = "default", "job-" + attempt_id, "uid-" + attempt_id
    return a



@pytest.fixture
def agent(tmp_path: Path, fake: FakeCoordinator) -> Iterator[AgentProcess]:
    a = AgentProcess(tmp_path / "work", fake.address, fake.token, extra_args=("--labels", "zone=a,tier=gold",
                                                                              "--region", "eu", "--offering", "cpu-x1"))
    try:
        yield a
        # invariants at teardown: nothing of an attempt that ended is left running
        wait_for(lambda: not a.leftovers(), 10, what="ended attempts to leave nothing (AgentProcess.leftovers)")
    finally:
        a.reap()


def in_order(seen: list[str], expected: list[str]) -> bool:
    """`expected` is a subsequence of `seen` (phases may be coalesced, never reordered)."""
    it = iter(seen)
    return all(any(s == e for s in it) for e in expected)


WAIT_FOR_GO = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).open('a').write(os.environ['NODUS_ATTEMPT'] + ' ' + str(os.getpid()) + '\\n')
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print('finished', flush=True)
"""


def _marker_written(marker: Path) -> bool:
    """The workload appends one line `ATTEMPT PID`; the file exists before the line is in it."""
    return marker.exists() and marker.read_text().endswith("\n")


def waiting(attempt_id: str, tmp_path: Path) -> tuple[agent_pb2.Assignment, Path, Path]:
    marker, go = tmp_path / f"{attempt_id}.marker", tmp_path / f"{attempt_id}.go"
    a = assignment(attempt_id, WAIT_FOR_GO)
    a.args.extend([str(marker), str(go)])
    return a, marker, go


def test_register_hello_full_state_and_a_run_to_success(fake: FakeCoordinator, agent: AgentProcess) -> None:
    code = ("import time\nfrom nodus import progress\n"
            "for i in range(4):\n    progress.report(stage='train', completed=i + 1, total=4, metrics={'loss': 1 / (i + 1)})\n"
            "    print('step', i, flush=True)\n    time.sleep(0.15)\n")
    fake.assign(assignment("a-ok", code), push=False)  # in the FullState the agent gets first
    agent.start()
    end = fake.wait_final("a-ok")
    assert end.reason == "Completed" and end.exit_code == 0 and not end.oom_killed
    assert end.HasField("start_time") and end.HasField("finish_time") and end.HasField("inputs_ready_time")
    # accepted and materializing pass in a few ms and ride with the next report; nothing to collect: no
    # STOPPING of its own (ADR 0094)
    assert in_order(fake.phases("a-ok"), ["RUNNING", "SUCCEEDED"])

    reg = fake.registrations[0]
    assert reg.node_name == "node-a"
    inv = reg.inventory
    assert list(inv.runtimes) == [1] and inv.region_class == "eu" and inv.offering == "cpu-x1"
    assert dict(inv.labels) == {"zone": "a", "tier": "gold"}
    assert inv.host.cpus >= 1 and inv.host.memory_bytes > 1 << 20 and inv.host.disk_bytes > 0
    assert inv.hostname and inv.agent_version

    msgs = fake.messages()
    first = msgs[0][1]
    assert first.seq == 1 and first.WhichOneof("message") == "hello"
    assert first.hello.session_id == "session-1" and first.hello.node_id == "node-node-a" and first.hello.epoch == 1
    seqs = [m.seq for n, m in msgs if n == 1]
    assert seqs == list(range(1, len(seqs) + 1)), "agent messages are numbered from 1 without gaps"
    assert any(m.ack.seq >= 1 for _, m in fake.messages("ack")), "the FullState is acknowledged"
    wait_for(lambda: fake.messages("heartbeat"), 5, what="a heartbeat")
    hb = fake.messages("heartbeat")[0][1].heartbeat
    assert hb.disk_free_bytes > 0 and hb.HasField("time")

    progress = fake.progress("a-ok")
    assert progress and progress[-1].stage == "train" and progress[-1].units_completed == 4
    assert progress[-1].units_total == 4 and progress[-1].metrics["loss"] == "0.25"
    wait_for(lambda: "a-ok" in fake.log_eof, 10, what="the log's eof")
    assert fake.log("a-ok") == "".join(f"step {i}\n" for i in range(4))
    # acknowledged and shipped: forgotten, its directory removed, a tombstone kept
    wait_for(lambda: "a-ok" not in agent.state().get("attempts", {}), 10, what="the attempt to be forgotten")
    # state.json forgets it first, then the directory goes (off the event loop)
    wait_for(lambda: not (agent.work_dir / "attempts" / "a-ok").exists(), 10, what="its directory to be removed")
    assert [i for i, _ in agent.state()["finished"]] == ["a-ok"]


def test_failure_reports_exit_code_and_last_three_lines(fake: FakeCoordinator, agent: AgentProcess) -> None:
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    code = "import sys\nfor i in range(6): print('line', i)\nsys.exit(3)"
    fake.assign(assignment("a-fail", code))
    end = fake.wait_final("a-fail")
    assert end.phase == 10 and end.reason == "Error" and end.exit_code == 3
    assert end.message.splitlines() == ["line 3", "line 4", "line 5"]
    assert not end.outputs


def test_image_on_the_process_runtime_is_refused(fake: FakeCoordinator, agent: AgentProcess) -> None:
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    fake.assign(assignment("a-image", "print(1)", image="ghcr.io/acme/train@sha256:" + "0" * 64))
    end = fake.wait_final("a-image")
    assert end.phase == 10 and end.reason == "ImageUnsupported"
    assert "process runtime" in end.message and "image" in end.message


def test_cancel_sigterm_then_grace(fake: FakeCoordinator, agent: AgentProcess, tmp_path: Path) -> None:
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    polite = ("import signal, sys, time\n"
              "def bye(*a):\n    print('got SIGTERM', flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\nwhile True: time.sleep(0.05)\n")
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM', flush=True))\n"
                "print('up', flush=True)\nwhile True: time.sleep(0.05)\n")
    fake.assign(assignment("a-polite", polite))
    fake.assign(assignment("a-stubborn", stubborn))
    for attempt in ("a-polite", "a-stubborn"):
        wait_for(lambda: "up" in fake.log(attempt), 15, what=f"{attempt} to run")
    fake.cancel("a-polite", reason="DeadlineExceeded", grace=30)
    end = fake.wait_final("a-polite")  # it waits less than the 30 s grace: the program ended itself
    assert end.phase == 12 and end.reason == "DeadlineExceeded"
    assert end.exit_code != 128 + signal.SIGKILL, "a program that exits on SIGTERM is not killed"
    wait_for(lambda: "got SIGTERM" in fake.log("a-polite"), 5, what="the SIGTERM in the log")

    fake.cancel("a-stubborn", reason="Cancelled", grace=1)
    end = fake.wait_final("a-stubborn")
    assert end.phase == 12 and end.reason == "Cancelled" and end.exit_code == 128 + signal.SIGKILL
    # SIGTERM first, then SIGKILL (how long the grace lasted: bench/agent_timings.py, beside the grace)
    wait_for(lambda: "ignoring SIGTERM" in fake.log("a-stubborn"), 5, what="the SIGTERM in the log")


def test_reconnect_resyncs_and_unknown_attempts_stop_unassigned(fake: FakeCoordinator, agent: AgentProcess,
                                                                tmp_path: Path) -> None:
    keep, keep_marker, keep_go = waiting("a-keep", tmp_path)
    orphan, _, _ = waiting("a-orphan", tmp_path)
    fake.assign(keep, push=False)
    fake.assign(orphan, push=False)
    agent.start()
    wait_for(lambda: fake.phases("a-keep")[-1:] == ["RUNNING"] and fake.phases("a-orphan")[-1:] == ["RUNNING"],
             15, what="both attempts running")
    fake.forget("a-orphan")  # the coordinator no longer wants it, and never said so
    fake.drop_streams(grpc.StatusCode.UNAVAILABLE)
    wait_for(lambda: len(fake.hellos()) >= 2, 10, what="a second Hello")
    hello = fake.hellos()[1]
    observed = {o.status.attempt_id: o.status.phase for o in hello.attempts}
    assert observed == {"a-keep": 6, "a-orphan": 6}, "Hello carries the full observed state"
    assert len(fake.registrations) == 1, "a dropped stream reconnects without registering again"
    end = fake.wait_final("a-orphan")
    assert end.phase == 12 and end.reason == "Unassigned"
    assert fake.final("a-keep") is None
    keep_go.touch()
    assert fake.wait_final("a-keep").phase == 9
    assert len(keep_marker.read_text().splitlines()) == 1


def test_superseded_session_registers_again(fake: FakeCoordinator, agent: AgentProcess) -> None:
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    fake.reject_next_connect = True
    fake.session_id = "forgotten"  # as after a coordinator that lost the session
    fake.drop_streams(grpc.StatusCode.UNAVAILABLE)
    wait_for(lambda: len(fake.registrations) >= 2, 10, what="a second Register")
    wait_for(lambda: fake.current() is not None and fake.hellos()[-1].session_id == fake.session_id, 10,
             what="a stream on the new session")
    assert fake.hellos()[-1].epoch == fake.epoch


def test_lease_expiry_stops_attempts(tmp_path: Path) -> None:
    fake = FakeCoordinator(lease=1.5, heartbeat=0.2).start()
    agent = AgentProcess(tmp_path / "work", fake.address, fake.token)
    try:
        a, _, _ = waiting("a-lease", tmp_path)
        fake.assign(a, push=False)
        agent.start()
        wait_for(lambda: "RUNNING" in fake.phases("a-lease"), 15, what="the attempt to run")
        fake.renew = False
        fake.lease = 60.0  # a reconnect would renew; no reconnect happens
        end = fake.wait_final("a-lease", timeout=15)
        assert end.phase == 11 and end.reason == "LeaseExpired"
    finally:
        agent.reap()
        fake.stop()


def test_kill9_agent_readopts_and_never_runs_twice(fake: FakeCoordinator, agent: AgentProcess,
                                                   tmp_path: Path) -> None:
    a, marker, go = waiting("a-survivor", tmp_path)
    fake.assign(a, push=False)
    agent.start()
    wait_for(lambda: _marker_written(marker), 15, what="the attempt to start")
    wait_for(lambda: "RUNNING" in fake.phases("a-survivor"), 10, what="RUNNING")
    workload_pid = int(marker.read_text().split()[1])
    assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
    os.kill(workload_pid, 0)  # the workload outlived its agent
    agent.start()
    wait_for(lambda: len(fake.registrations) == 2 and len(fake.hellos()) >= 2, 15, what="the agent's return")
    hello = fake.hellos()[-1]
    assert [(o.status.attempt_id, o.status.phase) for o in hello.attempts] == [("a-survivor", 6)]
    assert "re-adopted attempt a-survivor" in agent.log()
    go.touch()
    end = fake.wait_final("a-survivor")
    assert end.phase == 9 and end.exit_code == 0
    wait_for(lambda: "a-survivor" in fake.log_eof, 10, what="the log's eof")
    assert fake.log("a-survivor") == "finished\n"
    assert len(marker.read_text().splitlines()) == 1, "the attempt ran exactly once"


def test_sigterm_stops_the_agent_and_leaves_workloads_running(fake: FakeCoordinator, agent: AgentProcess,
                                                              tmp_path: Path) -> None:
    a, marker, go = waiting("a-term", tmp_path)
    fake.assign(a, push=False)
    agent.start()
    wait_for(lambda: _marker_written(marker), 15, what="the attempt to start")
    workload_pid = int(marker.read_text().split()[1])
    assert agent.signal(signal.SIGTERM) == 0
    os.kill(workload_pid, 0)
    assert "left running" in agent.log()
    go.touch()  # it finishes while no agent runs
    wait_for(lambda: not _alive(workload_pid), 10, what="the workload to finish")
    agent.start()
    end = fake.wait_final("a-term")
    assert end.phase == 9 and end.exit_code == 0, "the restarted agent reports the real end"
    assert len(marker.read_text().splitlines()) == 1


def test_an_assignment_sent_again_after_the_end_is_not_run_again(fake: FakeCoordinator, agent: AgentProcess,
                                                                 tmp_path: Path) -> None:
    a, marker, go = waiting("a-once", tmp_path)
    go.touch()
    fake.assign(a, push=False)
    agent.start()
    fake.wait_final("a-once")
    wait_for(lambda: "a-once" not in agent.state().get("attempts", {}), 10, what="the attempt to be forgotten")
    before = len(fake.updates("a-once"))
    fake.drop_streams()  # the reconnect's FullState still lists it (the double never forgets)
    wait_for(lambda: len(fake.updates("a-once")) > before, 10, what="the end reported again")
    assert fake.updates("a-once")[-1].phase == 9
    assert len(marker.read_text().splitlines()) == 1


def test_agent_keeps_trying_while_the_coordinator_is_away(tmp_path: Path) -> None:
    port = restart_ports(1)  # nobody listens there now, and no port-0 server takes it meanwhile
    address = f"127.0.0.1:{port}"
    agent = AgentProcess(tmp_path / "work", address, "nodusjoin_test_secret", env={"NODUS_LOG_LEVEL": "DEBUG"})
    agent.start()
    try:
        # three refused attempts, each followed by its backoff: it outlived them
        wait_for(lambda: agent.log().count("reconnecting in") >= 3, 20, what="three refused attempts")
        assert agent.proc.poll() is None
        second = FakeCoordinator(port=port)
        assert second.port == port
        second.start()
        try:
            wait_for(lambda: second.hellos(), 10, what="the agent to find the coordinator")
        finally:
            second.stop()
    finally:
        agent.reap()


def _cmdlines(pid: int) -> list[str]:
    import psutil

    lines = []
    for child in psutil.Process(pid).children():
        try:
            lines.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue  # gone, or a zombie its parent has not reaped yet
    return lines


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_supervisors_start_cold_without_the_zygote_and_after_losing_it(fake: FakeCoordinator, tmp_path: Path) -> None:
    import psutil

    cold = AgentProcess(tmp_path / "cold", fake.address, fake.token, extra_args=("--zygote", "false")).start()
    try:
        wait_for(fake.current, 10, what="a stream")
        a, marker, go = waiting("a-cold", tmp_path)
        go.touch()
        fake.assign(a)
        assert fake.wait_final("a-cold").phase == 9
        assert not any("--zygote" in line for line in _cmdlines(cold.proc.pid))
    finally:
        cold.reap()

    warm = AgentProcess(tmp_path / "warm", fake.address, fake.token).start()
    try:
        def zygote() -> psutil.Process | None:
            for p in psutil.Process(warm.proc.pid).children():
                try:
                    if "--zygote" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                        return p
                except psutil.Error:
                    continue  # gone, or a zombie not reaped yet
            return None
        z = wait_for(zygote, 10, what="the zygote")
        z.kill()
        z.wait(5)
        a, marker, go = waiting("a-after-zygote", tmp_path)
        go.touch()
        fake.assign(a)
        assert fake.wait_final("a-after-zygote").phase == 9
        assert len(marker.read_text().splitlines()) == 1
        assert wait_for(zygote, 10, what="a new zygote").pid != z.pid
        assert warm.signal(signal.SIGTERM) == 0
        assert "did not stop in time" not in warm.log()
    finally:
        warm.reap()


def test_log_shipping_resumes_after_broken_streams_and_gaps(fake: FakeCoordinator, agent: AgentProcess,
                                                            tmp_path: Path) -> None:
    go = tmp_path / "log.go"
    code = ("import sys, time\nfrom pathlib import Path\n"
            "for i in range(40):\n    print('line', i, flush=True)\n    time.sleep(0.01)\n"
            "while not Path(sys.argv[1]).exists():\n    time.sleep(0.02)\n"
            "for i in range(40, 80):\n    print('line', i, flush=True)\n    time.sleep(0.01)\n")
    a = assignment("a-log", code)
    a.args.append(str(go))
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    fake.log_faults = 3
    fake.assign(a)
    wait_for(lambda: "line 39" in fake.log("a-log"), 20, what="the first half of the log")
    fake.truncate_log("a-log", 20)  # the server lost the tail: the next chunk leaves a gap
    go.touch()
    fake.wait_final("a-log")
    wait_for(lambda: "a-log" in fake.log_eof, 20, what="the log's eof")
    assert fake.log("a-log") == "".join(f"line {i}\n" for i in range(80)), "complete, nothing twice"
    assert fake.log_faults == 0


def test_a_second_agent_on_the_same_work_dir_refuses_to_start(fake: FakeCoordinator, agent: AgentProcess,
                                                              tmp_path: Path) -> None:
    agent.start()
    wait_for(fake.current, 10, what="a stream")
    second = AgentProcess(agent.work_dir, fake.address, fake.token, node="node-b")
    second.log_path = tmp_path / "second.log"
    second.start()
    assert second.proc.wait(20) != 0
    assert "another agent already runs" in second.log_path.read_text()
    assert agent.proc.poll() is None


SLOW_STATE = """
import os, sys, time
state = os.environ["NODUS_STATE_DIR"]
os.makedirs(state, exist_ok=True)
for i in range(64):  # 64 MiB of state: a copy that takes a moment
    with open(os.path.join(state, f"blob-{i}"), "wb") as f:
        f.write(os.urandom(1 << 20))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_checkpoint_reports_checkpointing_then_running_and_commits(fake: FakeCoordinator, agent: AgentProcess) -> None:
    a = assignment("a-ckpt", SLOW_STATE)
    a.checkpoint.CopyFrom(agent_pb2.CheckpointPolicy(paths=["/nodus/state"]))
    fake.assign(a, push=False)
    agent.start()
    wait_for(lambda: "RUNNING" in fake.phases("a-ckpt") and "ready" in fake.log("a-ckpt"), 30, what="the program")
    fake.current().put(checkpoint_request=agent_pb2.CheckpointRequest(
        attempt_id="a-ckpt", reason=agent_pb2.CHECKPOINT_REASON_PERIODIC, seq=1))
    commit = wait_for(lambda: fake.messages("checkpoint_commit"), 60, what="the commit")[0][1].checkpoint_commit
    assert commit.seq == 1 and commit.size_bytes > 0
    wait_for(lambda: fake.phases("a-ckpt")[-1:] == ["RUNNING"], 10, what="Running again")
    phases = fake.phases("a-ckpt")
    assert in_order(phases, ["RUNNING", "CHECKPOINTING", "RUNNING"]), phases
    fake.cancel("a-ckpt")
    fake.wait_final("a-ckpt")
