"""The agent daemon: reconciles what the coordinator assigns with the attempts it supervises.

One asyncio loop. The link (link.py) carries the conversation; this module keeps the attempts:
it accepts assignments (materialize inputs, spawn a supervisor), folds each supervisor's status
file into the attempt's phase (woken by the supervisor's datagram, or every poll interval), ships
logs and progress, uploads outputs, stops what it is told to stop, and stops everything when the
lease runs out. Its own state (state.json: the attempts and their stages, never a secret) is written
atomically on every change of stage, so a restarted agent re-adopts the supervisors still running.
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import hashlib
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodus.v1 import agent_pb2, common_pb2

from . import layout as L
from . import reconcile, recovery, sdnotify, shipping
from .gang import Gangs
from .aio import wait_event
from .attempts import Attempt, Stage, observe
from .backoff import Backoff
from .inputs import InputError, Materializer
from .inventory import disk_free, node_inventory
from .link import Link
from .nvml import Nvml
from .progress_tail import ProgressTail
from .runtime import ProcessRuntime, Refused
from .statefile import read_json, write_json

log = logging.getLogger("nodus.agent")

TOMBSTONES = 512
PROGRESS_MIN_INTERVAL = 0.5  # at most two Progress messages a second per attempt
FORGET_BATCH_SECONDS = 0.01  # acknowledged ends within this are forgotten with one state.json write


@dataclass(slots=True)
class AgentConfig:
    coordinator: str
    node: str
    work_dir: Path
    token: str
    runtime: str = "process"
    region: str = ""
    offering: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    advertise_address: str = ""
    interruptible: bool = False
    cgroup_root: str = "nodus"
    cgroups: bool = True
    stop_grace: float = 10.0
    poll_interval: float = 0.5
    input_ca_file: str | None = None
    coordinator_ca: bytes | None = None
    reconnect_base: float = 0.2
    reconnect_max: float = 10.0
    workload_user: str = ""
    zygote: bool = True


@dataclass(slots=True)
class Volatile:
    """What the agent holds about an attempt in memory only."""

    assignment: agent_pb2.Assignment | None = None
    """Kept (secrets included) only until the supervisor has them."""
    task: asyncio.Task[None] | None = None
    proc: Any = None
    progress: ProgressTail | None = None
    progress_sent: float = 0.0
    log_task: asyncio.Task[None] | None = None
    log_wake: asyncio.Event = field(default_factory=asyncio.Event)
    spawning: bool = False
    """Between the persisted SUPERVISED stage and the end of the spawn: nothing to observe yet."""


def notify_address(work_dir: Path) -> str:
    """An abstract unix socket name for supervisors to poke (no path length limit, nothing to clean)."""
    return "\0nodus-agent-" + hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:24]


class Agent:
    def __init__(self, cfg: AgentConfig, nvml: Nvml | None = None) -> None:
        self.cfg = cfg
        self.node_name = cfg.node
        self.work_dir = cfg.work_dir
        self.nvml = nvml if nvml is not None else Nvml()
        self.notify_addr = notify_address(cfg.work_dir)
        self.runtime = ProcessRuntime(cfg.work_dir, notify_address=self.notify_addr, cgroup_root=cfg.cgroup_root,
                                      cgroups=cfg.cgroups, stop_grace=cfg.stop_grace, host_gpus=len(self.nvml.handles),
                                      workload_user=cfg.workload_user, zygote=cfg.zygote)
        self.attempts: dict[str, Attempt] = {}
        self.volatile: dict[str, Volatile] = {}
        self.finished: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.link = Link(self, cfg.coordinator, cfg.token, tls_ca=cfg.coordinator_ca,
                         backoff=Backoff(base=cfg.reconnect_base, cap=cfg.reconnect_max))
        self.materializer = Materializer(self.link.blobs, cfg.input_ca_file)
        self.lease_deadline: float | None = None
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.shutting_down = False
        self._sock: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._work_dir_lock = -1
        self.checkpoint_tasks: dict[str, asyncio.Task[None]] = {}
        """At most one checkpoint (or suspend) in flight per attempt (recovery.py)."""
        self._doomed: list[L.AttemptLayout] = []
        """Directories of forgotten attempts, removed by the next sweep (or by `load` after a restart)."""
        self._sweeper: asyncio.Task[None] | None = None
        self.last_commits: dict[str, agent_pb2.CheckpointCommit] = {}
        """Each attempt's latest CheckpointCommit, resent in Hello (a commit lost with a stream)."""
        self.gangs = Gangs(self, cfg.advertise_address or _default_address())

    # -- life --------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "attempts").mkdir(exist_ok=True)
        os.chmod(self.work_dir, 0o755)
        self._take_work_dir()
        self._open_notify_socket()
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
        sdnotify.notify("READY=1\nSTATUS=supervising %d attempts" % len(self.attempts))
        log.info("nodus-agent %s ready: work dir %s, coordinator %s, %d attempts re-adopted, %d GPUs",
                 self.node_name, self.work_dir, self.cfg.coordinator, len(self.attempts), len(self.nvml.handles))
        await self.stopping.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stops the agent and leaves every workload running (their supervisors do not depend on it)."""
        sdnotify.notify("STOPPING=1")
        self.shutting_down = True
        tasks = [*self._tasks, *(t for v in self.volatile.values() for t in (v.task, v.log_task) if t)]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        for t in tasks:
            t.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5.0)
            if stuck:  # never hang a stop: what they did is in state.json or redone after the restart
                log.warning("%d tasks did not stop in time: %s", len(stuck), ", ".join(t.get_name() for t in stuck))
        self.persist()
        for layout in self._doomed:
            self._remove_dir(layout)
        self._doomed = []
        await self.link.close()
        await asyncio.to_thread(self.runtime.close)
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
        self.nvml.close()
        log.info("nodus-agent stopped; %d attempts left running under their supervisors",
                 sum(1 for a in self.attempts.values() if a.stage == Stage.SUPERVISED))

    def _take_work_dir(self) -> None:
        """One agent per work dir: two would both think they own every attempt."""
        fd = os.open(self.work_dir / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SystemExit(f"nodus-agent: another agent already runs on {self.work_dir}") from None
        self._work_dir_lock = fd  # held until the process ends

    def _open_notify_socket(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            s.bind(self.notify_addr)
        except OSError as e:
            log.warning("supervisor notifications unavailable (%s); polling every %.1fs", e, self.cfg.poll_interval)
            s.close()
            return
        self._sock = s
        asyncio.get_running_loop().add_reader(s.fileno(), self._on_datagram)

    def _on_datagram(self) -> None:
        assert self._sock is not None
        while True:
            try:
                self._sock.recv(512)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
        self.wake.set()

    async def _watch(self) -> None:
        while not self.shutting_down:
            await wait_event(self.wake, self.cfg.poll_interval)
            self.wake.clear()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad attempt must not stop the watch
                log.exception("watch tick failed")

    async def _watchdog(self, interval: float) -> None:
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    # -- inventory (called by the link) -------------------------------------------------------------
    def inventory(self) -> common_pb2.NodeInventory:
        return node_inventory(self.work_dir, self.nvml, runtimes=[self.runtime.runtime], region=self.cfg.region,
                              offering=self.cfg.offering, labels=self.cfg.labels,
                              advertise_address=self.cfg.advertise_address or _default_address(),
                              interruptible=self.cfg.interruptible)

    def disk_free(self) -> int:
        try:
            return disk_free(self.work_dir)
        except OSError:
            return 0

    # -- state file --------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.work_dir / "state.json"

    def persist(self, durable: bool = True) -> None:
        """Writes state.json; `durable=False` where a crash losing the change is harmless."""
        state = {"version": 1, "node": self.node_name,
                 "attempts": {i: a.persisted() for i, a in self.attempts.items()},
                 "finished": list(self.finished.items()),
                 "lease_expires": self._lease_wall()}
        write_json(self.state_path, state, durable=durable)

    def _lease_wall(self) -> float | None:
        if self.lease_deadline is None:
            return None
        return time.time() + (self.lease_deadline - time.monotonic())

    def load(self) -> None:
        """Re-adopts what a previous agent process left: supervisors still running, ends not yet acked."""
        state = read_json(self.state_path) or {}
        for attempt_id, end in state.get("finished") or []:
            self.finished[attempt_id] = end
        expires = state.get("lease_expires")
        if expires:
            self.lease_deadline = time.monotonic() + (float(expires) - time.time())
        for attempt_id, d in (state.get("attempts") or {}).items():
            try:
                att = Attempt.from_persisted(d)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("state.json: attempt %s unreadable (%s); dropped", attempt_id, e)
                continue
            layout = self.runtime.layout(att.id)
            if att.stage == Stage.SUPERVISED:
                alive = self.runtime.supervisor_alive(layout)
                if not alive and self.runtime.read_status(layout) is None:
                    att.stage = Stage.ACCEPTED  # the spawn never happened: nothing ran
            if att.stage == Stage.ACCEPTED:
                log.info("attempt %s had not started when the agent stopped; it starts afresh if assigned again",
                         att.id)
                self._remove_dir(layout)
                continue
            self._adopt(att)
        known_dirs = {self.runtime.layout(i).root.name for i in self.attempts}
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
                self._remove_dir(layout)
        self.persist()

    def _adopt(self, att: Attempt) -> None:
        self.attempts[att.id] = att
        v = self.volatile[att.id] = Volatile()
        layout = self.runtime.layout(att.id)
        v.progress = ProgressTail(layout.progress)
        v.progress.skip_to_tail()
        if att.stage == Stage.SUPERVISED:
            log.info("re-adopted attempt %s (supervisor %s)", att.id,
                     "running" if self.runtime.supervisor_alive(layout) else "finished")
        if att.stage == Stage.COLLECTING:
            v.task = asyncio.get_running_loop().create_task(shipping.upload_outputs(self, att), name=f"upload:{att.id}")
        if not att.log_done:
            v.log_task = asyncio.get_running_loop().create_task(shipping.ship_log(self, att), name=f"log:{att.id}")
        if att.gang and att.live:
            self.gangs.adopt(att)

    # -- the conversation --------------------------------------------------------------------------
    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello:
        """Hello with every attempt the agent runs or has not had an end acknowledged for."""
        hello = agent_pb2.Hello(node_id=session.node_id, session_id=session.session_id, epoch=session.epoch)
        for att in self.attempts.values():
            obs = hello.attempts.add(status=att.update())
            if (commit := self.last_commits.get(att.id)) is not None:
                obs.checkpoint.CopyFrom(commit)
            v = self.volatile.get(att.id)
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
            fs = msg.full_state
            if fs.HasField("lease"):
                self.renew_lease(fs.lease)
            live = [i for i, a in self.attempts.items() if a.live]
            known = set(self.attempts)
            self.apply(reconcile.full_state(fs, self.attempts.keys(), live, self.finished.keys(),
                                            self.cfg.stop_grace))
            for a in fs.assignments:
                if a.attempt_id not in known:
                    continue
                # An attempt we already run (re-adopted after a restart, or a reconnect): what lives
                # only in memory comes again with its assignment — the checkpoint store's credentials,
                # a gang member's current step.
                recovery.remember_store(self, a, self.runtime.layout(a.attempt_id))
                if a.HasField("gang"):
                    self.gangs.on_plan(a.gang)
        elif kind == "assignment":
            self.apply(reconcile.assignment(msg.assignment, self.attempts.keys(), self.finished.keys()))
        elif kind == "cancel":
            live = [i for i, a in self.attempts.items() if a.live]
            self.apply(reconcile.cancel(msg.cancel, live, self.cfg.stop_grace))
        elif kind == "suspend":
            recovery.on_suspend(self, msg.suspend)  # checkpoint, then stop
        elif kind == "checkpoint_request":
            recovery.on_checkpoint_request(self, msg.checkpoint_request)
        elif kind == "lease_renewal":
            self.renew_lease(msg.lease_renewal)
        elif kind == "ack":
            self.on_ack(stream_id, msg.ack.seq)
        elif kind == "gang_plan":
            self.gangs.on_plan(msg.gang_plan)

    def apply(self, actions: list[reconcile.Action]) -> None:
        for action in actions:
            if isinstance(action, reconcile.Start):
                self.accept(action.assignment)
            elif isinstance(action, reconcile.Stop):
                self.stop(action.attempt_id, action.reason, action.grace, action.phase)
            elif isinstance(action, reconcile.Resend):
                self._resend_finished(action.attempt_id)

    def renew_lease(self, lease: agent_pb2.LeaseRenewal) -> None:
        valid = lease.valid_for.seconds + lease.valid_for.nanos / 1e9 if lease.HasField("valid_for") else 0.0
        valid = valid or self.link.lease_duration
        if valid <= 0:
            return
        before = self.lease_deadline
        self.lease_deadline = time.monotonic() + valid
        if before is None or abs(self.lease_deadline - before) > max(1.0, valid / 4):
            self.persist()

    def on_ack(self, stream_id: int, seq: int) -> None:
        for att in self.attempts.values():
            if att.terminal_seq and att.terminal_seq[0] == stream_id and att.terminal_seq[1] <= seq:
                att.acked = True
        self._forget_done()

    def report(self, att: Attempt, force: bool = False) -> None:
        if not force and att.reported == att.key():
            return
        seq = self.link.send(attempt_update=att.update())
        if seq is None:
            return  # no stream: the next Hello carries it
        att.reported = att.key()
        if att.terminal:
            att.terminal_seq = (self.link.stream_id, seq)

    def _resend_finished(self, attempt_id: str) -> None:
        end = self.finished.get(attempt_id) or {}
        att = Attempt(attempt_id, phase=end.get("phase", L.LOST), reason=end.get("reason", "AgentFault"),
                      exit_code=end.get("exit_code"), finish_time=end.get("finish_time"),
                      message="this attempt already ended on this node")
        log.info("attempt %s was assigned again after it ended here; reporting its end again", attempt_id)
        self.link.send(attempt_update=att.update())

    # -- attempts ----------------------------------------------------------------------------------
    def accept(self, a: agent_pb2.Assignment) -> None:
        att = Attempt.of(a)
        self.attempts[att.id] = att
        v = self.volatile[att.id] = Volatile(assignment=a)
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
                self.finish(att, L.LOST, "AgentFault", f"the gang member's ports could not be reserved: {e}")
                return
        log.info("attempt %s accepted (job %s/%s index %d, attempt %d)", att.id, a.job.project, a.job.name,
                 a.index, a.attempt_number)
        self.persist(durable=False)  # an accepted attempt has run nothing: a restart drops it anyway
        self.report(att)
        v.task = asyncio.get_running_loop().create_task(self._start(att), name=f"start:{att.id}")

    async def _start(self, att: Attempt) -> None:
        v = self.volatile[att.id]
        a = v.assignment
        assert a is not None
        layout = self.runtime.layout(att.id)
        try:
            if layout.root.exists():
                await asyncio.to_thread(self._remove_dir, layout)
            await asyncio.to_thread(self.runtime.prepare, a)
            v.progress = ProgressTail(layout.progress)
            att.phase = "MATERIALIZING"
            self.report(att)
            await self.materializer.materialize(a, layout)
            att.inputs_ready_time = time.time()
            try:
                att.restored_from_seq = await recovery.restore_before_start(self, a, layout)
            except recovery.CheckpointFailed as e:
                log.warning("attempt %s: %s", att.id, e)
                self._note_in_log(layout, f"restore failed: {e}")
                self.finish(att, L.FAILED, "RestoreFailed", f"the checkpoint could not be restored: {e}")
                return
            await asyncio.to_thread(self.runtime.write_spec, a, layout)
            att.stage = Stage.SUPERVISED
            v.spawning = True
            self.persist()  # before the spawn: a restart then finds the lock or knows nothing ran
            try:
                v.proc = (await asyncio.to_thread(self.runtime.spawn, a, layout)).proc
            finally:
                v.spawning = False
                # A supervisor forked from the zygote may have written its status (and poked us) while
                # the spawn was still ours: look now, not at the next poll.
                self.wake.set()
            v.assignment = None  # the supervisor holds the secrets now
            v.log_task = asyncio.get_running_loop().create_task(shipping.ship_log(self, att), name=f"log:{att.id}")
            self.report(att)
        except asyncio.CancelledError:
            if self.shutting_down:
                raise
            stop = att.stop or {}
            self.finish(att, stop.get("phase", L.CANCELLED), stop.get("reason", "Cancelled"),
                        f"stopped before it started: {stop.get('reason', 'Cancelled')}")
        except InputError as e:
            log.info("attempt %s: %s", att.id, e)
            self._note_in_log(layout, str(e))
            self.finish(att, L.FAILED, e.reason, str(e))
        except Exception as e:  # noqa: BLE001 - an agent fault: the coordinator replaces the attempt
            log.exception("attempt %s could not start", att.id)
            self.finish(att, L.LOST, "AgentFault", f"the agent could not start the attempt: {type(e).__name__}: {e}")
        finally:
            if att.stage != Stage.SUPERVISED:
                v.assignment = None

    @staticmethod
    def _note_in_log(layout: L.AttemptLayout, text: str) -> None:
        try:
            layout.logs.mkdir(parents=True, exist_ok=True)
            with open(layout.log, "ab") as f:
                f.write(b"[nodus] " + text.encode() + b"\n")
        except OSError:
            pass

    def stop(self, attempt_id: str, reason: str, grace: float, phase: str = L.CANCELLED) -> None:
        att = self.attempts.get(attempt_id)
        if att is None or not att.live or att.stop is not None:
            return
        log.info("attempt %s: stopping (%s, grace %.0fs)", attempt_id, reason, grace)
        att.stop = {"reason": reason, "grace_seconds": grace, "phase": phase}
        self.persist()
        v = self.volatile[attempt_id]
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
            att.finish_time = time.time()
        att.supervisor_ended = True
        self.gangs.forget(att.id)
        log.info("attempt %s ended: %s %s%s", att.id, phase, reason,
                 f" (exit {att.exit_code})" if att.exit_code is not None else "")
        v = self.volatile.get(att.id)
        if v is not None:
            if v.log_task is None and not att.log_done:
                if self.runtime.layout(att.id).log.exists():
                    v.log_task = asyncio.get_running_loop().create_task(shipping.ship_log(self, att), name=f"log:{att.id}")
                else:
                    att.log_done = True
            self._send_progress(att, v, force=True)
            v.log_wake.set()
        self.persist()
        self.report(att)

    def tick(self) -> None:
        """Folds every supervisor's status, forwards progress, enforces the lease."""
        now = time.monotonic()
        for att in list(self.attempts.values()):
            v = self.volatile.get(att.id)
            if v is None:
                continue
            if att.stage == Stage.SUPERVISED and not v.spawning:
                self._observe(att, v)
            if v.progress is not None and att.stage in (Stage.SUPERVISED, Stage.COLLECTING):
                v.progress.poll()
                self._send_progress(att, v)
            if not att.log_done:
                v.log_wake.set()
        if self.lease_deadline is not None and now > self.lease_deadline:
            live = [a for a in self.attempts.values() if a.live and a.stop is None]
            if live:
                log.warning("no lease renewal for the lease duration: stopping %d attempts (their replacements "
                            "may already run elsewhere)", len(live))
                for att in live:
                    self.stop(att.id, "LeaseExpired", min(self.cfg.stop_grace, 5.0), L.LOST)
        self._forget_done()

    def _observe(self, att: Attempt, v: Volatile) -> None:
        layout = self.runtime.layout(att.id)
        if v.proc is not None and v.proc.poll() is not None:
            v.proc = None  # reaped
        alive = self.runtime.supervisor_alive(layout)
        status = self.runtime.read_status(layout)
        if att.gang and not att.gang.get("done") and (status or {}).get("gate") == "waiting":
            self.gangs.at_gate(att)
        seen = observe(status, alive)
        if seen is None:
            return
        fields = seen.fields
        if seen.kill_leftovers:
            log.warning("attempt %s: its supervisor is gone without a final status; killing what is left",
                        att.id)
            self.runtime.kill_leftovers(layout)
        if seen.stage == Stage.SUPERVISED:
            checkpointing = self.checkpoint_tasks.get(att.id)
            # While a checkpoint of a running attempt is taken the attempt is Checkpointing (it keeps
            # running; the program is held only for the local copy).
            att.phase = "CHECKPOINTING" if seen.phase == L.RUNNING and checkpointing is not None \
                and not checkpointing.done() else seen.phase
            att.start_time = fields.get("start_time", att.start_time)
            att.exit_code = fields.get("exit_code", att.exit_code)
            self.report(att)
            return
        att.supervisor_ended = True
        att.start_time = fields.get("start_time", att.start_time)
        att.exit_code = fields.get("exit_code", att.exit_code)
        att.oom_killed = bool(fields.get("oom_killed", False))
        if seen.stage == Stage.COLLECTING:
            att.stage = Stage.COLLECTING
            att.phase = seen.phase
            self.persist()
            self.report(att)
            v.task = asyncio.get_running_loop().create_task(shipping.upload_outputs(self, att), name=f"upload:{att.id}")
            return
        self.finish(att, seen.phase, str(fields.get("reason") or ""), str(fields.get("message") or ""),
                    finish_time=fields.get("finish_time") or time.time())

    def _send_progress(self, att: Attempt, v: Volatile, force: bool = False) -> None:
        tail = v.progress
        if tail is None:
            return
        if force:
            tail.poll()
        if not tail.changed:
            return
        now = time.monotonic()
        if not force and now - v.progress_sent < PROGRESS_MIN_INTERVAL:
            return
        msg = tail.message(att.id)
        if msg is None:
            return
        if self.link.send(progress=msg) is not None:
            tail.changed = False
            v.progress_sent = now

    def _forget_done(self) -> None:
        gone = [a for a in self.attempts.values() if a.stage == Stage.DONE and a.acked and a.log_done]
        for att in gone:
            del self.attempts[att.id]
            self.last_commits.pop(att.id, None)
            v = self.volatile.pop(att.id, None)
            if v and v.log_task:
                v.log_task.cancel()
            self.finished[att.id] = {"phase": att.phase, "reason": att.reason, "exit_code": att.exit_code,
                                     "finish_time": att.finish_time}
            while len(self.finished) > TOMBSTONES:
                self.finished.popitem(last=False)
            self._doomed.append(self.runtime.layout(att.id))
        if gone and self._sweeper is None:
            # Ends acknowledged together are forgotten together: one state.json write and one
            # removal pass for all of them. Until then state.json may still list one whose directory
            # is gone; a restart meanwhile re-reports its end (a no-op for the coordinator) and
            # forgets it again, as after a crash between a removal and the write.
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="forget")

    async def _sweep(self) -> None:
        try:
            await asyncio.sleep(FORGET_BATCH_SECONDS)
        finally:
            self._sweeper = None  # cancelled (shutdown): what is doomed stays for shutdown to remove
        doomed, self._doomed = self._doomed, []
        self.persist()
        if doomed:
            await asyncio.to_thread(lambda: [self._remove_dir(layout) for layout in doomed])

    def _remove_dir(self, layout: L.AttemptLayout) -> None:
        if layout.root.exists():
            try:
                self.runtime.remove(layout)
            except OSError as e:
                log.warning("could not remove %s: %s", layout.root, e)


def _default_address() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()
