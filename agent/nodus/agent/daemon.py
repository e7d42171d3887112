"""The agent daemon: supervises the attempts the coordinator assigns.

One asyncio loop. The `Agent` wires the parts together and runs the attempts' local life: it
accepts assignments (materialize inputs, restore, spawn a supervisor), folds each supervisor's
status file into the attempt's phase (woken by the supervisor's datagram, or every poll interval),
forwards progress, stops what it is told to stop, and stops everything when the lease runs out.
The parts, each given only what it uses: the attempt table and state.json (table.py), the
conversation (session.py over link.py), the pure decisions (reconcile.py for desired state,
decisions.py for time and acks), checkpoints (recovery.py), outputs and logs (shipping.py), gang
members (gang.py). state.json is written on every change of stage, off the loop and coalesced, and
flushed where a crash must not lose the change (table.py), so a restarted agent re-adopts the
supervisors still running.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any, Coroutine

from nodus.v1 import agent_pb2, common_pb2

from . import layout as L
from . import sdnotify
from .aio import wait_event
from .attempts import Attempt, Stage, observe
from .backoff import Backoff
from .blobs import BlobClient
from .cgroups import MoveWarmer
from .clock import Clock, SystemClock
from .decisions import Event, Forget, MarkAcked, LogShipped, MoveLease, Tick, decide, progress_due, shown_phase
from .enrolment import SubprocessX509
from .forgetting import Forgetting
from .gang import Gangs
from .inputs import InputError, Materializer
from .inventory import default_address, disk_free, node_inventory
from .link import Link, open_channel
from .notices import SupervisorNotices, notify_address
from .supervisor.phase import Gate
from .reasons import Reason
from .nvml import Nvml
from .progress_tail import ProgressTail
from .reconcile import Stop
from .recovery import CheckpointFailed, Checkpoints
from .runtime import Refused, node_runtime
from .session import Session
from .settings import AgentConfig
from .shipping import Shipping
from .spawning import spawn_gated
from .statefile import read_json
from .table import AttemptTable, Volatile, lock_work_dir

log = logging.getLogger("nodus.agent")


class Agent:
    def __init__(self, cfg: AgentConfig, nvml: Nvml | None = None, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.node_name = cfg.node
        self.work_dir = cfg.work_dir
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.nvml = nvml if nvml is not None else Nvml()
        self.wake = asyncio.Event()
        self._look_all = False
        """Set by `poke`: the next look is at every attempt."""
        self.notices = SupervisorNotices(notify_address(cfg.work_dir), self.wake)
        self.runtime = node_runtime(cfg, self.notices.address, len(self.nvml.handles), self.clock, self.nvml)
        self.moves = MoveWarmer.of_self() if self.runtime.cgroups and os.geteuid() == 0 else None
        self.table = AttemptTable(cfg.work_dir / "state.json", cfg.node, self.clock)
        channel, metadata = open_channel(cfg.coordinator, cfg.token, cfg.coordinator_ca, cfg.coordinator_insecure)
        self.blobs = BlobClient(channel, metadata)
        self.link = Link(self, channel, metadata, cfg.coordinator, clock=self.clock,
                         backoff=Backoff(base=cfg.reconnect_base, cap=cfg.reconnect_max),
                         tls=not cfg.coordinator_insecure, identity_dir=cfg.work_dir / "identity",
                         coordinator_ca=cfg.coordinator_ca, on_channel=self.blobs.use,
                         trust_files=(cfg.join_token_file, cfg.coordinator_ca_file), x509=SubprocessX509())
        self.materializer = Materializer(self.blobs, cfg.input_ca_file)
        self.checkpoints = Checkpoints(self.runtime, self.blobs, self.link, self.table, self, self.clock,
                                       cfg.stop_grace)
        self.shipping = Shipping(self.runtime, self.blobs, self.link, self.table, self, self.clock, cfg.reconnect_max)
        self.gangs = Gangs(self.table, self.runtime, self.link, self, cfg.advertise_address or default_address(),
                           self.clock, cfg.warm_probe)
        self.session = Session(self.table, self.link, self, self.checkpoints, self.gangs, self.runtime, self.clock,
                               cfg.stop_grace)
        self.stopping = asyncio.Event()
        self.shutting_down = False
        self._tasks: list[asyncio.Task[None]] = []
        self._work_dir_lock = -1
        self.forgetting = Forgetting(self.table, self.runtime, self.checkpoints, self._spawn_task)

    # -- life --------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "attempts").mkdir(exist_ok=True)
        os.chmod(self.work_dir, 0o755)
        self._work_dir_lock = lock_work_dir(self.work_dir)
        self.notices.open(self.cfg.poll_interval)
        await asyncio.to_thread(self.runtime.start_zygote)
        await asyncio.to_thread(self.runtime.probe_cgroups)
        self.load()
        self.nvml.start_xid_watch()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stopping.set)
            except (NotImplementedError, RuntimeError):
                pass
        self._tasks = [asyncio.create_task(self.link.run(), name="link"),
                       asyncio.create_task(self._watch(), name="watch")]
        interval = sdnotify.watchdog_interval()
        if interval:
            self._tasks.append(asyncio.create_task(self._watchdog(interval), name="watchdog"))
        self.tick()
        sdnotify.notify("READY=1\nSTATUS=supervising %d attempts" % len(self.table))
        log.info("nodus-agent %s ready: work dir %s, coordinator %s, %d attempts re-adopted, %d GPUs",
                 self.node_name, self.work_dir, self.cfg.coordinator, len(self.table), len(self.nvml.handles))
        await self.stopping.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stops the agent and leaves every workload running (their supervisors do not depend on it)."""
        sdnotify.notify("STOPPING=1")
        self.shutting_down = True
        tasks = [*self._tasks, *(t for v in self.table.volatile.values() for t in (v.task, v.log_task) if t)]
        if self.forgetting.sweeper is not None:
            tasks.append(self.forgetting.sweeper)
        self.gangs.warm.close()
        for t in tasks:
            t.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5.0)
            if stuck:  # never hang a stop: what they did is in state.json or redone after the restart
                log.warning("%d tasks did not stop in time: %s", len(stuck), ", ".join(t.get_name() for t in stuck))
        self.table.persist()
        await self.table.close()
        self.forgetting.remove_left()
        await self.link.close()
        await asyncio.to_thread(self.runtime.close)
        self.notices.close()
        self.nvml.close()
        log.info("nodus-agent stopped; %d attempts left running under their supervisors",
                 sum(1 for a in self.table if a.stage == Stage.SUPERVISED))

    async def _watch(self) -> None:
        """Looks at the attempts whose supervisors poked as soon as they poke, and at every attempt
        (and the lease) at least once per poll interval, or at once after `poke`."""
        last_full = float("-inf")
        while not self.shutting_down:
            await wait_event(self.wake, self.cfg.poll_interval)
            self.wake.clear()
            poked = self.notices.take()
            now = time.monotonic()  # the loop's own cadence, as wait_event's timeout (not the agent's clock)
            full = self._look_all or now - last_full >= self.cfg.poll_interval
            try:
                if full:
                    self._look_all, last_full = False, now
                    self.tick()
                else:
                    self.tick(poked)
            except Exception:  # noqa: BLE001 - one bad attempt must not stop the watch
                log.exception("watch tick failed")

    async def _watchdog(self, interval: float) -> None:
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    def poke(self) -> None:
        """Looks at every attempt now, not at the next poll."""
        self._look_all = True
        self.wake.set()

    # -- what the link asks (link.Node) -------------------------------------------------------------
    def inventory(self) -> common_pb2.NodeInventory:
        return node_inventory(self.work_dir, self.nvml, runtimes=list(self.runtime.runtimes), region=self.cfg.region,
                              offering=self.cfg.offering, labels=self.cfg.labels,
                              advertise_address=self.cfg.advertise_address or default_address(),
                              interruptible=self.cfg.interruptible)

    def gpus(self) -> list[common_pb2.Gpu]:
        return self.nvml.read()

    def disk_free(self) -> int:
        try:
            return disk_free(self.work_dir)
        except OSError:
            return 0

    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello:
        return self.session.hello(session, stream_id, hello_seq)

    def on_message(self, msg: agent_pb2.CoordinatorMessage, stream_id: int) -> None:
        self.session.on_message(msg, stream_id)

    def report(self, att: Attempt, force: bool = False) -> None:
        self.session.report(att, force)

    def report_soon(self, att: Attempt) -> None:
        self.session.report_soon(att)  # a passing state: moot if the attempt moves on first (ADR 0094)

    # -- re-adoption -------------------------------------------------------------------------------
    def load(self) -> None:
        """Re-adopts what a previous agent process left: supervisors still running, ends not yet acked."""
        for att in self.table.read():
            layout = self.runtime.layout(att.id)
            if att.stage == Stage.SUPERVISED:
                alive = self.runtime.supervisor_alive(layout)
                if not alive and self.runtime.read_status(layout) is None:
                    att.stage = Stage.ACCEPTED  # the spawn never happened: nothing ran
            if att.stage == Stage.ACCEPTED:
                log.info("attempt %s had not started when the agent stopped; it starts afresh if assigned again",
                         att.id)
                self.forgetting.remove_dir(layout)
                continue
            self._adopt(att)
        known_dirs = {self.runtime.layout(a.id).root.name for a in self.table}
        for d in sorted((self.work_dir / "attempts").iterdir()):
            if d.name in known_dirs or not d.is_dir():
                continue
            layout = L.AttemptLayout(d)
            spec = read_json(layout.spec) or {}
            if spec.get("attempt_id") and self.runtime.supervisor_alive(layout):
                log.warning("attempt %s runs but was missing from state.json; re-adopting it", spec["attempt_id"])
                self._adopt(Attempt(spec["attempt_id"], stage=Stage.SUPERVISED, phase="INITIALIZING"))
            else:
                self.runtime.kill_leftovers(layout)
                self.forgetting.remove_dir(layout)
        self.table.persist()

    def _adopt(self, att: Attempt) -> None:
        v = self.table.add(att, Volatile())
        layout = self.runtime.layout(att.id)
        v.progress = ProgressTail(layout.progress)
        v.progress.skip_to_tail()
        if att.stage == Stage.SUPERVISED:
            log.info("re-adopted attempt %s (supervisor %s)", att.id,
                     "running" if self.runtime.supervisor_alive(layout) else "finished")
        if att.stage == Stage.COLLECTING:
            v.task = self._spawn_task(self.shipping.upload_outputs(att), f"upload:{att.id}")
        if not att.log_done:
            v.log_task = self._spawn_task(self.shipping.ship_log(att, v.log_wake), f"log:{att.id}")
        if att.gang and att.live:
            self.gangs.adopt(att)

    @staticmethod
    def _spawn_task(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=name)

    # -- attempts ----------------------------------------------------------------------------------
    def accept(self, a: agent_pb2.Assignment) -> None:
        att = Attempt.of(a)
        v = self.table.add(att, Volatile(assignment=a))
        try:
            self.runtime.check(a)
        except Refused as r:
            log.info("attempt %s refused: %s", att.id, r)
            att.log_done = True
            self.finish(att, L.FAILED, r.reason, str(r))
            return
        if a.HasField("gang"):
            try:
                self.gangs.accept(att, a)
            except OSError as e:
                att.log_done = True
                self.finish(att, L.LOST, Reason.AGENT_FAULT, f"the gang member's ports could not be reserved: {e}")
                return
        log.info("attempt %s accepted (job %s/%s index %d, attempt %d)", att.id, a.job.project, a.job.name,
                 a.index, a.attempt_number)
        self.table.persist(durable=False)  # an accepted attempt has run nothing: a restart drops it anyway
        if self.moves is not None:
            self.moves.poke()  # its supervisor moves into a cgroup soon: start the kernel's wait now (ADR 0072)
        self.report_soon(att)
        v.task = self._spawn_task(self._start(att), f"start:{att.id}")

    async def _start(self, att: Attempt) -> None:
        v = self.table.volatile[att.id]
        a = v.assignment
        assert a is not None
        layout = self.runtime.layout(att.id)
        try:
            if layout.root.exists():
                await asyncio.to_thread(self.forgetting.remove_dir, layout)
            # the image first (oci; progress folds in tick): a pull that fails wastes no input download.
            # One thread call for both: each hop waits for a thread to be scheduled on a busy host.
            await asyncio.to_thread(self._prepare, a, layout)
            v.progress = ProgressTail(layout.progress)
            att.fold_pull(self.runtime.pull_progress(att.id))  # its last bytes, before write_spec forgets them
            att.phase = "MATERIALIZING"
            self.report_soon(att)
            att.inputs = await self.materializer.materialize(a, layout)
            att.inputs_ready_time = self.clock.now()
            try:
                att.restored_from_seq = await self.checkpoints.restore_before_start(a, layout)
            except CheckpointFailed as e:
                log.warning("attempt %s: %s", att.id, e)
                self._note_in_log(layout, f"restore failed: {e}")
                self.finish(att, L.FAILED, Reason.RESTORE_FAILED, f"the checkpoint could not be restored: {e}")
                return
            att.stage = Stage.SUPERVISED
            v.spawning = True
            self.table.persist()  # on disk before the first step: the supervisor waits for it at its gate
            if self.moves is not None:
                self.moves.poke()  # until the supervisor's first cgroup move, some ms after the fork (ADR 0082)
            try:
                v.proc = (await spawn_gated(self.runtime, self.table, a, layout)).proc
            finally:
                v.spawning = False
                # A supervisor forked from the zygote may have written its status (and poked us) while
                # the spawn was still ours: look now, not at the next poll.
                self.notices.add(att.id)
            v.assignment = None  # the supervisor holds the secrets now
            v.log_task = self._spawn_task(self.shipping.ship_log(att, v.log_wake, fresh=True), f"log:{att.id}")
            self.report_soon(att)  # inputs ready: rides with RUNNING unless the first step is slow to start
        except asyncio.CancelledError:
            if self.shutting_down:
                raise
            stop = att.stop or {}
            self.finish(att, stop.get("phase", L.CANCELLED), stop.get("reason", Reason.CANCELLED),
                        f"stopped before it started: {stop.get('reason', 'Cancelled')}")
        except (InputError, Refused) as e:
            log.info("attempt %s: %s", att.id, e)
            self._note_in_log(layout, str(e))
            self.finish(att, getattr(e, "phase", L.FAILED), e.reason, str(e))
        except Exception as e:  # noqa: BLE001 - an agent fault: the coordinator replaces the attempt
            log.exception("attempt %s could not start", att.id)
            self.finish(att, L.LOST, Reason.AGENT_FAULT,
                        f"the agent could not start the attempt: {type(e).__name__}: {e}")
        finally:
            if att.stage != Stage.SUPERVISED:
                v.assignment = None

    def _prepare(self, a: agent_pb2.Assignment, layout: L.AttemptLayout) -> None:
        self.runtime.prepare(a)
        self.runtime.pull(a, layout)

    @staticmethod
    def _note_in_log(layout: L.AttemptLayout, text: str) -> None:
        try:
            layout.logs.mkdir(parents=True, exist_ok=True)
            with open(layout.log, "ab") as f:
                f.write(b"[nodus] " + text.encode() + b"\n")
        except OSError:
            pass

    def stop(self, attempt_id: str, reason: str, grace: float, phase: str = L.CANCELLED) -> None:
        att = self.table.get(attempt_id)
        if att is None or not att.live or att.stop is not None:
            return
        log.info("attempt %s: stopping (%s, grace %.0fs)", attempt_id, reason, grace)
        att.stop = {"reason": reason, "grace_seconds": grace, "phase": phase}
        self.table.persist()
        v = self.table.volatile[attempt_id]
        if att.stage == Stage.ACCEPTED:
            if v.task is not None:
                v.task.cancel()
        else:
            self.runtime.request_stop(self.runtime.layout(attempt_id), reason, grace, phase)

    def finish(self, att: Attempt, phase: str, reason: str, message: str = "", **fields: Any) -> None:
        att.stage = Stage.DONE
        att.phase = phase
        att.reason = reason
        att.message = message
        for k, value in fields.items():
            setattr(att, k, value)
        if att.finish_time is None:
            att.finish_time = self.clock.now()
        att.supervisor_ended = True
        self.gangs.forget(att.id)
        log.info("attempt %s ended: %s %s%s", att.id, phase, reason,
                 f" (exit {att.exit_code})" if att.exit_code is not None else "")
        v = self.table.volatile.get(att.id)
        if v is not None:
            if v.log_task is None and not att.log_done:
                if self.runtime.layout(att.id).log.exists():
                    v.log_task = self._spawn_task(self.shipping.ship_log(att, v.log_wake, fresh=True),
                                                  f"log:{att.id}")
                else:
                    att.log_done = True
            self._send_progress(att, v, force=True)
            v.log_wake.set()
        self.table.persist()
        self.table.after_flush(lambda: self.report(att))  # never report an end a crash could make us forget

    def log_shipped(self, att: Attempt) -> None:
        att.log_done = True
        self.handle(LogShipped(att.id))

    def tick(self, only: set[str] | None = None) -> None:
        """Folds every supervisor's status, forwards progress; then the decisions (lease, forgetting).
        With `only` (the attempts whose supervisors just poked), those attempts alone, no decisions:
        a poke costs one attempt's reads, not every attempt's (bench/startup.py's indexes/s)."""
        attempts = self.table if only is None else [a for i in only if (a := self.table.get(i)) is not None]
        for att in attempts:
            v = self.table.volatile.get(att.id)
            if v is None:
                continue
            if att.stage == Stage.SUPERVISED and not v.spawning:
                self._observe(att, v)
            elif att.stage == Stage.ACCEPTED and att.fold_pull(self.runtime.pull_progress(att.id)):
                self.report(att)
            if v.progress is not None and att.stage in (Stage.SUPERVISED, Stage.COLLECTING):
                v.progress.poll()
                self._send_progress(att, v)
            if not att.log_done:
                v.log_wake.set()
        if only is None:
            self.handle(Tick(self.clock.monotonic()))

    # -- the decisions -----------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Performs what decisions.decide returns for `event` (session.Attempts)."""
        actions = decide(event, self.table.facts(), self.table.lease_deadline, self.cfg.stop_grace)
        stops = [a for a in actions if isinstance(a, Stop)]  # decisions stop attempts only when the lease is gone
        if stops:
            log.warning("no lease renewal for the lease duration: stopping %d attempts (their replacements "
                        "may already run elsewhere)", len(stops))
        forgotten = False
        for action in actions:
            if isinstance(action, Stop):
                self.stop(action.attempt_id, action.reason, action.grace, action.phase)
            elif isinstance(action, MarkAcked):
                att = self.table.get(action.attempt_id)
                if att is not None:
                    att.acked = True
            elif isinstance(action, Forget):
                self.forgetting.forget(action.attempt_id)
                forgotten = True
            elif isinstance(action, MoveLease):
                self.table.lease_deadline = action.deadline
                if action.persist:
                    self.table.persist()
        if forgotten:
            self.forgetting.sweep_soon()  # ends acknowledged together are forgotten together (forgetting.py)

    def _observe(self, att: Attempt, v: Volatile) -> None:
        layout = self.runtime.layout(att.id)
        if v.proc is not None and v.proc.poll() is not None:
            v.proc = None  # reaped
        alive = self.runtime.supervisor_alive(layout)
        status = self.runtime.read_status(layout)
        # the pod's denied count (network.egress), written by its supervisor; it only grows
        att.egress_denied = max(att.egress_denied, int((read_json(layout.run / "egress.json") or {}).get("denied") or 0))
        if att.gang and not att.gang.get("done") and (status or {}).get("gate") == Gate.WAITING:
            self.gangs.at_gate(att)
        seen = observe(status, alive, self.clock.now())
        if seen is None:
            return
        fields = seen.fields
        if seen.kill_leftovers:
            log.warning("attempt %s: its supervisor is gone without a final status; killing what is left",
                        att.id)
            self.runtime.kill_leftovers(layout)
        if seen.stage == Stage.SUPERVISED:
            att.phase = shown_phase(seen.phase, self.checkpoints.in_flight(att.id))
            att.start_time = fields.get("start_time", att.start_time)
            att.exit_code = fields.get("exit_code", att.exit_code)
            # What the supervisor shows is reported at once: Running, a checkpoint however short, and the
            # init, sidecar and stop phases of an attempt that has them (a trivial index has none; ADR 0094)
            self.report(att)
            return
        att.supervisor_ended = True
        att.start_time = fields.get("start_time", att.start_time)
        att.exit_code = fields.get("exit_code", att.exit_code)
        att.oom_killed = bool(fields.get("oom_killed", False))
        if seen.stage == Stage.COLLECTING:
            att.stage = Stage.COLLECTING
            att.phase = seen.phase
            self.table.persist()
            self.report(att)
            v.task = self._spawn_task(self.shipping.upload_outputs(att), f"upload:{att.id}")
            return
        self.finish(att, seen.phase, str(fields.get("reason") or ""), str(fields.get("message") or ""),
                    finish_time=fields.get("finish_time") or self.clock.now())

    def _send_progress(self, att: Attempt, v: Volatile, force: bool = False) -> None:
        tail = v.progress
        if tail is None:
            return
        if force:
            tail.poll()
        now = self.clock.monotonic()
        if not progress_due(now, v.progress_sent, tail.changed, force):
            return
        msg = tail.message(att.id, self.clock.now())
        if msg is None:
            return
        if self.link.send(progress=msg) is not None:
            tail.changed = False
            v.progress_sent = now
