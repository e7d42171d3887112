"""GangService (gang.proto): operators read the gangs of multi-node Jobs.

A gang is not stored on its own: its facts are the Job's status.gang (written by the Job controller
from the member Attempts) and the member Attempts themselves, where an operator also sees the node
each rank runs on (the Job's status shows customers offering keys only).
"""
from __future__ import annotations

from typing import Any

import grpc

from nodus.v1 import common_pb2, gang_pb2, gang_pb2_grpc

from .agent_wire import LAUNCHER_NUMBERS, PATH_WORDS
from .clock import parse
from .controllers.attempts import PHASE_NUMBERS, AttemptPhase
from .controllers.cache import JOBS, Cache
from .controllers.gang import is_gang
from .errors import NodusError
from .grpc_api import rpc
from .identity import Caller, Identity, require_operator

_PHASES = {name: getattr(gang_pb2, f"GANG_PHASE_{name.upper()}") for name in (
    "Queued", "Assembling", "Meshing", "Starting", "Running", "Recovering", "Stopping", "Releasing", "Done")}
_PATH_NUMBERS = {word: number for number, word in PATH_WORDS.items()}


def gang_proto(cache: Cache, job: dict[str, Any]) -> gang_pb2.Gang:
    meta, spec = job["metadata"], job.get("spec") or {}
    gang = (job.get("status") or {}).get("gang") or {}
    out = gang_pb2.Gang(
        id=meta.get("uid", ""), job=common_pb2.JobRef(project=meta["namespace"], name=meta["name"], uid=meta.get("uid", "")),
        epoch=int(gang.get("epoch") or 0), phase=_PHASES.get(gang.get("phase", ""), gang_pb2.GANG_PHASE_QUEUED),
        size=int(gang.get("size") or 0), ready=int(gang.get("ready") or 0), started=int(gang.get("started") or 0),
        restarts=int(gang.get("restarts") or 0), rendezvous=gang.get("rendezvous", ""),
        launcher=LAUNCHER_NUMBERS.get((spec.get("distributed") or {}).get("launcher") or "Plain",
                                       common_pb2.LAUNCHER_PLAIN),
        transport=_PATH_NUMBERS.get(gang.get("transport", ""), common_pb2.NETWORK_PATH_UNSPECIFIED))
    nodes = {(a.get("spec") or {}).get("id"): (a.get("spec") or {}).get("node", "")
             for a in cache.attempts_of(meta["namespace"], meta["name"])}
    for m in gang.get("members") or []:
        out.members.add(rank=int(m.get("rank") or 0), attempt=m.get("attempt", ""), node=nodes.get(m.get("attempt"), ""),
                        offering=m.get("offering", ""), region_class=m.get("regionClass", ""),
                        phase=PHASE_NUMBERS.get(AttemptPhase.parse(m.get("phase")), 0),
                        path=_PATH_NUMBERS.get(m.get("path", ""), common_pb2.NETWORK_PATH_UNSPECIFIED))
    probe = gang.get("probe") or {}
    if probe:
        out.probe.rtt_ms = probe.get("rttMs", "")
        out.probe.bus_gbps = probe.get("busGbps", "")
        out.probe.path = _PATH_NUMBERS.get(probe.get("path", ""), common_pb2.NETWORK_PATH_UNSPECIFIED)
        measured = parse(probe.get("measuredTime"))
        if measured is not None:
            out.probe.measured_time.FromNanoseconds(int(measured * 1e9))
    return out


class GangServicer(gang_pb2_grpc.GangServiceServicer):
    def __init__(self, cache: Cache, identity: Identity) -> None:
        self.cache, self.identity = cache, identity

    @rpc("getgang")
    async def GetGang(self, caller: Caller, request: gang_pb2.GetGangRequest, context: Any) -> gang_pb2.Gang:
        require_operator(caller)
        if not request.project or not request.job:
            raise NodusError("BadRequest", "project and job are required",
                             fix='set "project" and "job" (the name of a Job with spec.distributed)')
        job = self.cache.job(request.project, request.job)
        if job is None:
            raise NodusError("NotFound", f'jobs.nodus.dev "{request.job}" not found in project {request.project}',
                             fix="check the name with `nodus get jobs`")
        if not is_gang(job.get("spec") or {}):
            raise NodusError("BadRequest", f"Job {request.job} is not a gang (it has no spec.distributed)",
                             fix="GangService reads multi-node Jobs; read this one with ResourceService.Get")
        return gang_proto(self.cache, job)

    @rpc("listgangs")
    async def ListGangs(self, caller: Caller, request: gang_pb2.ListGangsRequest,
                        context: Any) -> gang_pb2.ListGangsResponse:
        require_operator(caller)
        out = gang_pb2.ListGangsResponse()
        for key, job in sorted(self.cache.under(JOBS)):
            if request.project and job["metadata"]["namespace"] != request.project:
                continue
            if not is_gang(job.get("spec") or {}):
                continue
            gang = gang_proto(self.cache, job)
            if request.phase and gang.phase != request.phase:
                continue
            out.gangs.append(gang)
        return out


def add_to_server(server: grpc.aio.Server, cache: Cache, identity: Identity) -> None:
    gang_pb2_grpc.add_GangServiceServicer_to_server(GangServicer(cache, identity), server)
