"""One Connect stream of one node's session: the conversation (Hello and FullState, reports folded and
acknowledged once durable, seq, acks) and the sending of the desired-state diff (`controllers.desired`).
A reconnect starts from scratch both ways (what was said is this stream's alone), and every fold is
idempotent, so a resent report never counts twice."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator

from nodus.v1 import agent_pb2

from . import checkpoints, git_access
from .checkpoints.buckets import bucket_location
from .agent_wire import (cancel_message, fail_mutation, lease_message, on_node_of, plan_message, probe_of, progress_of,
                         report_of, to_diff)
from .controllers import assignment, desired
from .controllers import gang_plan, workload_tokens
from .controllers.attempts import AttemptPhase, Report, fold_probe, fold_progress, fold_report
from .controllers.cache import Cache, attempt_key
from .controllers.desired import ASSIGNED, CANCELLED, Said, Told
from .controllers.reasons import AttemptReason
from .controllers.views import AttemptView
from .errors import NodusError

if TYPE_CHECKING:
    from .agents import AgentServicer

log = logging.getLogger("nodus.agents")

_END = object()
_UNLESS_FINISHED = (desired.Send.CANCEL, desired.Send.SUSPEND, desired.Send.PLAN)
"""What the diff sends only to an attempt the agent has not reported ended."""


class Session:
    """One Connect stream of one node's session."""

    def __init__(self, service: AgentServicer, node: str, session_id: str, epoch: int, same_host: bool = True) -> None:
        self.service = service
        self.node, self.session_id, self.epoch, self.same_host = node, session_id, epoch, same_host
        self.dirty = asyncio.Event()
        self.error: NodusError | None = None
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self._seq = 0
        self._said: dict[str, Said] = {}
        """attempt id → what this stream told the agent."""
        self._finished: set[str] = set()
        """Attempts the agent reported ended: nothing left to stop."""
        self._plans: dict[str, tuple[int, str]] = {}
        """attempt id → (epoch, step) of the last GangPlan this stream sent."""
        self._known: set[str] = set()
        """Attempts the agent has: those its Hello reported and those assigned on this stream. A stop
        for an attempt outside this set is settled here, since no agent will ever report it."""
        self._acked = 0

    # -- plumbing ---------------------------------------------------------------------------------
    def send(self, **message: Any) -> None:
        self._seq += 1
        self._out.put_nowait(agent_pb2.CoordinatorMessage(seq=self._seq, **message))

    def end(self, error: NodusError | None = None) -> None:
        if self.error is None:
            self.error = error
        self._out.put_nowait(_END)

    async def outbound(self) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        while True:
            message = await self._out.get()
            if message is _END:
                return
            yield message

    @property
    def cache(self) -> Cache:
        return self.service.cache

    # -- the conversation -------------------------------------------------------------------------
    async def open(self, first: agent_pb2.AgentMessage) -> None:
        """Folds the Hello's observations, then sends FullState (the first message down)."""
        self.service.registry.hello(self.node, self.session_id, self.epoch)  # alive from now (ADR 0088)
        hello: list[desired.InHello] = []
        for observation in first.hello.attempts:
            attempt_id = observation.status.attempt_id
            self._known.add(attempt_id)
            if observation.HasField("checkpoint"):  # before the status: a suspended attempt has ended since
                await checkpoints.commit(self.cache, self.service.objects, observation.checkpoint,
                                         self.service.clock.now())
            phase = await self._update(observation.status, from_hello=True)
            hello.append(desired.InHello(attempt_id, live=phase is not None and not phase.terminal))
            if observation.HasField("progress"):
                await self._progress(observation.progress)
        assignments, cancels = await self._full_state(hello)
        self.send(full_state=agent_pb2.FullState(assignments=assignments, cancels=cancels, lease=self._lease()))
        self.send(ack=agent_pb2.Ack(seq=first.seq))
        log.info("node %s connected (session epoch %d): %d attempts reported, %d assigned, %d cancelled",
                 self.node, self.epoch, len(hello), len(assignments), len(cancels))
        self.dirty.set()  # what FullState cannot say (a pending Suspend) follows from the first diff

    async def read(self, messages: AsyncIterator[agent_pb2.AgentMessage]) -> None:
        """Handles what the agent sends, in order, a batch at a time: the reports that arrived
        together are folded together (one write per attempt, the attempts' writes in one group
        commit) and acknowledged, in order, once durable."""
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for message in messages:
                    if message.WhichOneof("message") == "heartbeat":
                        # Liveness as it arrives, never behind the durable writes of the reports before it:
                        # a busy store must not make a connected node's lease run out (ADR 0049, 0054).
                        self._beat(message.heartbeat)
                    inbox.put_nowait(message)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the transport broke; the agent reconnects
                inbox.put_nowait(e)
                return
            inbox.put_nowait(_END)

        pumper = asyncio.create_task(pump(), name=f"agent-pump:{self.node}")
        try:
            while True:
                batch = [await inbox.get()]
                while not inbox.empty():
                    batch.append(inbox.get_nowait())
                last = batch[-1]
                ended = last is _END or isinstance(last, Exception)
                await self._handle_batch(batch[:-1] if ended else batch)
                if isinstance(last, NodusError):
                    raise last  # a heartbeat of a superseded session
                if ended:
                    if isinstance(last, Exception):
                        log.info("node %s: stream ended: %s", self.node, last)
                    break
        except asyncio.CancelledError:
            raise
        except NodusError as e:
            self.end(e)
            return
        except Exception as e:  # noqa: BLE001 - the transport broke; the agent reconnects
            log.info("node %s: stream ended: %s", self.node, e)
        finally:
            pumper.cancel()
        self.end()

    async def _handle_batch(self, batch: list[agent_pb2.AgentMessage]) -> None:
        """Reports (AttemptUpdate, Progress) are gathered per attempt, in order, and folded at the
        next message of another kind or the batch's end; everything else is handled as it comes."""
        group: dict[str, list[agent_pb2.AgentMessage]] = {}
        pending: list[int] = []

        async def flush() -> None:
            if group:
                results = await asyncio.gather(*(self._fold(attempt_id, items) for attempt_id, items in group.items()),
                                               return_exceptions=True)
                group.clear()
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
            for seq in pending:
                self.send(ack=agent_pb2.Ack(seq=seq))
            pending.clear()

        for message in batch:
            kind = message.WhichOneof("message")
            if kind == "progress" or (kind == "attempt_update" and message.attempt_update.reason != AttemptReason.SUSPEND_FAILED):
                body = message.progress if kind == "progress" else message.attempt_update
                group.setdefault(body.attempt_id, []).append(message)
                pending.append(message.seq)
            elif kind == "ack":
                self._acked = max(self._acked, message.ack.seq)
            else:
                await flush()
                await self._handle(message)
        await flush()

    async def _fold(self, attempt_id: str, items: list[agent_pb2.AgentMessage]) -> None:
        """Folds one attempt's reports, in the order they came, in one write (as `_update` and
        `_progress` would one by one)."""
        folds: list[tuple[bool, Any]] = []
        unwanted = 0
        for message in items:
            if message.WhichOneof("message") == "progress":
                folds.append((False, progress_of(message.progress)))
                continue
            report = report_of(message.attempt_update)
            if report is None:
                continue
            if report.phase.terminal:
                self._finished.add(attempt_id)
            else:
                unwanted += 1
            folds.append((True, report))
        attempt = self.cache.attempt_by_id(attempt_id)
        if attempt is None or (attempt.get("spec") or {}).get("node") != self.node:
            for _ in range(unwanted):
                # Nobody wants it here (deleted, or placed elsewhere): stop it.
                self._cancel(attempt_id, AttemptReason.UNASSIGNED, 0)
            return
        if not folds:
            return
        now = self.service.clock.now()
        key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            changed = False
            for is_report, report in folds:
                status = fold_report(obj, report, now) if is_report else fold_progress(obj, report)
                if status is not None:
                    obj, changed = {**obj, "status": status}, True
            return obj if changed else None
        await self.service.write_report(key, mutate)  # with its Job's decision where it can (ADR 0127)

    async def _handle(self, message: agent_pb2.AgentMessage) -> None:
        kind = message.WhichOneof("message")
        if kind == "heartbeat":
            pass  # taken as it arrived (`_beat`); acknowledged in order with the rest
        elif kind == "attempt_update":
            await self._update(message.attempt_update)
            if message.attempt_update.reason == AttemptReason.SUSPEND_FAILED:
                await checkpoints.suspend_failed(self.cache, self.service.objects, message.attempt_update.attempt_id,
                                                 checkpoints.rules.SUSPEND_TRIES)
        elif kind == "checkpoint_commit":
            await checkpoints.commit(self.cache, self.service.objects, message.checkpoint_commit,
                                     self.service.clock.now())
        elif kind == "progress":
            await self._progress(message.progress)
        elif kind == "ack":
            self._acked = max(self._acked, message.ack.seq)
            return
        elif kind == "hello":
            raise NodusError("BadRequest", "Hello may only open a stream", fix="open a new stream to resync")
        elif kind == "probe_result":
            await self._probe(message.probe_result)
        self.send(ack=agent_pb2.Ack(seq=message.seq))

    async def _probe(self, result: agent_pb2.ProbeResult) -> None:
        attempt = self.cache.attempt_by_id(result.attempt_id)
        if attempt is None or (attempt.get("spec") or {}).get("node") != self.node:
            return
        probe = probe_of(result)

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = fold_probe(obj, int(result.epoch), probe)
            return None if status is None else {**obj, "status": status}
        await self.service.objects.mutate(attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"]),
                                          mutate)

    async def _update(self, update: agent_pb2.AttemptUpdate, from_hello: bool = False) -> AttemptPhase | None:
        """Folds one report into its Attempt (durably) and returns the report's phase."""
        report = report_of(update)
        attempt = self.cache.attempt_by_id(update.attempt_id)
        if report is None:
            return None
        if report.phase.terminal:
            self._finished.add(update.attempt_id)
        if attempt is None or (attempt.get("spec") or {}).get("node") != self.node:
            if not report.phase.terminal and not from_hello:
                # Nobody wants it here (deleted, or placed elsewhere): stop it.
                self._cancel(update.attempt_id, AttemptReason.UNASSIGNED, 0)
            return report.phase
        now = self.service.clock.now()
        key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = fold_report(obj, report, now)
            return None if status is None else {**obj, "status": status}
        await self.service.objects.mutate(key, mutate)
        return report.phase

    async def _progress(self, progress: agent_pb2.Progress) -> None:
        attempt = self.cache.attempt_by_id(progress.attempt_id)
        if attempt is None or (attempt.get("spec") or {}).get("node") != self.node:
            return
        report = progress_of(progress)
        key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = fold_progress(obj, report)
            return None if status is None else {**obj, "status": status}
        await self.service.objects.mutate(key, mutate)

    def _beat(self, heartbeat: agent_pb2.Heartbeat) -> None:
        """A heartbeat: the node is alive on this replica (in memory; the stored lease is written in the
        background), and the agent hears its lease renewed."""
        self.service.registry.beat(self.node, self.session_id, self.epoch, heartbeat.disk_free_bytes, heartbeat.gpus)
        self.send(lease_renewal=self._lease())

    def _lease(self) -> agent_pb2.LeaseRenewal:
        expire = self.service.registry.lease_expiry(self.node) or self.service.clock.now()
        return lease_message(self.service.registry.leases.duration, expire)

    def _cancel(self, attempt_id: str, reason: str, grace: int) -> None:
        self._said[attempt_id] = CANCELLED
        self.send(cancel=cancel_message(attempt_id, reason, grace))

    # -- desired state ----------------------------------------------------------------------------
    async def _full_state(self, hello: list[desired.InHello]) -> tuple[list[agent_pb2.Assignment],
                                                                        list[agent_pb2.Cancel]]:
        """FullState's messages as `desired.full_state` decides them, recording what they say."""
        on_node = {a["spec"]["id"]: a for a in self.cache.attempts_on(self.node)}
        decided = desired.full_state([on_node_of(a, checkpoints.suspend_message(a)) for a in on_node.values()], hello)
        assignments, cancels = [], []
        for entry in decided:
            attempt_id = entry.attempt_id
            if entry.resync is desired.Resync.SETTLE:
                await self._never_started(on_node[attempt_id])
            elif entry.resync is desired.Resync.CANCEL:
                cancels.append(cancel_message(attempt_id, entry.reason, entry.grace_seconds))
                self._said[attempt_id] = CANCELLED
            else:  # ASSIGN, or KEEP_FOR_SUSPEND: the Suspend follows FullState from the first _diff
                built = await self._assignment(on_node[attempt_id], running=entry.reported)
                if built is not None:
                    assignments.append(built)
                    self._said[attempt_id] = ASSIGNED
                    self._known.add(attempt_id)
        return assignments, cancels

    async def follow(self) -> None:
        """Sends what changes in the node's desired state, for as long as the stream lives."""
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            try:
                await self._diff()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next change retries; a reconnect resyncs anyway
                log.exception("node %s: sending desired state failed", self.node)

    async def checkpoint_cadence(self) -> None:
        """Sends Periodic CheckpointRequests as they fall due (recovery.checkpoint.interval)."""
        asked: dict[str, tuple[int, float]] = {}
        while True:
            await asyncio.sleep(checkpoints.CADENCE_TICK)
            try:
                for request in checkpoints.due_requests(self.cache, self.node, self.service.clock.now(), asked,
                                                          self.service.interruptions.of_offering):
                    await self._with_store(request)
                    self.send(checkpoint_request=request)
            except Exception:  # noqa: BLE001 - the next tick tries again
                log.exception("node %s: checkpoint cadence failed", self.node)

    async def _with_store(self, message: agent_pb2.CheckpointRequest | agent_pb2.Suspend) -> None:
        """Adds the attempt's checkpoint store with its Connection's keys as they are now, so a rotated
        Secret reaches a running attempt."""
        attempt = self.cache.attempt_by_id(message.attempt_id)
        if attempt is None:
            return
        job = self.cache.job(attempt["metadata"]["namespace"], attempt["spec"]["job"])
        store = await self._current_store(attempt, job) if job is not None else None
        if store is not None:
            message.store.CopyFrom(store)

    async def _current_store(self, attempt: dict[str, Any], job: dict[str, Any]) -> agent_pb2.Location | None:
        """A running attempt's checkpoint store as it is now. When its keys cannot be read now (the
        Connection or Secret is gone) it goes without: the agent keeps the keys it has."""
        try:
            return await checkpoints.checkpoint_store(checkpoints.reader(self.service.objects), self.service.vault, job)
        except NodusError as e:
            log.warning("attempt %s: its checkpoint store's keys cannot be read now (%s); the agent keeps its own",
                        attempt["metadata"]["name"], e.message)
            return None

    async def _diff(self) -> None:
        """Sends what `desired.diff` decides, and records what it said."""
        on_node = to_diff(self.cache, self.node, self._said, self._finished)
        suspends = {attempt_id: suspend for attempt_id, attempt in on_node.items()
                    if (suspend := checkpoints.suspend_message(attempt)) is not None}
        decided = desired.diff([on_node_of(attempt, suspends.get(attempt_id)) for attempt_id, attempt in on_node.items()],
                               self._said, self._known, self._finished)
        for message in decided.messages:
            attempt_id = message.attempt_id
            if attempt_id in self._finished and message.send in _UNLESS_FINISHED:
                continue  # the agent reported it ended while an earlier message was being built
            if message.send is desired.Send.CANCEL:
                self._cancel(attempt_id, message.reason, message.grace_seconds)
            elif message.send is desired.Send.SUSPEND:
                suspend = suspends[attempt_id]
                self._said[attempt_id] = Said(Told.SUSPEND, message.seq)
                await self._with_store(suspend)
                self.send(suspend=suspend)  # checkpoint, then stop
            elif message.send is desired.Send.SETTLE:
                await self._never_started(on_node[attempt_id])
            elif message.send is desired.Send.ASSIGN:
                built = await self._assignment(on_node[attempt_id])
                if built is not None:
                    self._said[attempt_id] = ASSIGNED
                    self._known.add(attempt_id)
                    self.send(assignment=built)
            elif message.send is desired.Send.PLAN:
                self._send_plan(on_node[attempt_id])
        for attempt_id in list(self._plans):
            if attempt_id not in on_node:
                del self._plans[attempt_id]
        for attempt_id in decided.unsaid:
            self._said.pop(attempt_id, None)
        self._known -= decided.forgotten  # deleted: forget it, so a long-lived stream does not grow
        self._finished -= decided.forgotten

    async def _never_started(self, attempt: dict[str, Any]) -> None:
        """A stop for an attempt this agent never had (stopped before its assignment went out): it ends
        here as the agent would have reported it, so it neither holds capacity nor stays live."""
        stop = attempt["spec"]["stop"]
        report = Report(AttemptPhase.CANCELLED, reason=stop.get("reason", AttemptReason.CANCELLED),
                        message="stopped before it started on the node")
        now = self.service.clock.now()

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = fold_report(obj, report, now)
            return None if status is None else {**obj, "status": status}
        await self.service.objects.mutate(attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"]),
                                          mutate)

    async def _assignment(self, attempt: dict[str, Any], running: bool = False) -> agent_pb2.Assignment | None:
        """The attempt's Assignment; None when its Job is gone or it cannot be built (then it fails as
        InvalidAssignment). `running`: the agent reported it, and this is FullState's copy after a
        reconnect; a checkpoint store whose Connection or Secret is gone by now does not fail it (the
        agent keeps the keys it has: `_current_store`)."""
        project = attempt["metadata"]["namespace"]
        job = self.cache.job(project, attempt["spec"]["job"])
        job_view = self.cache.job_view(project, attempt["spec"]["job"])  # the same revision as `job`: no await between
        if job is None or job_view is None or job["metadata"].get("uid") != attempt["spec"].get("jobUID"):
            return None  # its Job is gone: the Job controller stops and deletes it
        if attempt["spec"].get("node") != self.node:
            return None  # node scope (ADR 0045): an Assignment and its Secret values go only to the attempt's node

        try:
            view = self._view(attempt)
            built = await assignment.build(attempt, job, self.service.vault, self._output_of(project),
                                           self.service.image_registry, self._bucket_of(project, running))
            await git_access.fill(built, checkpoints.reader(self.service.objects), self.service.vault, job)
            if not running:  # one the agent reported holds its token: a repeated Assignment is a no-op there
                await workload_tokens.attach(built, attempt, job, self.service.identity, self.service.objects.store,
                                             self.service.api, self.same_host)  # ADRs 0055, 0065
            store = (await self._current_store(attempt, job) if running
                     else await checkpoints.checkpoint_store(checkpoints.reader(self.service.objects),
                                                             self.service.vault, job))
            # The index's attempts (what a restore reads), not the Job's: O(n²) over a Job's n indexes (ADR 0109).
            lineage = self.cache.attempts_of_index(project, attempt["spec"]["job"], int(attempt["spec"].get("index", 0)))
            checkpoints.prepare(built, attempt, job, lineage, store, self.service.interruptions.of_offering(view.offering))
            plan = None if not view.in_gang else gang_plan.plan(
                view, self.cache.attempt_views_of(project, attempt["spec"]["job"]), job_view, self.service.gang_config)
            if plan is not None:
                built.gang.CopyFrom(plan_message(plan, self.service.gang_config))
                self._plans[attempt["spec"]["id"]] = (plan.epoch, plan.step)
            return built
        except NodusError as e:
            # The message names objects and keys, never a value (the vault's values stay in the Assignment).
            message = f"{e.message}: {e.fix}" if e.fix else e.message
            log.warning("attempt %s cannot be assigned: %s", attempt["metadata"]["name"], message)
            await self.service.objects.mutate(attempt_key(project, attempt["metadata"]["name"]),
                                              fail_mutation(AttemptReason.INVALID_ASSIGNMENT, message, self.service.clock.now()))
            return None

    def _send_plan(self, attempt: dict[str, Any]) -> None:
        """Tells a gang member its next step when it changed (every member's report can change it)."""
        project = attempt["metadata"]["namespace"]
        job = self.cache.job_view(project, attempt["spec"]["job"])
        if job is None:
            return
        plan = gang_plan.plan(self._view(attempt), self.cache.attempt_views_of(project, attempt["spec"]["job"]), job,
                              self.service.gang_config)
        if plan is None or self._plans.get(plan.attempt_id) == (plan.epoch, plan.step):
            return
        self._plans[plan.attempt_id] = (plan.epoch, plan.step)
        self.send(gang_plan=plan_message(plan, self.service.gang_config))

    def _view(self, attempt: dict[str, Any]) -> AttemptView:
        """`attempt` as a view: the cache's (decoded once per revision) while the cache still holds this very
        dict; once the cache moved on (an earlier message awaited), the dict itself, decoded, so what is sent
        agrees with the copy the diff decided on."""
        key = attempt_key(attempt["metadata"]["namespace"], attempt["metadata"]["name"])
        view = self.cache.attempt_view(key) if self.cache.get(key) is attempt else None
        return view if view is not None else AttemptView.from_object(attempt)

    def _bucket_of(self, project: str, running: bool) -> assignment.BucketLocator:
        """Bucket inputs' objects with their Connections' keys as they are now. For a running attempt (FullState's
        copy) whose Connection is gone by now it goes without the keys: its inputs are in place already."""
        read = checkpoints.reader(self.service.objects)

        async def locate(connection: str, uri: str, at: str) -> agent_pb2.Location:
            try:
                return await bucket_location(read, self.service.vault, project, connection, uri, at)
            except NodusError:
                if running:
                    return agent_pb2.Location(uri=uri)
                raise
        return locate

    def _output_of(self, project: str) -> Any:
        def find(job: str, output: str, index: int) -> dict[str, Any] | None:
            producer = self.cache.job(project, job) or {}
            return next((o for o in (producer.get("status") or {}).get("outputs") or []
                         if o.get("name") == output and int(o.get("index") or 0) == index and o.get("sha256")), None)
        return find

