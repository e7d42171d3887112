"""The agent's pure core and the objects it owns, without processes: events in, actions out
(decisions.py), the supervisor's phase vocabulary, the attempt table's state.json, the checkpoint stores."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodus.agent import layout as L
from nodus.agent.attempts import Attempt, GangStep, Stage, gang_step
from nodus.agent.checkpointing import CheckpointFailed
from nodus.agent.decisions import (LEASE_EXPIRED, Acked, AttemptFacts, Forget, LeaseRenewed, LogShipped, MarkAcked,
                                   MoveLease, Tick, decide, progress_due, shown_phase)
from nodus.agent.gang import plan_dict
from nodus.agent.reasons import Reason, check_against_proto, reason_word
from nodus.agent.reconcile import Stop
from nodus.agent.stores import CheckpointStores
from nodus.agent.supervisor.phase import SupervisorPhase, terminal_phases
from nodus.agent.table import TOMBSTONES, AttemptTable, Volatile
from nodus.v1 import agent_pb2, common_pb2


class ManualClock:
    """Both of the agent's clocks, moved by hand."""

    def __init__(self, wall: float = 1_767_225_600.0, mono: float = 1000.0) -> None:
        self.wall, self.mono = wall, mono

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


RUNNING = AttemptFacts("run", Stage.SUPERVISED)
STARTING = AttemptFacts("start", Stage.ACCEPTED)
STOPPING = AttemptFacts("stopping", Stage.SUPERVISED, stopping=True)
UPLOADING = AttemptFacts("upload", Stage.COLLECTING, acked=True, log_done=True)
ENDED = AttemptFacts("ended", Stage.DONE, terminal_seq=(2, 7))
FORGETTABLE = AttemptFacts("gone", Stage.DONE, terminal_seq=(2, 3), acked=True, log_done=True)


# -- the lease -------------------------------------------------------------------------------------
def test_a_tick_within_the_lease_stops_nothing() -> None:
    assert decide(Tick(99.0), [RUNNING, STARTING], lease_deadline=100.0, stop_grace=10) == []
    assert decide(Tick(1e9), [RUNNING, STARTING], lease_deadline=None, stop_grace=10) == []


def test_a_tick_past_the_lease_stops_every_live_attempt_not_stopping_already() -> None:
    actions = decide(Tick(100.5), [RUNNING, STARTING, STOPPING, UPLOADING, ENDED], lease_deadline=100.0,
                     stop_grace=10)
    assert actions == [Stop("run", LEASE_EXPIRED, 5.0, L.LOST), Stop("start", LEASE_EXPIRED, 5.0, L.LOST)]
    assert decide(Tick(101.0), [RUNNING], 100.0, stop_grace=2.0) == [Stop("run", LEASE_EXPIRED, 2.0, L.LOST)]


def test_a_renewal_moves_the_lease_and_persists_only_a_real_move() -> None:
    assert decide(LeaseRenewed(10.0, 30.0), [], None, 10) == [MoveLease(40.0, persist=True)]
    assert decide(LeaseRenewed(11.0, 30.0), [], 40.0, 10) == [MoveLease(41.0, persist=False)]
    assert decide(LeaseRenewed(30.0, 30.0), [], 40.0, 10) == [MoveLease(60.0, persist=True)]
    assert decide(LeaseRenewed(30.0, 0.0), [], 40.0, 10) == []


# -- acks and forgetting ---------------------------------------------------------------------------
def test_an_ack_marks_the_ends_it_covers_and_forgets_those_whose_log_is_shipped() -> None:
    shipped = AttemptFacts("shipped", Stage.DONE, terminal_seq=(2, 5), log_done=True)
    later = AttemptFacts("later", Stage.DONE, terminal_seq=(2, 9), log_done=True)
    other_stream = AttemptFacts("old", Stage.DONE, terminal_seq=(1, 2), log_done=True)
    actions = decide(Acked(2, 7), [ENDED, shipped, later, other_stream, RUNNING], None, 10)
    assert actions == [MarkAcked("ended"), MarkAcked("shipped"), Forget("shipped")]


