"""The agent's end of AgentService: enrol once, Register, then one Connect stream at a time, for ever.

Against a TLS coordinator the link first holds a node certificate (enrolment.py): it enrols with the
join token over the TLS port when it has none that is still valid, then talks to the agent port over
mTLS with it, and renews it at two thirds of its life (the channel is rebuilt with the new one; the
old one closes once its calls finish). A certificate the coordinator refuses (revoked, re-admitted
away) is dropped and the link enrols again, which the coordinator refuses until an operator
re-admits the node.

The conversation is agent.proto's header: Register (inventory) → Connect → Hello (full observed
state) → the coordinator's FullState → changes both ways, every message numbered per stream and
direction from 1, Heartbeat every heartbeat_interval. Any failure closes the stream; the link waits
(exponential backoff with jitter, reset once a FullState arrived) and reconnects with a new Hello,
so a lost message never leaves the two sides apart. FAILED_PRECONDITION (unknown or superseded
session) is the only reason to Register again.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2

from .backoff import Backoff
from .clock import Clock
from .enrolment import X509, Certificate, NodeCredentials, X509Failed, agent_address, read_trust_file

log = logging.getLogger("nodus.agent.link")

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # While the coordinator is away the channel tries again every 0.5 s growing to 2 s (gRPC's default grows
    # to 120 s): a restarted coordinator is found within 2 s, and Link._pause reconnects on it (ADR 0088).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
NOT_ACKED = ("ack", "lease_renewal")
WALL = time.time
"""Certificates are checked against the real wall clock (TLS does), never a test's offset clock."""


class StreamEnded(Exception):
    pass


def _being_cancelled() -> bool:
    """Whether the running task itself is being cancelled (not merely a gRPC call under it: grpc.aio
    raises CancelledError from a call its channel cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _seconds(d: Any) -> float:
    return float(d.seconds + d.nanos / 1e9)


Metadata = tuple[tuple[str, str], ...]


def open_channel(target: str, token: str, tls_ca: bytes | None = None,
                 insecure: bool = False) -> tuple[grpc.aio.Channel, Metadata]:
    """The one channel to the coordinator (AgentService and BlobService share it) and its call
    metadata: TLS verified with `tls_ca` (the coordinator's DATA_DIR/tls/ca.crt; None: the system's
    roots, for a certificate the operator brought), plaintext only when `insecure`."""
    metadata = (("authorization", f"Bearer {token}"),)
    if insecure:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS), metadata
    creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
    return grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS), metadata


_REQUEST_ID = re.compile(r"requestId: \S+?(?=[);,\s]|$)")
"""The request id in a coordinator error's text (grpc_api.status_for: "… (fix: …; requestId: req_…)")."""


def unavailable(target: str, details: str, tls: bool) -> tuple[str, int]:
    """What to log when the coordinator cannot be reached, and how loudly: a TLS mismatch is a setting
    to fix, not an outage to wait out."""
    text = f"coordinator {target} unavailable: {details}"
    lowered = details.lower()
    if tls and ("certificate_verify_failed" in lowered or "certificate verify failed" in lowered):
        return (f"{text}; the coordinator's TLS certificate is not trusted: pass --coordinator-ca FILE, the "
                "coordinator's DATA_DIR/tls/ca.crt", logging.ERROR)
    if tls and ("wrong_version_number" in lowered or "ssl handshake failed" in lowered
                or "handshake" in lowered):
        return (f"{text}; the TLS handshake failed: check that the coordinator serves TLS (it does unless it "
                "runs with --grpc-insecure) and that --coordinator-ca is its DATA_DIR/tls/ca.crt", logging.ERROR)
    if not tls:
        return (f"{text} (this agent speaks plaintext, --coordinator-insecure; a coordinator without "
                "--grpc-insecure serves TLS: pass --coordinator-ca DATA_DIR/tls/ca.crt instead)", logging.WARNING)
    return text, logging.WARNING


class Node(Protocol):
    """The agent as the conversation sees it: what it registers with, says and is told."""

    node_name: str

    def inventory(self) -> common_pb2.NodeInventory: ...

    def hello(self, session: agent_pb2.RegisterResponse, stream_id: int, hello_seq: int) -> agent_pb2.Hello: ...

    def on_message(self, msg: agent_pb2.CoordinatorMessage, stream_id: int) -> None: ...

    def gpus(self) -> list[common_pb2.Gpu]:
        """A heartbeat's GPU readings (blocking: called on a thread)."""
        ...

    def disk_free(self) -> int: ...


