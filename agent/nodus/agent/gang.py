"""A gang member on this node: reserve ports, assemble, probe, start through the launcher.

The coordinator tells each member its step (GangPlan), derived from what every member reported:

1. Assemble: the attempt is materialized, restored and spawned like any other; its supervisor runs
   the init command and the sidecars and then waits at its gate (status `gate: waiting`). The agent
   has reserved two ports by listening on them (the rendezvous port, rank 0's MASTER_PORT, and the
   probe's echo port) and reports done = Assemble with its advertised address and both ports.
2. Mesh: the probe (`probe/`, a subprocess) measures TCP RTT to every peer and the gang's
   all-reduce bus bandwidth within its budget; the agent sends the ProbeResult and reports
   done = Mesh. A failed probe is reported as such and does not stop the gang. When the plan says
   the Mesh step will come (GangPlan.probe), the member takes a probe process started ahead
   (`probe_process`: torch already imported, or importing while the gang assembles) at accept.
3. Start: the launcher (`nodus.launchers`) turns the plan into this member's steps and environment;
   the agent releases its reservations and writes run/launch.json, which opens the gate.

Reservations live in this process: after an agent restart the ports are reserved again (the same
numbers; the member already reported them). The epoch is the fencing token: a plan for another
epoch than the attempt's is ignored.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from nodus.launchers.model import MemberPlan, Rendezvous, Topology
from nodus.launchers.registry import launch
from nodus.v1 import agent_pb2, common_pb2

from . import layout as L
from .attempts import GangStep, gang_step
from .clock import Clock
from .launch import GangLaunch
from .probe_process import ProbeProcess, WarmProbes, discard, start_probe
from .reasons import Reason
from .statefile import read_json, write_json

if TYPE_CHECKING:
    from .attempts import Attempt
    from .runtime import ProcessRuntime
    from .table import AttemptTable

log = logging.getLogger("nodus.agent.gang")

LAUNCHERS = {common_pb2.LAUNCHER_PLAIN: "Plain", common_pb2.LAUNCHER_TORCHRUN: "Torchrun",
             common_pb2.LAUNCHER_RAY: "Ray", common_pb2.LAUNCHER_VERL: "Verl",
             common_pb2.LAUNCHER_ACCELERATE: "Accelerate", common_pb2.LAUNCHER_DEEPSPEED: "Deepspeed"}
PATHS = {"Private": common_pb2.NETWORK_PATH_PRIVATE, "Public": common_pb2.NETWORK_PATH_PUBLIC,
         "Direct": common_pb2.NETWORK_PATH_DIRECT, "Relayed": common_pb2.NETWORK_PATH_RELAYED}
PROBE_GRACE = 15.0
"""Seconds past the probe's own budget before the agent gives up on it."""


def _seconds(d: Any) -> float:
    return d.seconds + d.nanos / 1e9


def plan_dict(plan: agent_pb2.GangPlan) -> dict[str, Any]:
    return {"epoch": plan.epoch, "rank": plan.rank, "size": plan.size, "gpus_per_node": plan.gpus_per_node,
            "launcher": LAUNCHERS.get(plan.launcher, "Plain"), "step": (GangStep.of_proto(plan.step) or GangStep.ASSEMBLE).value,
            "rendezvous_address": plan.rendezvous_address, "rendezvous_port": plan.rendezvous_port,
            "peers": [{"rank": p.rank, "address": p.address, "port": p.port, "probe_port": p.probe_port}
                      for p in plan.peers],
            "probe_max_bytes": plan.probe_max_bytes or (16 << 20),
            "probe_budget": _seconds(plan.probe_budget) if plan.HasField("probe_budget") else 30.0,
            "startup_timeout": _seconds(plan.startup_timeout) if plan.HasField("startup_timeout") else 900.0}


def _reserve(address: str, port: int = 0, listen: bool = True) -> socket.socket:
    """A socket bound to `port` (0: any free one) of every interface: the port stays ours. The probe's
    port listens (the probe takes the socket over); the rendezvous port is bound only, so a worker
    waiting for rank 0's head is refused until the head itself listens there, never fooled by the
    reservation."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        if listen:
            s.listen(64)
        s.set_inheritable(False)
    except OSError:
        s.close()
        raise
    return s


class Member:
    """The in-memory half of one member (sockets and tasks); the durable half is `Attempt.gang`."""

    def __init__(self) -> None:
        self.rendezvous: socket.socket | None = None
        self.probe: socket.socket | None = None
        self.task: asyncio.Task[None] | None = None
        self.preloaded: asyncio.Task[ProbeProcess] | None = None
        """The probe's process, started ahead and waiting for its plan (None: started at Mesh)."""

    def release(self) -> None:
        for s in (self.rendezvous, self.probe):
            if s is not None:
                s.close()
        self.rendezvous = self.probe = None
        discard(self.preloaded)
        self.preloaded = None