def test_a_tick_forgets_only_acked_ends_with_their_log_shipped() -> None:
    unshipped = AttemptFacts("log", Stage.DONE, terminal_seq=(2, 3), acked=True)
    assert decide(Tick(0.0), [FORGETTABLE, unshipped, ENDED, UPLOADING, RUNNING], None, 10) == [Forget("gone")]


def test_a_shipped_log_forgets_its_attempt_once_the_end_is_acked() -> None:
    acked = AttemptFacts("a", Stage.DONE, terminal_seq=(2, 3), acked=True)
    assert decide(LogShipped("a"), [acked], None, 10) == [Forget("a")]
    assert decide(LogShipped("ended"), [ENDED], None, 10) == []


# -- what is reported ------------------------------------------------------------------------------
def test_a_running_attempt_is_shown_checkpointing_while_a_checkpoint_is_taken() -> None:
    assert shown_phase(L.RUNNING, checkpointing=True) == "CHECKPOINTING"
    assert shown_phase(L.RUNNING, checkpointing=False) == L.RUNNING
    assert shown_phase(L.STOPPING, checkpointing=True) == L.STOPPING


def test_progress_goes_out_at_most_twice_a_second_unless_it_is_the_last() -> None:
    assert progress_due(10.0, 9.0, changed=True, force=False)
    assert not progress_due(10.0, 9.8, changed=True, force=False)
    assert progress_due(10.0, 9.8, changed=True, force=True)
    assert not progress_due(10.0, 0.0, changed=False, force=True)


# -- the supervisor's phases -----------------------------------------------------------------------
def test_supervisor_phases_are_the_layouts_strings_and_end_where_the_layout_says() -> None:
    assert {p.value for p in terminal_phases()} == set(L.TERMINAL)
    assert all(p.terminal == (p.value in L.TERMINAL) for p in SupervisorPhase)
    assert {p.value for p in SupervisorPhase} == {L.SPAWNED, L.INITIALIZING, L.STARTING_SIDECARS, L.RUNNING,
                                                  L.STOPPING, *L.TERMINAL}
    assert json.loads(json.dumps({"phase": SupervisorPhase.RUNNING})) == {"phase": "RUNNING"}


# -- reasons ----------------------------------------------------------------------------------------
def test_the_agents_reasons_are_the_protos_words_and_a_drift_fails_the_check() -> None:
    proto = [v.name for v in common_pb2.AttemptReason.DESCRIPTOR.values]
    check_against_proto(proto)
    assert {r.value for r in Reason} == {reason_word(n) for n in proto if n != "ATTEMPT_REASON_UNSPECIFIED"}
    assert (Reason.NODE_LOST, Reason.OOM_KILLED, Reason.LEASE_EXPIRED) == ("NodeLost", "OOMKilled", "LeaseExpired")
    with pytest.raises(ImportError, match=r"only in the proto \['NEW_ONE'\]"):
        check_against_proto([*proto, "ATTEMPT_REASON_NEW_ONE"])
    with pytest.raises(ImportError, match=r"only here \['AGENT_FAULT'\]"):
        check_against_proto([n for n in proto if n != "ATTEMPT_REASON_AGENT_FAULT"])


# -- a gang member's steps -------------------------------------------------------------------------
def test_gang_steps_are_the_stored_words_and_the_protos_members_of_the_same_name() -> None:
    assert [s.value for s in GangStep] == ["Assemble", "Mesh", "Start"]
    assert [s.proto for s in GangStep] == [agent_pb2.GANG_STEP_ASSEMBLE, agent_pb2.GANG_STEP_MESH,
                                           agent_pb2.GANG_STEP_START]
    assert [GangStep.of_proto(s.proto) for s in GangStep] == list(GangStep)
    assert GangStep.of_proto(agent_pb2.GANG_STEP_UNSPECIFIED) is None and GangStep.of_proto(99) is None
    assert [s for s in GangStep if s.last] == [GangStep.START]
    assert gang_step("") is None and gang_step("Mesh") is GangStep.MESH
    with pytest.raises(ValueError):
        gang_step("Meshed")


