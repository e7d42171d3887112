"""The desired-state diff (controllers/desired.py): each message kind, the no-op, and what is forgotten."""
from __future__ import annotations

from nodus.coordinator.controllers.desired import (ASSIGNED, CANCELLED, Message, OnNode, Said, Send, Stop, Told,
                                                   diff)


def test_nothing_said_yet_assigns_it() -> None:
    out = diff([OnNode("a1")], {}, set(), set())
    assert out.messages == (Message(Send.ASSIGN, "a1"),)


def test_what_was_already_told_sends_nothing() -> None:
    on_node = [OnNode("a1"), OnNode("a2", stop=Stop("Cancelled", 5)), OnNode("a3", stop=Stop("Preempted", 0, 7))]
    said = {"a1": ASSIGNED, "a2": CANCELLED, "a3": Said(Told.SUSPEND, 7)}
    out = diff(on_node, said, {"a1", "a2", "a3"}, set())
    assert out.messages == ()
    assert out.unsaid == frozenset() and out.forgotten == frozenset()


def test_a_stop_cancels_with_its_reason_and_grace_once() -> None:
    on_node = [OnNode("a1", stop=Stop("Cancelled", 30))]
    assert diff(on_node, {"a1": ASSIGNED}, {"a1"}, set()).messages == (Message(Send.CANCEL, "a1", "Cancelled", 30),)
    assert diff(on_node, {"a1": CANCELLED}, {"a1"}, set()).messages == ()
    assert diff(on_node, {"a1": ASSIGNED}, {"a1"}, {"a1"}).messages == ()  # it ended already: nothing to stop


def test_a_stop_with_a_checkpoint_suspends_and_a_newer_seq_suspends_again() -> None:
    on_node = [OnNode("a1", stop=Stop("Preempted", 10, 4))]
    assert diff(on_node, {"a1": ASSIGNED}, {"a1"}, set()).messages == (
        Message(Send.SUSPEND, "a1", "Preempted", 10, 4),)
    assert diff(on_node, {"a1": Said(Told.SUSPEND, 3)}, {"a1"}, set()).messages == (
        Message(Send.SUSPEND, "a1", "Preempted", 10, 4),)
    assert diff(on_node, {"a1": CANCELLED}, {"a1"}, set()).messages == ()  # a Cancel already stops it


def test_a_stop_for_an_attempt_the_agent_never_had_settles_it_here() -> None:
    out = diff([OnNode("a1", stop=Stop("Cancelled", 0, 2))], {}, set(), set())
    assert out.messages == (Message(Send.SETTLE, "a1", "Cancelled"),)


def test_an_attempt_that_ended_while_the_agent_was_away_is_cancelled_with_its_reason() -> None:
    on_node = [OnNode("a1", terminal=True, reason="NodeLost"), OnNode("a2", terminal=True)]
    out = diff(on_node, {"a1": ASSIGNED, "a2": ASSIGNED}, {"a1", "a2"}, set())
    assert out.messages == (Message(Send.CANCEL, "a1", "NodeLost"), Message(Send.CANCEL, "a2", "Unassigned"))
    assert diff(on_node, {"a1": ASSIGNED}, {"a1"}, {"a1"}).messages == ()  # the agent reported it ended


def test_a_running_gang_member_gets_its_plan_checked() -> None:
    assert diff([OnNode("g0", gang=True)], {"g0": ASSIGNED}, {"g0"}, set()).messages == (Message(Send.PLAN, "g0"),)
    assert diff([OnNode("g0", gang=True)], {"g0": ASSIGNED}, {"g0"}, {"g0"}).messages == ()


def test_an_attempt_off_the_node_is_cancelled_unsaid_and_forgotten() -> None:
    out = diff([OnNode("a1")], {"a1": ASSIGNED, "gone": ASSIGNED, "stopped": CANCELLED}, {"a1", "gone", "stopped"},
               {"ended"})
    assert out.messages == (Message(Send.CANCEL, "gone", "Unassigned"),)
    assert out.unsaid == {"gone", "stopped"}
    assert out.forgotten == {"gone", "stopped", "ended"}


def test_an_attempt_off_the_node_that_ended_is_not_cancelled() -> None:
    out = diff([], {"gone": ASSIGNED}, {"gone"}, {"gone"})
    assert out.messages == () and out.unsaid == {"gone"} and out.forgotten == {"gone"}
