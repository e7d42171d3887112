"""The Attempt's one state machine: every writer's event through its table, refusals with a reason,
the table covering every phase, the proto mapped by name, and no other module writing a phase."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nodus.v1 import common_pb2

from nodus.coordinator.agent_wire import fail_mutation
from nodus.coordinator.controllers.attempt_machine import (LEGAL, AssignmentRefused, AttemptPhase, Created, NodeLost,
                                                           Placed, Refusal, Reported, StoppedUnplaced, transition)
from nodus.coordinator.controllers.attempts import Report, fold_report
from nodus.coordinator.controllers.job_controller import new_attempt, stop
from nodus.coordinator.controllers.lease import lost
from nodus.coordinator.controllers.placement import bind
from nodus.coordinator.scheduler import Placement

ROOT = Path(__file__).resolve().parent.parent / "coordinator" / "nodus" / "coordinator"
MACHINE = ROOT / "controllers" / "attempt_machine.py"


def _attempt(phase: str | None = None, node: str = "") -> dict:
    obj = {"metadata": {"name": "j-0-1", "namespace": "p", "generation": 1},
           "spec": {"id": "att-1", "job": "j", "index": 0, "number": 1}, "status": {}}
    if phase:
        obj["status"]["phase"] = phase
    if node:
        obj["spec"]["node"] = node
    return obj


def _job() -> dict:
    return {"metadata": {"name": "j", "namespace": "p", "uid": "u1"}, "spec": {"command": ["true"]}}


def test_every_writer_moves_through_the_machine():
    created = new_attempt(_job(), 0, 1, 0.0)
    assert created["status"]["phase"] == "Pending"

    placed = bind(Placement("n1", (0,), "fits"), 1.0)(created)
    assert placed["status"]["phase"] == "Provisioning" and placed["spec"]["node"] == "n1"

    running = fold_report(placed, Report(AttemptPhase.RUNNING, time=2.0), 2.0)
    assert running["phase"] == "Running"

    on_node = {**placed, "status": running}
    gone = lost("n1", 3.0)(dict(on_node))
    assert gone["status"]["phase"] == "Lost" and gone["status"]["reason"] == "NodeLost"

    unplaced = stop("Cancelled", 0, 4.0)(new_attempt(_job(), 0, 2, 0.0))
    assert unplaced["status"]["phase"] == "Cancelled" and unplaced["status"]["reason"] == "Cancelled"

    refused = fail_mutation("InvalidAssignment", "secret s is missing", 5.0)(dict(on_node))
    assert refused["status"]["phase"] == "Failed" and refused["status"]["reason"] == "InvalidAssignment"


def test_an_illegal_transition_is_refused_with_a_reason():
    done = _attempt("Succeeded", node="n1")
    for event in (Placed(1.0), NodeLost("n1", 1.0), StoppedUnplaced("Cancelled", 1.0),
                  AssignmentRefused("InvalidAssignment", "", 1.0),
                  Reported(AttemptPhase.RUNNING, {"phase": "Running"})):
        refusal = transition(done, event)
        assert isinstance(refusal, Refusal), event
        assert refusal.current is AttemptPhase.SUCCEEDED and "never left" in refusal.reason

    backwards = transition(_attempt("Stopping", node="n1"), Reported(AttemptPhase.RUNNING, {}))
    assert isinstance(backwards, Refusal) and "Stopping -> Running" in backwards.reason
    assert isinstance(transition(_attempt("Running", node="n1"), Placed(1.0)), Refusal)
    assert isinstance(transition(_attempt("Running", node="n2"), NodeLost("n1", 1.0)), Refusal)
    assert isinstance(transition(_attempt("Pending", node="n1"), StoppedUnplaced("Cancelled", 1.0)), Refusal)
    assert isinstance(transition(_attempt("Pending"), Created()), Refusal)
    older = _attempt("Running", node="n1")
    older["status"]["reportTime"] = "2026-01-01T00:00:10.000000Z"
    assert isinstance(transition(older, Reported(AttemptPhase.RUNNING, {}, time=1.0)), Refusal)
    # The writers keep what they had: a refused event writes nothing.
    assert fold_report(_attempt("Stopping", node="n1"), Report(AttemptPhase.RUNNING), 1.0) is None
    assert lost("n1", 1.0)(_attempt("Failed", node="n1")) is None


def test_checkpointing_returns_to_running():
    assert not isinstance(transition(_attempt("Checkpointing"), Reported(AttemptPhase.RUNNING, {})), Refusal)
    assert not isinstance(transition(_attempt("Running"), Reported(AttemptPhase.CHECKPOINTING, {})), Refusal)


def test_the_table_covers_every_phase():
    assert set(LEGAL) == set(AttemptPhase)
    for phase, successors in LEGAL.items():
        assert successors <= set(AttemptPhase)
        if phase.terminal:
            assert not successors
        else:
            assert {p for p in AttemptPhase if p.terminal} <= successors and phase in successors


def test_the_proto_is_mapped_by_name_both_ways():
    proto_names = {n for n in common_pb2.AttemptPhase.keys() if n != "ATTEMPT_PHASE_UNSPECIFIED"}
    assert proto_names == {"ATTEMPT_PHASE_" + p.name for p in AttemptPhase}
    for phase in AttemptPhase:
        assert AttemptPhase.of_proto(phase.proto) is phase
        assert common_pb2.AttemptPhase.Name(phase.proto) == "ATTEMPT_PHASE_" + phase.name
    assert AttemptPhase.of_proto(common_pb2.ATTEMPT_PHASE_UNSPECIFIED) is None
    assert AttemptPhase.of_proto(999) is None


def phase_writes(source: str) -> list[int]:
    """Lines that write an Attempt's phase: a "phase" key (subscript, update(phase=…), dict literal)
    given a value that names AttemptPhase."""
    lines = []

    def names_attempt_phase(node: ast.AST | None) -> bool:
        return node is not None and any(isinstance(n, ast.Name) and n.id == "AttemptPhase" for n in ast.walk(node))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "phase" and names_attempt_phase(node.value)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "phase" and isinstance(node.func, ast.Attribute) and node.func.attr in (
                        "update", "setdefault") and names_attempt_phase(kw.value):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "phase" and names_attempt_phase(value):
                    lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_planted_phase_write():
    for planted in ('status["phase"] = AttemptPhase.LOST.value',
                    'status.update(phase=AttemptPhase.LOST.value, reason="x")',
                    'obj["status"] = {**s, "phase": AttemptPhase.FAILED.value}'):
        assert phase_writes(planted) == [1], planted
    assert phase_writes('status["phase"] = job_phase.value') == []


def test_no_module_but_the_machine_writes_an_attempt_phase():
    offenders = {str(path.relative_to(ROOT)): lines for path in sorted(ROOT.rglob("*.py")) if path != MACHINE
                 if (lines := phase_writes(path.read_text()))}
    assert offenders == {}
    assert phase_writes(MACHINE.read_text())  # the scan sees the machine's own writes


def test_gang_phases_are_the_protos_by_name():
    from nodus.v1 import gang_pb2

    from nodus.coordinator.controllers.gang_phase import GangPhase, terminal_phases

    proto_names = {n for n in gang_pb2.GangPhase.keys() if n != "GANG_PHASE_UNSPECIFIED"}
    assert proto_names == {"GANG_PHASE_" + p.name for p in GangPhase}
    assert all(p.value.upper() == p.name for p in GangPhase)
    assert terminal_phases() == {GangPhase.DONE} and GangPhase.DONE.terminal and not GangPhase.RUNNING.terminal


def test_reasons_are_one_proto_enum_shared_by_agent_and_coordinator():
    from nodus.agent.attempts import LOST_CAPACITY_REASONS

    from nodus.coordinator.controllers.attempt_machine import LOST_CAPACITY_STOPS, REASON_CLASSES

    # The stored words stay the words the tests and objects use.
    assert {"Completed", "Error", "OOMKilled", "NodeLost", "Drained", "Preempted", "Reclaimed", "AgentFault",
            "Cancelled", "Suspended", "GangRestart", "InvalidAssignment", "WaitingForCapacity"} <= set(REASON_CLASSES)
    assert {"Drained", "Preempted", "Reclaimed", "NodeLost"} <= LOST_CAPACITY_STOPS
    assert LOST_CAPACITY_STOPS == LOST_CAPACITY_REASONS  # one list: both sides read the proto
    assert REASON_CLASSES["OOMKilled"] == common_pb2.REASON_CLASS_CUSTOMER_FAILURE
    assert REASON_CLASSES["Suspended"] == common_pb2.REASON_CLASS_CANCEL
    assert all(counts != common_pb2.REASON_CLASS_UNSPECIFIED for counts in REASON_CLASSES.values())
    # A drain is lost capacity: the Cancelled report of a drained attempt is recorded Lost.
    drained = {**_attempt("Running", node="n1")}
    drained["spec"]["stop"] = {"reason": "Drained"}
    folded = fold_report(drained, Report(AttemptPhase.CANCELLED, reason="Drained"), 1.0)
    assert folded["phase"] == "Lost" and folded["reason"] == "Drained"


def test_reasons_are_written_through_one_typed_enum_read_from_the_proto_by_name():
    from nodus.coordinator.controllers.reasons import AttemptReason, check_against_proto

    proto = {v.name for v in common_pb2.AttemptReason.DESCRIPTOR.values if v.number}
    assert {"ATTEMPT_REASON_" + r.name for r in AttemptReason} == proto
    assert all(r.proto == common_pb2.AttemptReason.Value("ATTEMPT_REASON_" + r.name) for r in AttemptReason)
    # The member is its stored word, in an object, an f-string and JSON alike.
    assert AttemptReason.OOM_KILLED == "OOMKilled" and f"{AttemptReason.NODE_LOST}" == "NodeLost"
    assert AttemptReason.DRAINED.counts_as == common_pb2.REASON_CLASS_LOST_CAPACITY
    # A misspelt member, or one the proto does not have, fails the check the module runs at import.
    with pytest.raises(ImportError, match="only here \\['NODE_LOTS'\\], only in the proto \\['NODE_LOST'\\]"):
        check_against_proto({*AttemptReason.__members__, "NODE_LOTS"} - {"NODE_LOST"})
    # The Job controller's stops and verdicts carry the members' words.
    lost = {**_attempt("Running", node="n1")}
    folded = fold_report(lost, Report(AttemptPhase.CANCELLED), 1.0)
    assert folded["phase"] == "Lost" and folded["reason"] == AttemptReason.AGENT_FAULT == "AgentFault"
