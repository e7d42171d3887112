"""AgentService, the coordinator's side of agent.proto: Register, and one Connect stream per node.

Enrol trades the join token for the node's client certificate and Renew replaces it (enrol.py).
Register and Connect authenticate the node by that certificate over mTLS (the node's name is the
certificate's), or, on a --grpc-insecure coordinator only, by the join token. Register creates or
updates the node (a new session: epoch + 1) and renews its lease; a stream of an older session is
closed with FAILED_PRECONDITION, so a stale agent cannot act.

Connect expects Hello first (unknown or superseded session: FAILED_PRECONDITION, and the agent
registers again), folds everything the Hello reports into the Attempts, and answers FullState: every
attempt placed on the node that should run, every one that should stop (spec.stop, or one the agent
still runs that the coordinator already gave up: Lost and replaced, deleted, or placed elsewhere).
From then on the stream sends what changes, computed as a diff between the node's desired state
(from the cache, fed by the store) and what this stream already said; and it takes Heartbeats
(kept in memory and renewing the stored lease at a fraction of it, ADR 0049; answered with LeaseRenewal), AttemptUpdates and Progress (folded into the Attempt,
then acknowledged once durable) and Acks. A reconnect starts from scratch both ways, and every fold
is idempotent, so a resent report never counts twice.

Here the servicer; the stream in `agent_session.py`, the proto translation in `agent_wire.py`, and
the diff itself, pure, in `controllers/desired.py`.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any, AsyncIterator, Iterable

import grpc

from nodus.v1 import agent_pb2, agent_pb2_grpc

from .agent_session import Session
from .agent_wire import seconds_as_duration
from .clock import Clock
from .controllers import gang as gangs
from .controllers.attempts import phase_of
from .controllers.cache import ATTEMPTS, JOBS, NODES, Cache
from .controllers.interruptions import Interruptions
from .controllers.job_reports import ReportWriter
from .controllers.objects import Mutation, Objects
from .controllers.workload_tokens import ApiEndpoint
from .enrol import Enrolments, Peer, peer_of
from .errors import NodusError, new_request_id
from .grpc_api import authorization, status_for
from .identity import Identity
from .node_scope import NodeScope
from .nodes import NodeRegistry
from .operator_registry import OperatorRegistry
from .vault import Vault

log = logging.getLogger("nodus.agents")

HELLO_TIMEOUT = 30.0


def _gang_facts(obj: dict[str, Any] | None) -> Any:
    """What of a gang member its siblings' plans depend on (None: it does not exist)."""
    if obj is None:
        return None
    return (obj["spec"].get("node"), (obj.get("status") or {}).get("gang"), phase_of(obj).terminal)



