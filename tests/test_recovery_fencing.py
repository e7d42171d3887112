"""Fencing over the wire: a partitioned old attempt's checkpoint commit is refused by the real
coordinator, so it can never become the latest; the replacement's commit counts and is what a
further replacement would restore."""
from __future__ import annotations

import time
from pathlib import Path

from conftest import Coordinator
from e2e import attempts_of, create
from nodus.v1 import agent_pb2, common_pb2
from test_agent_service import RUNNING, FakeAgent, phase_is, ts, wait_job


def commit(a: agent_pb2.Assignment, seq: int, sha: str) -> agent_pb2.CheckpointCommit:
    return agent_pb2.CheckpointCommit(attempt_id=a.attempt_id, job=a.job, seq=seq, time=ts(), size_bytes=1000 + seq,
                                      sha256=sha, paths=["/nodus/state"], epoch=0,
                                      format=agent_pb2.CHECKPOINT_FORMAT_SNAPSHOT, uri=f"blob://sha256/{sha}",
                                      reason=agent_pb2.CHECKPOINT_REASON_PERIODIC)


def acked(agent: FakeAgent, seq: int) -> None:
    agent.expect("ack", lambda ack: ack.seq >= seq, timeout=10)


def test_a_partitioned_attempt_cannot_overwrite_the_latest_checkpoint(tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "1s", "--heartbeat-interval", "0.2s"))
    a = b = None
    try:
        a = FakeAgent(c, "node-a")
        a.register()
        a.connect()
        a.expect("full_state")
        a.start_heartbeats()
        create(c, "fenced", recovery={"maxAttempts": 3})
        first = a.expect("assignment")
        assert not first.HasField("restore_from") and list(first.checkpoint.paths) == ["/nodus/state"]
        a.update(first.attempt_id, RUNNING)
        wait_job(c, "fenced", phase_is("Running"))
        acked(a, a.send(checkpoint_commit=commit(first, 1, "1" * 64)))
        assert [cp["seq"] for cp in attempts_of(c, "fenced")[0]["status"]["checkpoints"]] == [1]

        b = FakeAgent(c, "node-b")
        b.register()
        b.connect()
        b.expect("full_state")
        b.start_heartbeats()
        a.stop_heartbeats()  # node-a is cut off: its lease runs out, attempt 1 is Lost and replaced
        second = b.expect("assignment", timeout=10)
        assert second.attempt_number == 2
        assert second.restore_from.seq == 1 and second.restore_from.sha256 == "1" * 64
        b.update(second.attempt_id, RUNNING, restored_from_seq=1)

        # The partitioned attempt still runs and commits what it saved; the coordinator refuses it.
        acked(a, a.send(checkpoint_commit=commit(first, 2, "b" * 64)))
        # The replacement commits the same seq: that one counts.
        acked(b, b.send(checkpoint_commit=commit(second, 2, "2" * 64)))
        # A resend of the refused one (after a reconnect, say) is refused again.
        acked(a, a.send(checkpoint_commit=commit(first, 3, "c" * 64)))

        old, new = attempts_of(c, "fenced")[:2]
        assert old["status"]["phase"] == "Lost"
        assert [cp["seq"] for cp in old["status"]["checkpoints"]] == [1]
        assert [(cp["seq"], cp["sha256"]) for cp in new["status"]["checkpoints"]] == [(2, "2" * 64)]
        j = wait_job(c, "fenced", lambda j: (j["status"].get("checkpoint") or {}).get("seq") == 2)
        assert j["status"]["checkpoint"]["restoredFromSeq"] == 1
        deadline = time.monotonic() + 5
        while "refused" not in c.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "was superseded" in c.log.read_text()
    finally:
        for agent in (a, b):
            if agent is not None:
                agent.close()
        c.stop()


def test_a_commit_lost_with_its_stream_arrives_with_the_next_hello(coordinator: Coordinator) -> None:
    c = coordinator
    a = FakeAgent(c, "node-a")
    try:
        a.register()
        a.connect()
        a.expect("full_state")
        create(c, "resent")
        first = a.expect("assignment")
        a.update(first.attempt_id, RUNNING)
        wait_job(c, "resent", phase_is("Running"))
        # The stream broke before the commit went out: the agent's next Hello carries it.
        a.close()
        a = FakeAgent(c, "node-a")
        a.register()
        ended = agent_pb2.AttemptObservation(
            status=agent_pb2.AttemptUpdate(attempt_id=first.attempt_id, phase=common_pb2.ATTEMPT_PHASE_RUNNING,
                                           time=ts()),
            checkpoint=commit(first, 1, "e" * 64))
        a.connect([ended])
        a.expect("full_state")
        wait_job(c, "resent", lambda j: (j["status"].get("checkpoint") or {}).get("seq") == 1)
        assert [cp["sha256"] for cp in attempts_of(c, "resent")[0]["status"]["checkpoints"]] == ["e" * 64]
    finally:
        a.close()
