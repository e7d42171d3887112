"""NodeService, the operators' gRPC API over the node registry (nodes.py): it translates requests
and answers to and from the proto; the registry, the checkpoint service and the enrolments
(enrol.py: revoke, re-admit, join token rotation) do the work."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import grpc
from google.protobuf import json_format, timestamp_pb2

from nodus.v1 import common_pb2, node_pb2, node_pb2_grpc

from . import checkpoints
from .clock import parse, rfc3339
from .controllers.attempts import PHASE_NUMBERS, phase_of
from .errors import NodusError
from .grpc_api import rpc
from .identity import Caller, Identity, require_operator
from .controllers.fleet import amount_of, gpu_health, reservation_of
from .nodes import NodeRegistry, no_node
from .scheduler import Amount
from .selectors import parse_label_selector

if TYPE_CHECKING:
    from .agents import AgentServicer


def _ts(text: Any) -> timestamp_pb2.Timestamp | None:
    t = parse(text)
    if t is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(round(t * 1e9)))
    return ts


def _resources(amount: Amount) -> common_pb2.Resources:
    return common_pb2.Resources(cpu_millis=amount.cpu_millis, memory_bytes=amount.memory_bytes,
                                disk_bytes=amount.disk_bytes, gpus=amount.gpus)


def node_proto(registry: NodeRegistry, doc: dict[str, Any]) -> node_pb2.Node:
    name = doc["name"]
    lease = registry.lease(name) or {}
    live = [a for a in registry.cache.attempts_on(name) if not phase_of(a).terminal]
    capacity = amount_of(doc.get("capacity"))
    held = Amount()
    for a in live:
        if (r := reservation_of(a)) is not None:
            held = held + r.amount
    if not registry.leases.ready(lease):
        phase = node_pb2.NODE_PHASE_NOT_READY
    elif doc.get("draining"):
        phase = node_pb2.NODE_PHASE_DRAINING if live else node_pb2.NODE_PHASE_DRAINED
    elif doc.get("cordoned"):
        phase = node_pb2.NODE_PHASE_CORDONED
    else:
        phase = node_pb2.NODE_PHASE_READY
    inventory = json_format.ParseDict(doc.get("inventory") or {}, common_pb2.NodeInventory(),
                                      ignore_unknown_fields=True)
    health = gpu_health(doc, lease)
    for gpu in inventory.gpus:  # the newest heartbeat's health, as placement reads it
        gpu.unhealthy_reason, _, gpu.unhealthy_message = health.get(gpu.index, "").partition(": ")
    conditions = [gpus_condition(inventory.gpus)] if inventory.gpus else []
    expire = registry.leases.expiry(lease) if lease else None
    expire = expire if expire is not None and math.isfinite(expire) else None  # held until serving (ADR 0088)
    return node_pb2.Node(
        name=name, id=doc.get("id", ""), phase=phase, inventory=inventory, capacity=_resources(capacity),
        free=_resources(capacity - held), lease_expire_time=_ts(rfc3339(expire)) if expire else None,
        last_heartbeat_time=_ts(lease.get("renewTime")), epoch=int(doc.get("epoch", 0)),
        register_time=_ts(doc.get("registerTime")), message=doc.get("message", ""), active_attempts=len(live),
        conditions=conditions)


def gpus_condition(gpus: Sequence[common_pb2.Gpu]) -> node_pb2.NodeCondition:
    """GpusHealthy: False naming every unhealthy GPU and why (the first one's reason), else True."""
    bad = [g for g in gpus if g.unhealthy_reason]
    if not bad:
        return node_pb2.NodeCondition(type="GpusHealthy", status="True", reason="GpusHealthy")
    message = "; ".join(f"GPU {g.index} ({g.uuid or g.name}): {g.unhealthy_reason}: {g.unhealthy_message}"
                        for g in bad)
    return node_pb2.NodeCondition(type="GpusHealthy", status="False", reason=bad[0].unhealthy_reason,
                                  message=message + "; these GPUs get no new work")


def attempt_proto(obj: dict[str, Any], offering: str = "") -> node_pb2.Attempt:
    spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj["metadata"]
    out = node_pb2.Attempt(
        id=spec.get("id", ""), job=common_pb2.JobRef(project=meta.get("namespace", ""), name=spec.get("job", ""),
                                                     uid=spec.get("jobUID", "")),
        index=int(spec.get("index", 0)), number=int(spec.get("number", 1)), node=spec.get("node", ""),
        phase=PHASE_NUMBERS[phase_of(obj)], reason=status.get("reason", ""), message=status.get("message", ""),
        create_time=_ts(meta.get("creationTimestamp")), start_time=_ts(status.get("startTime")),
        finish_time=_ts(status.get("finishTime")), offering=offering,
        restored_from_seq=int(status.get("restoredFromSeq") or 0))
    if status.get("exitCode") is not None:
        out.exit_code = int(status["exitCode"])
    return out


def with_enrolment(node: node_pb2.Node, enrolment: dict[str, Any] | None) -> node_pb2.Node:
    """The node with what its enrolment says (enrolled, revoked, certificate expiry)."""
    if enrolment is not None:
        node.enrolled = True
        node.revoked = bool(enrolment.get("revoked"))
        if (expire := _ts(enrolment.get("expireTime"))) is not None:
            node.certificate_expire_time.CopyFrom(expire)
    return node


class NodeServicer(node_pb2_grpc.NodeServiceServicer):
    """Operators: admin tokens for every project (`*`), as the bootstrap kubeconfig holds."""

    def __init__(self, registry: NodeRegistry, identity: Identity, agents: AgentServicer | None = None) -> None:
        self.registry = registry
        self.identity = identity
        self.agents = agents

    async def _enrolments(self) -> dict[str, dict[str, Any]]:
        enrolments = self.agents.enrolments if self.agents is not None else None
        return await enrolments.records() if enrolments is not None else {}

    def _enrolling(self) -> Any:
        enrolments = self.agents.enrolments if self.agents is not None else None
        if enrolments is None:
            raise NodusError("BadRequest", "this coordinator runs with --grpc-insecure: nodes hold no certificates "
                             "to revoke, re-admit or rotate the join token for",
                             fix="run the coordinator without --grpc-insecure")
        return enrolments

    async def _node(self, name: str) -> node_pb2.Node:
        doc = self.registry.node(name)
        node = node_proto(self.registry, doc) if doc is not None else node_pb2.Node(name=name)
        return with_enrolment(node, (await self._enrolments()).get(name))

    def _get(self, name: str) -> dict[str, Any]:
        doc = self.registry.node(name)
        if doc is None:
            raise no_node(name)
        return doc

    @rpc("listnodes")
    async def ListNodes(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        selector = parse_label_selector(request.label_selector)
        enrolments = await self._enrolments()
        nodes = [with_enrolment(node_proto(self.registry, self._get(n)), enrolments.get(n))
                 for n in self.registry.names()]
        nodes = [n for n in nodes if selector.matches(dict(n.inventory.labels))
                 and (not request.phase or n.phase == request.phase)]
        return node_pb2.ListNodesResponse(nodes=nodes)

    @rpc("getnode")
    async def GetNode(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        self._get(request.name)
        return await self._node(request.name)

    @rpc("revokenode")
    async def RevokeNode(self, caller: Caller, request: Any, context: Any) -> Any:
        """Refuses the node's certificate from now on and closes its stream: its lease runs out and its
        attempts are Lost and replaced elsewhere, as for a node that died."""
        require_operator(caller)
        await self._enrolling().revoke(request.name, request.message)
        assert self.agents is not None
        self.agents.cut_off(request.name, NodusError("NodeRevoked", f'node "{request.name}" was revoked',
                                                     name=request.name, kind="nodes"))
        return await self._node(request.name)

    @rpc("readmitnode")
    async def ReadmitNode(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        await self._enrolling().readmit(request.name)
        assert self.agents is not None
        self.agents.cut_off(request.name, NodusError("NodeRevoked", f'the enrolment of node "{request.name}" was '
                                                     're-admitted', name=request.name, kind="nodes"))
        return await self._node(request.name)

    @rpc("rotatejointoken")
    async def RotateJoinToken(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        token, retired = await self._enrolling().rotate_join_token()
        return node_pb2.RotateJoinTokenResponse(join_token=token, retired=retired)

    @rpc("cordon")
    async def Cordon(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        return node_proto(self.registry, await self.registry.set_cordon(request.name, True, request.message))

    @rpc("uncordon")
    async def Uncordon(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        return node_proto(self.registry, await self.registry.set_cordon(request.name, False))

    @rpc("drain")
    async def Drain(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        if request.grace_seconds < 0:
            raise NodusError("BadRequest", "grace_seconds must not be negative")
        doc = await self.registry.drain(request.name, int(request.grace_seconds or 30), request.message)
        return node_proto(self.registry, doc)

    @rpc("reclaim")
    async def Reclaim(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        if request.grace_seconds < 0:
            raise NodusError("BadRequest", "grace_seconds must not be negative")
        registry = self.registry
        doc = await registry.set_cordon(request.name, True, request.message or "reclaimed", draining=True)
        await checkpoints.reclaim(registry.cache, registry.objects, request.name, int(request.grace_seconds or 30),
                                  registry.clock.now())
        return node_proto(registry, doc)

    @rpc("listattempts")
    async def ListAttempts(self, caller: Caller, request: Any, context: Any) -> Any:
        require_operator(caller)
        if request.job and not request.project:
            raise NodusError("BadRequest", "job requires project", fix='set "project" too')
        if request.node:
            candidates = self.registry.cache.attempts_on(request.node)
        elif request.job:
            candidates = self.registry.cache.attempts_of(request.project, request.job)
        else:
            candidates = self.registry.cache.attempts()
        chosen = [a for a in candidates
                  if (not request.project or a["metadata"].get("namespace") == request.project)
                  and (not request.node or (a.get("spec") or {}).get("node") == request.node)
                  and (request.include_finished or not phase_of(a).terminal)]
        chosen.sort(key=lambda a: (a["metadata"].get("namespace", ""), a["spec"].get("job", ""),
                                   int(a["spec"].get("index", 0)), int(a["spec"].get("number", 1))))
        offerings = {n: (self.registry.node(n) or {}).get("offering", "") for n in self.registry.names()}
        return node_pb2.ListAttemptsResponse(
            attempts=[attempt_proto(a, offerings.get(a["spec"].get("node", ""), "")) for a in chosen])


def add_to_server(server: grpc.aio.Server, registry: NodeRegistry, identity: Identity,
                  agents: AgentServicer | None = None) -> None:
    node_pb2_grpc.add_NodeServiceServicer_to_server(NodeServicer(registry, identity, agents), server)