class Link:
    def __init__(self, node: Node, channel: grpc.aio.Channel, metadata: Metadata, target: str, *, backoff: Backoff,
                 clock: Clock, register_timeout: float = 15.0, tls: bool = True,
                 identity_dir: Path | None = None, coordinator_ca: bytes | None = None,
                 on_channel: Callable[[grpc.aio.Channel, Metadata], None] | None = None,
                 trust_files: tuple[Path | None, Path | None] = (None, None), x509: X509 | None = None) -> None:
        self.node = node
        self.token_file, self.ca_file = trust_files
        """--join-token-file and --coordinator-ca, re-read before each enrolment and reconnect."""
        self.tls = tls
        self.credentials = NodeCredentials(identity_dir, coordinator_ca, x509) if tls and identity_dir else None
        """The node certificate's keeper; None against a --grpc-insecure coordinator (the join token)."""
        self.on_channel = on_channel
        """Told of every new channel (the blob client shares it)."""
        self.bootstrap = channel
        """The TLS port's channel, where Enrol goes with the join token."""
        self.join_metadata = metadata
        self.certificate: Certificate | None = None
        """The certificate the current channel presents; None while on the bootstrap channel."""
        self.target = target
        self.metadata = metadata
        self.channel = channel
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.clock = clock
        self.backoff = backoff
        self.register_timeout = register_timeout
        self.session: agent_pb2.RegisterResponse | None = None
        self.connected = asyncio.Event()
        """Set while a stream is open and its FullState has arrived."""
        self.stream_id = 0
        self._seq = 0
        self._queue: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._last_error = ""

    @property
    def heartbeat_interval(self) -> float:
        if self.session is not None and self.session.HasField("heartbeat_interval"):
            return max(0.05, _seconds(self.session.heartbeat_interval))
        return 5.0

    @property
    def lease_duration(self) -> float:
        if self.session is not None and self.session.HasField("lease_duration"):
            return _seconds(self.session.lease_duration)
        return 0.0

    def send(self, **message: Any) -> int | None:
        """Queues one message on the open stream; returns its seq, or None when no stream is open."""
        if self._queue is None:
            return None
        self._seq += 1
        self._queue.put_nowait(agent_pb2.AgentMessage(seq=self._seq, **message))
        return self._seq

    async def close(self) -> None:
        await self.channel.close(grace=None)
        if self.bootstrap is not self.channel:
            await self.bootstrap.close(grace=None)

    async def run(self) -> None:
        renewer = asyncio.create_task(self._renew_loop(), name="link-renew") if self.credentials else None
        try:
            await self._run()
        finally:
            if renewer is not None:
                renewer.cancel()

    async def _run(self) -> None:
        while True:
            try:
                if self.credentials is not None:
                    await self._ensure_certificate()
                if self.session is None:
                    await self._register()
                await self._converse()
                self._note("the coordinator closed the stream")
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    log.info("session %s is unknown or superseded (%s); registering again",
                             self.session.session_id if self.session else "-", e.details())
                    self.session = None
                elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    what = "the node certificate" if self.certificate is not None else "the join token"
                    self._note(f"the coordinator refused {what}: {e.details()}{self._token_hint(e)}", logging.ERROR)
                    self.session = None
                    if self.certificate is not None and self.credentials is not None:
                        self.credentials.forget()  # enrol again: refused until an operator re-admits it
                        self._use(self.bootstrap, self.join_metadata, None)
                else:
                    self._note(*unavailable(self.target, f"{code.name}: {e.details()}", self.tls))
            except StreamEnded as e:
                self._note(str(e))
            except X509Failed as e:
                self._note(str(e), logging.ERROR)
            except asyncio.CancelledError:
                if _being_cancelled():
                    raise  # the agent stops
                # The call was cancelled under us (its channel closed), not this task: reconnect.
                self._note("the stream was cancelled locally; reconnecting")
            except Exception as e:  # noqa: BLE001 - whatever ended this try, the link never stops retrying
                self._note(f"the stream ended: {type(e).__name__}: {e}", logging.ERROR)
            finally:
                self._queue = None
                self.connected.clear()
            await self._pause(self.backoff.next())

    async def _pause(self, delay: float) -> None:
        """The backoff's delay, cut short when the channel, not connected as the try failed or disconnected
        since (the coordinator was away or going: a restart), connects again: a restarted coordinator sees
        its agents within the channel's reconnect interval (CHANNEL_OPTIONS), not the backoff's cap later.
        A coordinator that is up and refuses keeps the channel READY: the whole delay is waited (ADR 0088)."""
        channel = self.channel
        state = channel.get_state(try_to_connect=True)
        log.debug("reconnecting in %.2fs; channel %s", delay, state.name)
        away = state != grpc.ChannelConnectivity.READY
        try:
            async with asyncio.timeout(delay):
                while not (away and state == grpc.ChannelConnectivity.READY) and channel is self.channel:
                    await channel.wait_for_state_change(state)
                    state = channel.get_state(try_to_connect=True)
                    away = away or state != grpc.ChannelConnectivity.READY  # a stopping coordinator went away
                    log.debug("channel %s", state.name)
        except TimeoutError:
            pass

    def _note(self, text: str, level: int = logging.WARNING) -> None:
        """Logs a connection problem once, not on every retry (each refusal's requestId differs, so the
        problem is compared without it)."""
        problem = _REQUEST_ID.sub("", text)
        if problem != self._last_error:
            log.log(level, "%s", text)
            self._last_error = problem

    # -- the node certificate ---------------------------------------------------------------------
    def _token_hint(self, e: grpc.aio.AioRpcError) -> str:
        """What the operator does about a refused join token (a rotated one, or a new coordinator's)."""
        if self.certificate is not None or e.code() != grpc.StatusCode.UNAUTHENTICATED or self.token_file is None:
            return ""
        return (f"; this node holds no valid certificate and must enrol: put the coordinator's current join token "
                f"(its DATA_DIR/join-token, or the output of `nodus join-token rotate`) in {self.token_file}; "
                "the agent re-reads it and enrols without a restart")

    def _refresh_trust(self) -> None:
        """Picks up a replaced join token or coordinator CA file (level-triggered: compared on every try)."""
        assert self.credentials is not None
        token = read_trust_file(self.token_file)
        if token is not None:
            metadata: Metadata = (("authorization", f"Bearer {token.decode()}"),)
            if metadata != self.join_metadata:
                if self.join_metadata:
                    log.info("read a new join token from %s", self.token_file)
                self.join_metadata = metadata
                if self.certificate is None:
                    self.metadata = metadata
                    if self.on_channel is not None:
                        self.on_channel(self.channel, metadata)
        ca = read_trust_file(self.ca_file)
        if ca is None or ca == (self.credentials.given_ca or b"").strip():
            return
        log.warning("the coordinator's CA in %s changed: reconnecting with it", self.ca_file)
        self.credentials.given_ca = ca
        old, on_old = self.bootstrap, self.channel is self.bootstrap
        self.bootstrap, _ = open_channel(self.target, "", ca)
        self._use(self.bootstrap, self.join_metadata, None)  # closes the channel in use
        if not on_old:
            asyncio.get_running_loop().create_task(old.close(grace=30.0), name="link-old-bootstrap")

    async def _ensure_certificate(self) -> None:
        """A valid certificate on the mTLS channel: the one on disk, or a new enrolment."""
        assert self.credentials is not None
        self._refresh_trust()
        if self.certificate is not None and self.certificate.not_after > WALL():
            return
        cert = await asyncio.to_thread(self.credentials.load)
        if cert is not None and not cert.issued_by_ca:
            log.warning("the node certificate of %s was issued by a CA this coordinator no longer has (its data dir "
                        "was replaced?): enrolling again with the join token in %s", self.node.node_name,
                        self.token_file or "--join-token-file")
            self.credentials.forget()
            cert = None
        if cert is None or cert.not_after <= WALL():
            stub = agent_pb2_grpc.AgentServiceStub(self.bootstrap)
            csr = await asyncio.to_thread(self.credentials.csr, self.node.node_name)
            answer = await stub.Enrol(agent_pb2.EnrolRequest(node_name=self.node.node_name, csr_pem=csr),
                                      metadata=self.join_metadata, timeout=self.register_timeout)
            cert = await asyncio.to_thread(self.credentials.save, answer)
            log.info("enrolled node %s: certificate until %s", self.node.node_name,
                     answer.expire_time.ToDatetime().isoformat())
        self._use_certificate(cert)

    def _use_certificate(self, cert: Certificate) -> None:
        assert self.credentials is not None
        channel = grpc.aio.secure_channel(agent_address(self.target, cert.agent_port),
                                          self.credentials.channel_credentials(cert), options=CHANNEL_OPTIONS)
        self._use(channel, (), cert)

    def _use(self, channel: grpc.aio.Channel, metadata: Metadata, cert: Certificate | None) -> None:
        old = self.channel
        self.channel, self.metadata, self.certificate = channel, metadata, cert
        self.stub = agent_pb2_grpc.AgentServiceStub(channel)
        if self.on_channel is not None:
            self.on_channel(channel, metadata)
        if old is not channel and old is not self.bootstrap:
            # Calls under way on the old channel (the stream, an upload) finish within the grace.
            asyncio.get_running_loop().create_task(old.close(grace=30.0), name="link-old-channel")

    async def _renew_loop(self) -> None:
        """Renews the certificate at two thirds of its life, retrying until it runs out."""
        assert self.credentials is not None
        while True:
            cert = self.certificate
            if cert is None:
                await asyncio.sleep(0.5)
                continue
            wait = cert.renew_time() - WALL()
            if wait > 0:
                await asyncio.sleep(min(wait, 60.0))
                continue
            try:
                csr = await asyncio.to_thread(self.credentials.csr, self.node.node_name)
                answer = await self.stub.Renew(agent_pb2.RenewRequest(csr_pem=csr), timeout=self.register_timeout)
                renewed = await asyncio.to_thread(self.credentials.save, answer)
            except (grpc.aio.AioRpcError, X509Failed) as e:
                why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else str(e)
                self._note(f"renewing the node certificate failed: {why}")
                await asyncio.sleep(max(0.5, min(30.0, (cert.not_after - WALL()) / 10)))
                continue
            log.info("renewed the certificate of node %s: until %s", self.node.node_name,
                     answer.expire_time.ToDatetime().isoformat())
            if self.certificate is cert:
                self._use_certificate(renewed)

    async def _register(self) -> None:
        inventory = await asyncio.to_thread(self.node.inventory)
        req = agent_pb2.RegisterRequest(node_name=self.node.node_name, inventory=inventory)
        self.session = await self.stub.Register(req, metadata=self.metadata, timeout=self.register_timeout)
        log.info("registered node %s as %s (session %s, epoch %d, lease %.1fs, heartbeat %.1fs)",
                 self.node.node_name, self.session.node_id, self.session.session_id, self.session.epoch,
                 self.lease_duration, self.heartbeat_interval)

    async def _converse(self) -> None:
        assert self.session is not None
        call = self.stub.Connect(metadata=self.metadata)
        self.stream_id += 1
        self._seq = 0
        queue: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        self._queue = queue
        hello = self.node.hello(self.session, self.stream_id, hello_seq=1)
        self.send(hello=hello)
        tasks = [asyncio.create_task(self._write(call, queue), name="link-write"),
                 asyncio.create_task(self._read(call), name="link-read"),
                 asyncio.create_task(self._heartbeat(), name="link-heartbeat")]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # raises what ended the stream
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            call.cancel()

    async def _write(self, call: Any, queue: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        while True:
            msg = await queue.get()
            try:
                await call.write(msg)
            except asyncio.InvalidStateError as e:
                # The coordinator ended the call before this write (a restart, a superseded stream): the
                # reader sees why, or there is nothing more to see. Either way this stream is over.
                raise StreamEnded(f"the stream ended before a write: {e}") from None

    async def _read(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            kind = msg.WhichOneof("message")
            if kind == "full_state":
                self.backoff.reset()
                self._last_error = ""
                self.connected.set()
            self.node.on_message(msg, self.stream_id)
            if kind not in NOT_ACKED:
                self.send(ack=agent_pb2.Ack(seq=msg.seq))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            gpus = await asyncio.to_thread(self.node.gpus)
            ts = Timestamp()
            ts.FromNanoseconds(int(self.clock.now() * 1e9))
            self.send(heartbeat=agent_pb2.Heartbeat(time=ts, gpus=gpus,
                                                    disk_free_bytes=self.node.disk_free()))
