"""The desired state (controllers/desired.py): FullState when a stream opens, for each case the stream
handled in place before; then the diff: each message kind, the no-op, and what is forgotten."""
from __future__ import annotations

from nodus.coordinator.controllers.desired import (ASSIGNED, CANCELLED, FullStateEntry, InHello, Message, OnNode,
                                                   Resync, Said, Send, Stop, Told, diff, full_state)


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


# -- FullState when the stream opens (full_state): the node's attempts and what the Hello reported ---

def test_full_state_assigns_what_the_node_should_run_and_marks_what_the_agent_already_runs() -> None:
    out = full_state([OnNode("new"), OnNode("running")], [InHello("running", live=True)])
    assert out == (FullStateEntry(Resync.ASSIGN, "new", reported=False),
                   FullStateEntry(Resync.ASSIGN, "running", reported=True))


def test_full_state_keeps_a_stop_with_a_checkpoint_running_and_the_diff_then_suspends_it() -> None:
    suspending = OnNode("a1", stop=Stop("Preempted", 10, 4))
    out = full_state([suspending], [InHello("a1", live=True)])
    assert out == (FullStateEntry(Resync.KEEP_FOR_SUSPEND, "a1", reported=True),)  # no Cancel in FullState
    # FullState told the agent to keep it (an Assignment): the first diff sends the Suspend.
    assert diff([suspending], {"a1": ASSIGNED}, {"a1"}, set()).messages == (
        Message(Send.SUSPEND, "a1", "Preempted", 10, 4),)


def test_full_state_cancels_a_plain_stop_the_agent_has_with_its_reason_and_grace() -> None:
    out = full_state([OnNode("a1", stop=Stop("Cancelled", 30))], [InHello("a1", live=True)])
    assert out == (FullStateEntry(Resync.CANCEL, "a1", "Cancelled", 30),)


def test_full_state_settles_a_stop_for_an_attempt_the_agent_does_not_have() -> None:
    out = full_state([OnNode("plain", stop=Stop("Cancelled", 5)), OnNode("ckpt", stop=Stop("Suspended", 0, 3))], [])
    assert out == (FullStateEntry(Resync.SETTLE, "plain", "Cancelled"),
                   FullStateEntry(Resync.SETTLE, "ckpt", "Suspended"))


def test_full_state_leaves_out_what_ended_in_the_store_and_the_agent_did_not_report_running() -> None:
    on_node = [OnNode("done", terminal=True, reason="Completed"), OnNode("lost", terminal=True, reason="NodeLost")]
    assert full_state(on_node, []) == ()
    assert full_state(on_node, [InHello("done", live=False), InHello("lost", live=False)]) == ()


def test_full_state_cancels_a_reported_attempt_that_ended_here_while_the_agent_was_away_with_its_reason() -> None:
    on_node = [OnNode("lost", terminal=True, reason="NodeLost"), OnNode("bare", terminal=True)]
    out = full_state(on_node, [InHello("lost", live=True), InHello("bare", live=True)])
    assert out == (FullStateEntry(Resync.CANCEL, "lost", "NodeLost"), FullStateEntry(Resync.CANCEL, "bare", "Unassigned"))


def test_full_state_cancels_a_reported_attempt_this_node_should_not_run_after_the_node_s_own() -> None:
    out = full_state([OnNode("mine")], [InHello("elsewhere", live=True), InHello("mine", live=True),
                                        InHello("ended", live=False)])
    assert out == (FullStateEntry(Resync.ASSIGN, "mine", reported=True),
                   FullStateEntry(Resync.CANCEL, "elsewhere", "Unassigned"))


def test_full_state_reads_the_last_report_of_an_attempt_the_hello_names_twice() -> None:
    assert full_state([], [InHello("a1", live=True), InHello("a1", live=False)]) == ()