class Stream(Protocol):
    def send(self, **message: Any) -> int | None: ...


class Host(Protocol):
    """What a member's steps ask of the agent."""

    def report(self, att: "Attempt", force: bool = False) -> None: ...

    def stop(self, attempt_id: str, reason: str, grace: float, phase: str = L.CANCELLED) -> None: ...


class Gangs:
    """The gang members of one agent."""

    def __init__(self, table: "AttemptTable", runtime: "ProcessRuntime", stream: Stream, host: Host, address: str,
                 clock: Clock, warm_probe: bool = True) -> None:
        self.table = table
        self.runtime = runtime
        self.stream = stream
        self.host = host
        self.address = address
        self.clock = clock
        self.members: dict[str, Member] = {}
        self.warm = WarmProbes(warm_probe)

    # -- joining -----------------------------------------------------------------------------------
    def accept(self, att: "Attempt", a: agent_pb2.Assignment) -> None:
        """A new member: its facts and its reserved ports (before anything of it runs)."""
        plan = plan_dict(a.gang)
        m = Member()
        try:
            m.rendezvous = _reserve(self.address, listen=False)
            m.probe = _reserve(self.address)
        except OSError:
            m.release()
            raise
        self.members[att.id] = m
        if a.gang.probe:
            m.preloaded = self.warm.take()
        att.gang = {"epoch": plan["epoch"], "rank": plan["rank"], "size": plan["size"],
                    "gpus_per_node": plan["gpus_per_node"], "launcher": plan["launcher"], "done": "",
                    "address": self.address, "port": m.rendezvous.getsockname()[1],
                    "probe_port": m.probe.getsockname()[1], "plan": plan}

    def adopt(self, att: "Attempt") -> None:
        """After an agent restart: reserve the same ports again (unless the member already started)."""
        g = att.gang or {}
        done = gang_step(g.get("done"))
        if not g or (done is not None and done.last):
            return
        m = self.members[att.id] = Member()
        try:
            m.rendezvous = _reserve(self.address, int(g.get("port") or 0), listen=False)
            m.probe = _reserve(self.address, int(g.get("probe_port") or 0))
        except OSError as e:
            log.warning("attempt %s: could not reserve its gang ports again: %s", att.id, e)

    def forget(self, attempt_id: str) -> None:
        m = self.members.pop(attempt_id, None)
        if m is not None:
            if m.task is not None:
                m.task.cancel()
            m.release()

    # -- the steps ---------------------------------------------------------------------------------
    def on_plan(self, plan: agent_pb2.GangPlan) -> None:
        att = self.table.get(plan.attempt_id)
        if att is None or not att.gang or not att.live or att.stop is not None:
            return
        if plan.epoch != att.gang["epoch"]:
            log.info("attempt %s: a plan for epoch %d ignored (the member is of epoch %d)", att.id, plan.epoch,
                     att.gang["epoch"])
            return
        att.gang["plan"] = plan_dict(plan)
        self.table.persist(durable=False)
        self.step(att)

    def at_gate(self, att: "Attempt") -> None:
        """The supervisor waits at its gate: the member is assembled."""
        g = att.gang
        if not g or g.get("done"):
            return
        g["done"] = GangStep.ASSEMBLE.value
        self.table.persist()
        self.host.report(att)
        log.info("attempt %s: gang rank %d of epoch %d assembled (%s, port %s, probe port %s)", att.id, g["rank"],
                 g["epoch"], g["address"], g["port"], g["probe_port"])
        self.step(att)

    def step(self, att: "Attempt") -> None:
        g = att.gang or {}
        plan = g.get("plan") or {}
        m = self.members.get(att.id)
        done, asked = gang_step(g.get("done")), gang_step(plan.get("step"))
        if m is None or done is None or att.stop is not None:
            return
        if asked is GangStep.MESH and done is GangStep.ASSEMBLE and m.task is None:
            m.task = asyncio.get_running_loop().create_task(self._mesh(att, m, plan), name=f"probe:{att.id}")
        elif asked is GangStep.START and not done.last and (m.task is None or m.task.done()):
            self._start(att, m, plan)

    async def _mesh(self, att: "Attempt", m: Member, plan: dict[str, Any]) -> None:
        g = att.gang or {}
        budget = float(plan.get("probe_budget") or 30.0)
        request = {"rank": g["rank"], "size": g["size"],
                   "peers": [{"rank": p["rank"], "address": p["address"], "probe_port": p["probe_port"]}
                             for p in plan.get("peers") or []],
                   "store": {"address": plan.get("rendezvous_address"), "port": plan.get("rendezvous_port")},
                   "backend": "auto", "max_bytes": int(plan.get("probe_max_bytes") or (16 << 20)),
                   "budget_s": budget}
        if g["rank"] == 0 and m.rendezvous is not None:
            m.rendezvous.close()  # the probe's store binds it; reserved again afterwards
            m.rendezvous = None
        result: dict[str, Any] = {}
        error = ""
        try:
            proc = await self._probe_process(m)
            try:
                out, err = await proc.run(request, m.probe, budget + PROBE_GRACE)
            except TimeoutError:
                out, err = b"", b"the probe ran past its budget"
            lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
            if lines:
                try:
                    result = json.loads(lines[-1])
                except ValueError:
                    error = f"the probe's output was not JSON: {lines[-1][:200]}"
            if not result and not error:
                error = (err.decode(errors="replace").strip().splitlines() or ["the probe failed"])[-1][:300]
        except OSError as e:
            error = f"the probe could not start: {e}"
        finally:
            self.warm.replenish()
            if g["rank"] == 0 and m.rendezvous is None and self.members.get(att.id) is m:
                try:
                    m.rendezvous = _reserve(self.address, int(g["port"]), listen=False)
                except OSError as e:
                    log.warning("attempt %s: rendezvous port %s could not be reserved again: %s", att.id, g["port"], e)
        self._send_probe(att, result, error or str(result.get("error") or ""))
        if att.live and att.stop is None and att.gang is g:
            g["done"] = GangStep.MESH.value
            self.table.persist()
            self.host.report(att)
            m.task = None
            self.step(att)

    async def _probe_process(self, m: Member) -> ProbeProcess:
        """The probe started ahead when it still waits for a plan, else one started now."""
        task, m.preloaded = m.preloaded, None
        if task is not None:
            try:
                probe = await asyncio.shield(task)
            except asyncio.CancelledError:
                discard(task)  # forgotten meanwhile: the probe goes too
                raise
            except OSError as e:
                log.warning("the probe could not be started ahead (%s); starting it now", e)
            else:
                if probe.waiting:
                    return probe
                log.warning("the probe started ahead had exited (%s); starting another", probe.proc.returncode)
        return await start_probe(preload=False)

    def _send_probe(self, att: "Attempt", result: dict[str, Any], error: str) -> None:
        g = att.gang or {}
        measured = Timestamp()
        measured.FromNanoseconds(int(self.clock.now() * 1e9))
        probe = agent_pb2.ProbeResult(gang_id="", epoch=g["epoch"], attempt_id=att.id, rank=g["rank"],
                                      measured_time=measured, error=error[:500])
        if result.get("worst_rtt_ms") is not None:
            probe.rtt_ms = f"{float(result['worst_rtt_ms']):.3f}"
        if result.get("bus_gbps") is not None:
            probe.bus_gbps = f"{float(result['bus_gbps']):.3f}"
        probe.path = PATHS.get(str(result.get("path") or ""), common_pb2.NETWORK_PATH_UNSPECIFIED)
        phases = ", ".join(f"{name} {float(sec):.3f}" for name, sec in (result.get("phase_seconds") or {}).items())
        log.info("attempt %s: probe rank %d: rtt %s ms, busbw %s Gbit/s%s; seconds per phase: %s", att.id, g["rank"],
                 probe.rtt_ms or "?", probe.bus_gbps or "?", f" ({error})" if error else "", phases or "?")
        self.stream.send(probe_result=probe)

    def _start(self, att: "Attempt", m: Member, plan: dict[str, Any]) -> None:
        g = att.gang or {}
        layout = self.runtime.layout(att.id)
        spec = read_json(layout.spec) or {}
        try:
            rendezvous = Rendezvous(str(plan.get("rendezvous_address") or ""), int(plan.get("rendezvous_port") or 0),
                                    int(g["epoch"]))
            member = MemberPlan(
                rank=int(g["rank"]), topology=Topology(int(g["size"]), int(g.get("gpus_per_node") or 0)),
                rendezvous=rendezvous, command=tuple(spec.get("command") or ()), env=dict(spec.get("env") or {}),
                job=str(att.job.get("name", "")), project=str(att.job.get("project", "")), address=g.get("address", ""),
                launcher_dir=str(layout.root / "launcher"),
                startup_timeout_s=max(1, int(plan.get("startup_timeout") or 900)))
            steps = launch(str(g.get("launcher") or "Plain"), member)
        except ValueError as e:
            log.warning("attempt %s: the launcher refused the plan: %s", att.id, e)
            self.host.stop(att.id, Reason.LAUNCH_FAILED, 0, L.FAILED)
            return
        m.release()  # the program binds the rendezvous port now
        # Atomic for the supervisor that waits for it, not fsynced (on the event loop): a crash of the
        # host that could lose it ends the supervisor too, and the attempt is replaced.
        write_json(layout.launch, GangLaunch(steps, rendezvous.endpoint, member.startup_timeout_s).to_json(),
                   mode=0o600, durable=False)
        g["done"] = GangStep.START.value
        self.table.persist()
        self.host.report(att)
        log.info("attempt %s: gang rank %d of epoch %d starts through %s (rendezvous %s)", att.id, g["rank"],
                 g["epoch"], steps.launcher, rendezvous.endpoint)