def _uid(obj: dict[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("uid")


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, registry: NodeRegistry, objects: Objects, identity: Identity, vault: Vault,
                 clock: Clock, gang_config: gangs.GangConfig = gangs.GangConfig(),
                 interruptions: Interruptions | None = None, image_registry: OperatorRegistry | None = None) -> None:
        self.registry, self.objects, self.identity, self.vault, self.clock = registry, objects, identity, vault, clock
        self.image_registry = image_registry
        """The operator's registry: its projects' images are pulled with its credentials (assignment.build)."""
        self.gang_config = gang_config
        self.cache: Cache = registry.cache
        self.interruptions = interruptions or Interruptions(self.cache, clock)
        self.sessions: dict[str, Session] = {}
        self.enrolments: Enrolments | None = None
        """Node certificates (a TLS coordinator); None: the join token authenticates (--grpc-insecure)."""
        self.agent_port = 0
        """The mTLS port, told to enrolling nodes."""
        self.api = ApiEndpoint()
        """How attempts reach the REST API with their ServiceAccount's token (main sets it once bound)."""
        self.scope = NodeScope(self.cache, clock)
        """What a node's BlobService calls reach: its attempts' blobs and logs while they run (ADR 0045)."""
        self.reports: ReportWriter | None = None
        """Writes a report with its Job's decision where this replica leads (the control plane sets it, ADR 0127);
        None: the plain compare-and-swap write."""
        self.cache.listen(ATTEMPTS, self._on_attempt)
        self.cache.listen(JOBS, self._on_job)
        self.cache.listen(NODES, self._on_node)

    async def write_report(self, key: str, mutation: Mutation) -> None:
        """Writes the attempt at `key` as an agent's reports change it (`mutation`, as `Objects.mutate`)."""
        if self.reports is None:
            await self.objects.mutate(key, mutation)
        else:
            await self.reports.mutate(key, mutation)

    def _wake_nodes(self, attempts: Iterable[dict[str, Any] | None]) -> None:
        """Wakes the streams (on this replica) of the nodes these attempts are bound to: each recomputes
        its node's desired state."""
        for attempt in attempts:
            node = ((attempt or {}).get("spec") or {}).get("node")
            if node and node in self.sessions:
                self.sessions[node].dirty.set()

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self._wake_nodes((old, new))
        obj = new or old or {}
        if (obj.get("spec") or {}).get("gang") and _gang_facts(old) != _gang_facts(new):
            # A member's gang report (or a member coming or going) can move every member's step: wake
            # the streams of the whole gang. Progress lines and other folds do not.
            self._wake_nodes(self.cache.attempts_of(obj["metadata"]["namespace"], obj["spec"].get("job", "")))

    def _on_job(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """A Job this cache sees for the first time (or a new one of the same name) wakes the streams of the
        nodes its attempts are bound to: an Assignment is built from the attempt and its Job, and on a
        replica whose watches follow the store's prefixes apart (PostgreSQL) the attempt can arrive first,
        when its stream could not build it (ADR 0090). A change of a Job it already had wakes nothing."""
        if new is None or (old is not None and _uid(old) == _uid(new)):
            return
        project, name = key[len(JOBS):].split("/", 1)
        self._wake_nodes(self.cache.attempts_of(project, name))

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        session = self.sessions.get(key[len(NODES):])
        if session is not None and (new is None or new.get("sessionId") != session.session_id):
            session.end(NodusError("StaleSession", "a newer registration of this node superseded the session"))

    async def _auth(self, context: grpc.aio.ServicerContext) -> str | None:
        """The node the call comes from: its certificate's name (checked against its enrolment), or
        None where the join token authenticates (a --grpc-insecure coordinator)."""
        peer = await self.peer(context)
        if peer is not None:
            return peer.node
        if self.enrolments is not None:
            raise NodusError("NodeCertificateRequired", "this call takes a node certificate (mTLS on the agent "
                             "port), not the join token", fix="enrol with the join token (AgentService.Enrol), then "
                             "call the agent port with the certificate; nodus-agent does both by itself")
        await self.identity.verify_join_token(authorization(context))
        return None

    async def peer(self, context: grpc.aio.ServicerContext) -> Peer | None:
        """The node a verified client certificate names, its enrolment checked (revoked or re-admitted
        away: NodeRevoked); None when the call presented none (or this coordinator issues none)."""
        pem = peer_certificate(context)
        if self.enrolments is None or pem is None:
            return None
        peer = peer_of(pem)
        if peer is None:
            raise NodusError("NodeCertificateRequired", "the client certificate is not a node certificate",
                             fix="use the certificate AgentService.Enrol issued")
        await self.enrolments.check(peer)
        return peer

    def _issued(self, issued: Any) -> agent_pb2.EnrolResponse:
        return agent_pb2.EnrolResponse(node_name=issued.node, certificate_pem=issued.certificate_pem.decode(),
                                       ca_pem=issued.ca_pem.decode(), expire_time=timestamp_of(issued.expire),
                                       agent_port=self.agent_port)

    async def Enrol(self, request: agent_pb2.EnrolRequest, context: grpc.aio.ServicerContext) -> Any:
        rid = new_request_id()
        try:
            if self.enrolments is None:
                raise NodusError("BadRequest", "this coordinator runs with --grpc-insecure: nodes register with the "
                                 "join token and no certificate", fix="call Register with the join token")
            _valid_name(request.node_name)
            issued = await self.enrolments.enrol(authorization(context), request.node_name, request.csr_pem)
        except NodusError as e:
            await context.abort_with_status(status_for(e, rid))
            raise  # unreachable: abort raises
        log.info("node %s enrolled: certificate until %s", issued.node, issued.expire)
        return self._issued(issued)

    async def Renew(self, request: agent_pb2.RenewRequest, context: grpc.aio.ServicerContext) -> Any:
        rid = new_request_id()
        try:
            peer = await self.peer(context)
            if peer is None or self.enrolments is None:
                raise NodusError("NodeCertificateRequired", "Renew takes the node's current certificate (mTLS on "
                                 "the agent port)", fix="enrol again with the join token (AgentService.Enrol)")
            issued = await self.enrolments.renew(peer, request.csr_pem)
        except NodusError as e:
            await context.abort_with_status(status_for(e, rid))
            raise  # unreachable: abort raises
        log.info("node %s renewed its certificate: until %s", issued.node, issued.expire)
        return self._issued(issued)

    def cut_off(self, node: str, error: NodusError) -> None:
        """Closes the node's stream at once (a revocation)."""
        session = self.sessions.get(node)
        if session is not None:
            session.end(error)

    async def Register(self, request: agent_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> Any:
        rid = new_request_id()
        try:
            certified = await self._auth(context)
            name = request.node_name or certified or ""
            if certified is not None and name != certified:
                raise NodusError("Forbidden", f'the certificate is for node "{certified}", not "{name}"',
                                 name=name, kind="nodes", fix=f"register as --node {certified}, the name it enrolled")
            _valid_name(name)
            node = await self.registry.register(name, request.inventory)
        except NodusError as e:
            await context.abort_with_status(status_for(e, rid))
            raise  # unreachable: abort raises
        except Exception:  # noqa: BLE001 - e.g. a store write that failed under a reconnect storm
            log.exception("node %s: registering failed", request.node_name)
            await context.abort_with_status(status_for(busy(), rid))
            raise  # unreachable: abort raises
        log.info("node %s registered: session epoch %d", name, node["epoch"])
        return agent_pb2.RegisterResponse(node_id=node["id"], session_id=node["sessionId"], epoch=node["epoch"],
                                          lease_duration=seconds_as_duration(self.registry.leases.duration),
                                          heartbeat_interval=seconds_as_duration(self.registry.heartbeat_interval))

    async def Connect(self, request_iterator: AsyncIterator[agent_pb2.AgentMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        rid = new_request_id()
        try:
            certified = await self._auth(context)
            try:
                async with asyncio.timeout(HELLO_TIMEOUT):
                    first = await request_iterator.__anext__()
            except (StopAsyncIteration, TimeoutError):
                raise NodusError("BadRequest", "the stream must start with Hello", fix="send Hello first") from None
            if first.WhichOneof("message") != "hello":
                raise NodusError("BadRequest", "the stream must start with Hello", fix="send Hello first")
            hello = first.hello
            node = self.registry.node_by_id(hello.node_id)
            if node is None or node.get("sessionId") != hello.session_id or node.get("epoch") != hello.epoch:
                raise NodusError("StaleSession", f"session {hello.session_id or '?'} (epoch {hello.epoch}) of node "
                                 f"{hello.node_id or '?'} is unknown or superseded")
            if certified is not None and node["name"] != certified:
                raise NodusError("Forbidden", f'the certificate is for node "{certified}", not "{node["name"]}"',
                                 name=node["name"], kind="nodes", fix="open the stream of the node you enrolled")
        except NodusError as e:
            await context.abort_with_status(status_for(e, rid))
            return
        session = Session(self, node["name"], hello.session_id, hello.epoch, same_host=same_host(context.peer()))
        previous = self.sessions.get(session.node)
        if previous is not None:
            previous.end()  # the same session reconnected: the older stream is simply over
        self.sessions[session.node] = session
        reader: asyncio.Task[None] | None = None
        differ: asyncio.Task[None] | None = None
        cadence: asyncio.Task[None] | None = None
        try:
            if await _opened(session, first):
                reader = asyncio.create_task(session.read(request_iterator), name=f"agent-read:{session.node}")
                differ = asyncio.create_task(session.follow(), name=f"agent-diff:{session.node}")
                cadence = asyncio.create_task(session.checkpoint_cadence(), name=f"agent-cadence:{session.node}")
            async for message in session.outbound():
                yield message
        finally:
            for task in (reader, differ, cadence):
                if task is not None:
                    task.cancel()
            if self.sessions.get(session.node) is session:
                del self.sessions[session.node]
                self.registry.forget(session.node, session.session_id)
        if session.error is not None:
            await context.abort_with_status(status_for(session.error, rid))


async def _opened(session: Session, first: agent_pb2.AgentMessage) -> bool:
    """Opens the stream (the Hello folded, FullState sent). A failure ends it with its error, and what is
    not the agent's doing (a store write that failed under load) with UNAVAILABLE and a retry hint: the
    agent reconnects, as from any unavailability, never left with an unexplained INTERNAL (ADR 0088)."""
    try:
        await session.open(first)
        return True
    except NodusError as e:
        session.end(e)
    except Exception:  # noqa: BLE001 - the agent retries; the log keeps the cause
        log.exception("node %s: opening its stream failed", session.node)
        session.end(busy())
    return False


def busy() -> NodusError:
    """A reconnect the coordinator could not take now: the agent retries after its backoff."""
    return NodusError("ServiceUnavailable", "the coordinator could not take this agent's reconnect now",
                      fix="nothing to do: the agent retries by itself", retry_after=1)


def same_host(peer: str) -> bool:
    """Whether a gRPC peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:…") is on this host."""
    kind, _, address = peer.partition(":")
    if kind == "unix":
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def peer_certificate(context: grpc.aio.ServicerContext) -> bytes | None:
    """The client certificate TLS verified on this call (the agent port's mTLS); None without one."""
    values = list((context.auth_context() or {}).get("x509_pem_cert") or ())
    return bytes(values[0]) if values else None


def timestamp_of(seconds: float) -> Any:
    from google.protobuf import timestamp_pb2
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _valid_name(name: str) -> None:
    if not name or len(name) > 253 or not all(c.isalnum() or c in "-._" for c in name):
        raise NodusError("BadRequest", f"node name {name!r} is not valid",
                         fix="use --node with letters, digits, '-', '.' or '_' (at most 253)")


def add_to_server(server: grpc.aio.Server, servicer: AgentServicer) -> None:
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
