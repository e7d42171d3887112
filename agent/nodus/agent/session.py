"""The agent's side of the conversation with the coordinator (link.py carries it): what a Hello
says, what each CoordinatorMessage does, and how an attempt's change is reported.

Desired state goes through reconcile.py (pure) into the attempts' starts and stops; acks and lease
renewals through decisions.py (pure) into the attempt table; checkpoint requests and suspends to
recovery.Checkpoints; gang plans to gang.Gangs. Nothing here runs work itself.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from nodus.v1 import agent_pb2

from . import layout as L
from . import reconcile
from .attempts import Attempt
from .clock import Clock
from .decisions import Acked, Event, LeaseRenewed
from .gang import Gangs
from .recovery import Checkpoints
from .reasons import Reason
from .runtime import ProcessRuntime
from .table import AttemptTable

log = logging.getLogger("nodus.agent")

PASSING_REPORT_DELAY = 0.5
"""Seconds a passing state of an attempt (accepted, materializing, inputs ready: the agent's own) waits before it
is reported (`Session.report_soon`): a short index passes through all of them well within it (80-300 ms on
a busy 2-CPU node), and each report is a stream message, a durable write of the Attempt, its watch events
and an ack (ADR 0094). A state that lasts (a download) shows half a second late."""


class Stream(Protocol):
    """The open stream to the coordinator (link.Link)."""

    stream_id: int

    @property
    def lease_duration(self) -> float: ...

    def send(self, **message: Any) -> int | None: ...


class Attempts(Protocol):
    """What the conversation asks of the agent's attempts (daemon.Agent)."""

    def accept(self, a: agent_pb2.Assignment) -> None: ...

    def stop(self, attempt_id: str, reason: str, grace: float, phase: str = L.CANCELLED) -> None: ...

    def handle(self, event: Event) -> None:
        """Decides about an event (decisions.decide) and performs the actions."""
        ...


class Session:
    def __init__(self, table: AttemptTable, stream: Stream, attempts: Attempts, checkpoints: Checkpoints,
                 gangs: Gangs, runtime: ProcessRuntime, clock: Clock, stop_grace: float) -> None:
        self.table = table
        self.stream = stream
        self.attempts = attempts
        self.checkpoints = checkpoints
        self.gangs = gangs
        self.runtime = runtime
        self.clock = clock
        self.stop_grace = stop_grace

    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello:
        """Hello with every attempt the agent runs or has not had an end acknowledged for."""
        hello = agent_pb2.Hello(node_id=session.node_id, session_id=session.session_id, epoch=session.epoch)
        for att in self.table:
            obs = hello.attempts.add(status=att.update(self.clock.now()))
            if (commit := self.checkpoints.last_commits.get(att.id)) is not None:
                obs.checkpoint.CopyFrom(commit)
            v = self.table.volatile.get(att.id)
            if v and v.progress and (p := v.progress.message(att.id)) is not None:
                obs.progress.CopyFrom(p)
                v.progress.changed = False
            att.reported = att.key()
            if att.terminal:
                att.terminal_seq = (stream_id, hello_seq)
        return hello

    def on_message(self, msg: agent_pb2.CoordinatorMessage, stream_id: int) -> None:
        kind = msg.WhichOneof("message")
        if kind == "full_state":
            self._full_state(msg.full_state)
        elif kind == "assignment":
            self.apply(reconcile.assignment(msg.assignment, self.table.attempts.keys(), self.table.finished.keys()))
        elif kind == "cancel":
            self.apply(reconcile.cancel(msg.cancel, self.table.live_ids(), self.stop_grace))
        elif kind == "suspend":
            self.checkpoints.on_suspend(msg.suspend)  # checkpoint, then stop
        elif kind == "checkpoint_request":
            self.checkpoints.on_checkpoint_request(msg.checkpoint_request)
        elif kind == "lease_renewal":
            self.renew_lease(msg.lease_renewal)
        elif kind == "ack":
            self.attempts.handle(Acked(stream_id, msg.ack.seq))
        elif kind == "gang_plan":
            self.gangs.on_plan(msg.gang_plan)

    def _full_state(self, fs: agent_pb2.FullState) -> None:
        if fs.HasField("lease"):
            self.renew_lease(fs.lease)
        known = set(self.table.attempts)
        self.apply(reconcile.full_state(fs, self.table.attempts.keys(), self.table.live_ids(),
                                        self.table.finished.keys(), self.stop_grace))
        for a in fs.assignments:
            if a.attempt_id not in known:
                continue
            # An attempt we already run (re-adopted after a restart, or a reconnect): what lives
            # only in memory comes again with its assignment — the checkpoint store's credentials,
            # a gang member's current step.
            self.checkpoints.remember_store(a, self.runtime.layout(a.attempt_id))
            if a.HasField("gang"):
                self.gangs.on_plan(a.gang)

    def apply(self, actions: list[reconcile.Action]) -> None:
        for action in actions:
            if isinstance(action, reconcile.Start):
                self.attempts.accept(action.assignment)
            elif isinstance(action, reconcile.Stop):
                self.attempts.stop(action.attempt_id, action.reason, action.grace, action.phase)
            elif isinstance(action, reconcile.Resend):
                self._resend_finished(action.attempt_id)

    def renew_lease(self, lease: agent_pb2.LeaseRenewal) -> None:
        valid = lease.valid_for.seconds + lease.valid_for.nanos / 1e9 if lease.HasField("valid_for") else 0.0
        self.attempts.handle(LeaseRenewed(self.clock.monotonic(), valid or self.stream.lease_duration))

    def report(self, att: Attempt, force: bool = False) -> None:
        """Sends the attempt's update unless the coordinator has it already (no stream: the next Hello)."""
        if not force and att.reported == att.key():
            return
        seq = self.stream.send(attempt_update=att.update(self.clock.now()))
        if seq is None:
            return
        att.reported = att.key()
        if att.terminal:
            att.terminal_seq = (self.stream.stream_id, seq)

    def report_soon(self, att: Attempt) -> None:
        """Reports a passing state once it has lasted PASSING_REPORT_DELAY (ADR 0094). A change of the
        attempt meanwhile makes this one moot: each change reports itself (now, after a flush, or soon), so
        the last state always goes out, and an end still goes out only once state.json holds it."""
        key = att.key()
        if att.reported == key:
            return

        def due() -> None:
            if att.key() == key:
                self.report(att)
        try:
            asyncio.get_running_loop().call_later(PASSING_REPORT_DELAY, due)
        except RuntimeError:  # no loop (a test's direct call): at once, as before
            self.report(att)

    def _resend_finished(self, attempt_id: str) -> None:
        end = self.table.finished.get(attempt_id) or {}
        att = Attempt(attempt_id, phase=end.get("phase", L.LOST), reason=end.get("reason", Reason.AGENT_FAULT),
                      exit_code=end.get("exit_code"), finish_time=end.get("finish_time"),
                      message="this attempt already ended on this node")
        log.info("attempt %s was assigned again after it ended here; reporting its end again", attempt_id)
        self.stream.send(attempt_update=att.update(self.clock.now()))