def test_a_plan_names_its_step_by_word_and_a_report_carries_the_step_done_on_the_wire() -> None:
    assert plan_dict(agent_pb2.GangPlan(step=agent_pb2.GANG_STEP_MESH))["step"] == "Mesh"
    assert plan_dict(agent_pb2.GangPlan())["step"] == "Assemble", "an unspecified step is the first"
    att = Attempt("g1", phase="STARTING_SIDECARS", gang={"epoch": 3, "done": "Mesh", "address": "10.0.0.2",
                                                         "port": 29500, "probe_port": 29501})
    again = Attempt.from_persisted(json.loads(json.dumps(att.persisted())))
    report = again.update(0.0).gang
    assert (report.epoch, report.done, report.port) == (3, agent_pb2.GANG_STEP_MESH, 29500)
    assert not Attempt("g2", gang={"epoch": 3, "done": ""}).update(0.0).HasField("gang"), "nothing done: no report"


# -- the attempt table -----------------------------------------------------------------------------
def test_state_json_round_trips_the_attempts_the_tombstones_and_the_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    table = AttemptTable(tmp_path / "state.json", "n1", clock)
    table.add(Attempt("a1", stage=Stage.SUPERVISED, phase="RUNNING"), Volatile())
    table.add(Attempt("a2", stage=Stage.DONE, phase="FAILED", reason="Error", exit_code=3), Volatile())
    table.forget("a2")
    table.lease_deadline = clock.monotonic() + 30
    table.persist()

    later = ManualClock(wall=clock.wall + 10, mono=5.0)  # a restarted process: another monotonic origin
    again = AttemptTable(tmp_path / "state.json", "n1", later)
    [a1] = again.read()
    assert (a1.id, a1.stage, a1.phase) == ("a1", Stage.SUPERVISED, "RUNNING")
    assert dict(again.finished) == {"a2": {"phase": "FAILED", "reason": "Error", "exit_code": 3,
                                           "finish_time": None}}
    assert again.lease_deadline == pytest.approx(5.0 + 20)


def test_the_table_keeps_a_bounded_number_of_tombstones(tmp_path: Path) -> None:
    table = AttemptTable(tmp_path / "state.json", "n1", ManualClock())
    for i in range(TOMBSTONES + 3):
        table.add(Attempt(f"a{i}", stage=Stage.DONE, phase="SUCCEEDED"), Volatile())
        table.forget(f"a{i}")
    assert len(table.finished) == TOMBSTONES and "a0" not in table.finished and f"a{TOMBSTONES + 2}" in table.finished
    assert len(table) == 0


# -- checkpoint stores -----------------------------------------------------------------------------
def test_checkpoint_stores_are_per_agent_and_need_their_credentials_after_a_restart(tmp_path: Path) -> None:
    layout = L.AttemptLayout(tmp_path / "a1")
    s3 = agent_pb2.Location(uri="s3://bucket/p/job/", credentials={"AWS_ACCESS_KEY_ID": "k"})
    one, other = CheckpointStores(), CheckpointStores()
    one.remember("a1", 2, s3, layout)
    found = one.of("a1", layout)
    assert found is not None and found.uri == "s3://bucket/p/job/2/a1/" and dict(found.credentials) == {
        "AWS_ACCESS_KEY_ID": "k"}
    with pytest.raises(CheckpointFailed, match="restarted"):  # the record on disk, the keys in the other agent
        other.of("a1", layout)
    one.keep_only([])
    with pytest.raises(CheckpointFailed):
        one.of("a1", layout)
    blob_layout = L.AttemptLayout(tmp_path / "a2")
    one.remember("a2", 0, agent_pb2.Location(uri="blob://"), blob_layout)
    assert one.of("a2", blob_layout) is None
