"""agent.proto translation on the coordinator's side: the agent's reports into the controllers' values,
the controllers' plans into messages, an attempt into what the desired-state diff reads. No I/O."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Set

from google.protobuf import duration_pb2, timestamp_pb2

from nodus.v1 import agent_pb2, common_pb2

from .clock import rfc3339
from .controllers import gang as gangs
from .controllers import desired, gang_plan
from .controllers.attempt_machine import AssignmentRefused, Refusal, transition
from .controllers.attempts import GANG_STEPS, AttemptPhase, ProgressReport, Report, phase_of
from .controllers.reasons import AttemptReason

if TYPE_CHECKING:
    from .controllers.cache import Cache


def seconds_of(ts: timestamp_pb2.Timestamp) -> float | None:
    return ts.ToNanoseconds() / 1e9 if (ts.seconds or ts.nanos) else None


def seconds_as_duration(secs: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(secs * 1e9)))
    return d


PATH_WORDS = {common_pb2.NETWORK_PATH_PRIVATE: "Private", common_pb2.NETWORK_PATH_PUBLIC: "Public",
              common_pb2.NETWORK_PATH_DIRECT: "Direct", common_pb2.NETWORK_PATH_RELAYED: "Relayed"}
"""common.proto NetworkPath numbers to the words of status.gang (the GangService maps them back)."""
_STEP_NUMBERS = {gangs.ASSEMBLE: agent_pb2.GANG_STEP_ASSEMBLE, gangs.MESH: agent_pb2.GANG_STEP_MESH,
                 gangs.START: agent_pb2.GANG_STEP_START}
LAUNCHER_NUMBERS = {"Plain": common_pb2.LAUNCHER_PLAIN, "Torchrun": common_pb2.LAUNCHER_TORCHRUN,
                    "Ray": common_pb2.LAUNCHER_RAY, "Verl": common_pb2.LAUNCHER_VERL,
                    "Accelerate": common_pb2.LAUNCHER_ACCELERATE, "Deepspeed": common_pb2.LAUNCHER_DEEPSPEED}
"""spec.distributed.launcher words to common.proto Launcher numbers."""


def _gang_report(u: agent_pb2.AttemptUpdate) -> dict[str, Any] | None:
    if not u.HasField("gang"):
        return None
    g = u.gang
    step = GANG_STEPS[g.done] if 0 <= g.done < len(GANG_STEPS) else ""
    return {"epoch": g.epoch, "done": step, "address": g.address, "port": g.port, "probePort": g.probe_port}



def probe_of(p: agent_pb2.ProbeResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if p.rtt_ms:
        out["rttMs"] = p.rtt_ms
    if p.bus_gbps:
        out["busGbps"] = p.bus_gbps
    if p.path in PATH_WORDS:
        out["path"] = PATH_WORDS[p.path]
    if p.HasField("measured_time"):
        out["measuredTime"] = rfc3339(p.measured_time.ToNanoseconds() / 1e9)
    if p.error:
        out["error"] = p.error[:500]
    return out


def plan_message(plan: gang_plan.Plan, config: gangs.GangConfig) -> agent_pb2.GangPlan:
    return agent_pb2.GangPlan(
        attempt_id=plan.attempt_id, gang_id=plan.gang_id, epoch=plan.epoch, rank=plan.rank, size=plan.size,
        gpus_per_node=plan.gpus_per_node, launcher=LAUNCHER_NUMBERS.get(plan.launcher, common_pb2.LAUNCHER_PLAIN),
        rendezvous_address=plan.rendezvous_address, rendezvous_port=plan.rendezvous_port,
        step=_STEP_NUMBERS[plan.step],
        peers=[agent_pb2.GangPeer(rank=r, address=a, port=p, probe_port=pp) for r, a, p, pp in plan.peers],
        probe_max_bytes=config.probe_max_bytes, probe_budget=seconds_as_duration(config.probe_budget_seconds),
        startup_timeout=seconds_as_duration(plan.startup_timeout), probe=config.probe)


def report_of(u: agent_pb2.AttemptUpdate) -> Report | None:
    phase = AttemptPhase.of_proto(u.phase)
    if phase is None:
        return None
    return Report(gang=_gang_report(u), phase=phase, exit_code=u.exit_code if u.HasField("exit_code") else None,
                  reason=u.reason,
                  message=u.message, start_time=seconds_of(u.start_time), finish_time=seconds_of(u.finish_time),
                  oom_killed=u.oom_killed, time=seconds_of(u.time), inputs_ready_time=seconds_of(u.inputs_ready_time),
                  restored_from_seq=u.restored_from_seq,
                  image_pull=(u.image_pull.bytes_done, u.image_pull.bytes_total) if u.HasField("image_pull") else None,
                  egress_denied=u.egress_denied, inputs=tuple(sorted(u.input_sha256.items())),
                  outputs=tuple({"name": o.name, "path": o.path, "rank": o.rank, "uri": o.uri, "sha256": o.sha256,
                                 "size": o.size_bytes, **({"archive": True} if o.archive else {})}
                                for o in u.outputs))


def progress_of(p: agent_pb2.Progress) -> ProgressReport:
    return ProgressReport(stage=p.stage, units_completed=p.units_completed, units_total=p.units_total,
                          metrics=dict(p.metrics), step=p.step, total_steps=p.total_steps,
                          tokens_per_second=p.tokens_per_second, gpu_memory_bytes=p.gpu_memory_bytes,
                          time=seconds_of(p.time))



def cancel_message(attempt_id: str, reason: str, grace_seconds: int = 0) -> agent_pb2.Cancel:
    """A Cancel: stop the attempt for `reason`, killing it after `grace_seconds`."""
    return agent_pb2.Cancel(attempt_id=attempt_id, reason=reason, grace_seconds=grace_seconds)


def lease_message(duration: float, expire: float) -> agent_pb2.LeaseRenewal:
    """A LeaseRenewal: the lease lasts `duration` seconds and now ends at `expire` (epoch seconds)."""
    expire_time = timestamp_pb2.Timestamp()
    expire_time.FromNanoseconds(int(expire * 1e9))
    return agent_pb2.LeaseRenewal(valid_for=seconds_as_duration(duration), expire_time=expire_time)


def fail_mutation(reason: AttemptReason, message: str, now: float) -> Any:
    """The mutation that fails an attempt whose Assignment cannot be built (AssignmentRefused)."""
    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = transition(obj, AssignmentRefused(reason, message, now))
        if isinstance(status, Refusal):
            return None  # it ended meanwhile
        obj["status"] = status
        return obj
    return mutate


def on_node_of(attempt: dict[str, Any], suspend: agent_pb2.Suspend | None) -> desired.OnNode:
    """An attempt on the node as the diff reads it; `suspend`: its Suspend, when its stop asks for one."""
    spec = attempt["spec"]
    stop = spec.get("stop")
    return desired.OnNode(
        attempt_id=spec["id"], terminal=phase_of(attempt).terminal,
        reason=(attempt.get("status") or {}).get("reason") or "",
        stop=desired.Stop(stop.get("reason", AttemptReason.CANCELLED), int(stop.get("graceSeconds") or 0),
                          None if suspend is None else suspend.seq) if stop else None,
        gang=bool(spec.get("gang")))


def to_diff(cache: Cache, node: str, said: Mapping[str, desired.Said], finished: Set[str]) -> dict[str, dict[str, Any]]:
    """The attempts a stream's diff reads, by id: the node's unfinished ones, and those the agent was told to
    run and has not said ended (an ended one still owes a Cancel then). The rest of the node's history gives
    no message: it is left out (ADR 0087), and the diff forgets it."""
    on_node = {a["spec"]["id"]: a for a in cache.live_attempts_on(node)}
    ended = (cache.attempt_by_id(i) for i, told in said.items()
             if told == desired.ASSIGNED and i not in on_node and i not in finished)
    on_node.update({a["spec"]["id"]: a for a in ended if a is not None and a["spec"].get("node") == node})
    return on_node
