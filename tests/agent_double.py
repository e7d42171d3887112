"""A protocol double of the coordinator for the agent's tests: AgentService and BlobService in-process.

It speaks agent.proto's conversation from the other end (sessions and epochs, FullState first,
numbered messages, LeaseRenewal per Heartbeat, Ack), keeps blobs and logs in memory, records every
message, and lets a test push Assignments and Cancels, drop streams, stop renewing the lease or
refuse a session. It is not a coordinator: it decides nothing.
"""
from __future__ import annotations

import hashlib
import itertools
import queue
import random
import shutil
import socket
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from nodus.v1 import agent_pb2, agent_pb2_grpc, blob_pb2, blob_pb2_grpc, common_pb2

PHASE_NAMES = {v: k.removeprefix("ATTEMPT_PHASE_") for k, v in common_pb2.AttemptPhase.items()}
TERMINAL = {"SUCCEEDED", "FAILED", "LOST", "CANCELLED"}


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (for a server a test or bench starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restart_ports(count: int = 2) -> int:
    """The first of `count` consecutive TCP ports of 127.0.0.1, free now, for a server a test stops and starts
    again on the same ports (a coordinator's gRPC port and its agent port, the next one). They lie below the
    kernel's ephemeral range (ip_local_port_range starts at 32768), so no server that asked for port 0 and no
    client's outgoing connection takes them while the server is down, as they could a free_port() one."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, 32000 - count)
        socks: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports between 20000 and 32000 on 127.0.0.1")


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = "") -> Any:
    """Polls `predicate` until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class Stream:
    number: int
    outbox: "queue.Queue[agent_pb2.CoordinatorMessage | None]" = field(default_factory=queue.Queue)
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))  # type: ignore[type-arg]
    abort: grpc.StatusCode | None = None
    open: bool = True

    def put(self, **message: Any) -> None:
        self.outbox.put(agent_pb2.CoordinatorMessage(**message))


class FakeCoordinator(agent_pb2_grpc.AgentServiceServicer, blob_pb2_grpc.BlobServiceServicer):  # type: ignore[misc]
    def __init__(self, token: str = "nodusjoin_test_secret", lease: float = 5.0, heartbeat: float = 0.2,
                 port: int = 0) -> None:
        self.token = token
        self.lease = lease
        self.heartbeat = heartbeat
        self.lock = threading.RLock()
        self.registrations: list[agent_pb2.RegisterRequest] = []
        self.received: list[tuple[int, agent_pb2.AgentMessage]] = []
        self.streams: list[Stream] = []
        self.desired: dict[str, agent_pb2.Assignment] = {}
        self.cancels: dict[str, agent_pb2.Cancel] = {}
        self.blobs: dict[str, bytes] = {}
        self.logs: dict[str, bytearray] = {}
        self.log_eof: set[str] = set()
        self.renew = True
        self.auto_ack = True
        self.session_id = ""
        self.epoch = 0
        self.reject_next_connect = False
        self.log_faults = 0
        """AppendLog calls still to break (UNAVAILABLE after their first chunk)."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self, self.server)
        blob_pb2_grpc.add_BlobServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{self.port}"

    def start(self) -> "FakeCoordinator":
        self.server.start()
        return self

    def stop(self) -> None:
        with self.lock:
            for s in self.streams:
                s.outbox.put(None)
        self.server.stop(grace=0.5).wait()

    # -- auth --------------------------------------------------------------------------------------
    def _auth(self, context: grpc.ServicerContext) -> None:
        md = dict(context.invocation_metadata())
        if md.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad join token")

    # -- AgentService ------------------------------------------------------------------------------
    def Register(self, request: agent_pb2.RegisterRequest, context: grpc.ServicerContext) -> agent_pb2.RegisterResponse:
        self._auth(context)
        with self.lock:
            self.registrations.append(request)
            self.epoch += 1
            self.session_id = f"session-{self.epoch}"
            for s in self.streams:  # an older session's stream is closed
                if s.open:
                    s.abort = grpc.StatusCode.FAILED_PRECONDITION
                    s.outbox.put(None)
            return agent_pb2.RegisterResponse(node_id=f"node-{request.node_name}", session_id=self.session_id,
                                              epoch=self.epoch, lease_duration=duration(self.lease),
                                              heartbeat_interval=duration(self.heartbeat))

    def full_state(self) -> agent_pb2.FullState:
        with self.lock:
            return agent_pb2.FullState(assignments=list(self.desired.values()), cancels=list(self.cancels.values()),
                                       lease=agent_pb2.LeaseRenewal(valid_for=duration(self.lease)))

    def Connect(self, request_iterator: Iterator[agent_pb2.AgentMessage],
                context: grpc.ServicerContext) -> Iterator[agent_pb2.CoordinatorMessage]:
        self._auth(context)
        first = next(request_iterator)
        with self.lock:
            number = len(self.streams) + 1
            self.received.append((number, first))
            if first.WhichOneof("message") != "hello" or first.hello.session_id != self.session_id or \
                    self.reject_next_connect:
                self.reject_next_connect = False
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "unknown or superseded session")
            stream = Stream(number)
            self.streams.append(stream)
        stream.put(full_state=self.full_state())
        if self.auto_ack:
            stream.put(ack=agent_pb2.Ack(seq=first.seq))
        threading.Thread(target=self._pump, args=(request_iterator, stream), daemon=True).start()
        try:
            while True:
                msg = stream.outbox.get()
                if msg is None:
                    break
                msg.seq = next(stream.seq)
                yield msg
            if stream.abort is not None:
                context.abort(stream.abort, "stream closed by the test")
        finally:
            stream.open = False

    def _pump(self, request_iterator: Iterator[agent_pb2.AgentMessage], stream: Stream) -> None:
        try:
            for msg in request_iterator:
                with self.lock:
                    self.received.append((stream.number, msg))
                kind = msg.WhichOneof("message")
                if kind == "heartbeat" and self.renew:
                    stream.put(lease_renewal=agent_pb2.LeaseRenewal(valid_for=duration(self.lease)))
                elif kind in ("attempt_update", "progress") and self.auto_ack:
                    stream.put(ack=agent_pb2.Ack(seq=msg.seq))
        except grpc.RpcError:
            pass
        finally:
            stream.open = False
            stream.outbox.put(None)

    # -- what the test does ------------------------------------------------------------------------
    def current(self) -> Stream | None:
        with self.lock:
            live = [s for s in self.streams if s.open]
            return live[-1] if live else None

    def assign(self, a: agent_pb2.Assignment, push: bool = True) -> None:
        with self.lock:
            self.desired[a.attempt_id] = a
        s = self.current()
        if push and s is not None:
            s.put(assignment=a)

    def cancel(self, attempt_id: str, reason: str = "Cancelled", grace: int = 5, push: bool = True) -> None:
        c = agent_pb2.Cancel(attempt_id=attempt_id, reason=reason, grace_seconds=grace)
        with self.lock:
            self.desired.pop(attempt_id, None)
            self.cancels[attempt_id] = c
        s = self.current()
        if push and s is not None:
            s.put(cancel=c)

    def forget(self, attempt_id: str) -> None:
        with self.lock:
            self.desired.pop(attempt_id, None)
            self.cancels.pop(attempt_id, None)

    def drop_streams(self, code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE) -> None:
        with self.lock:
            for s in self.streams:
                if s.open:
                    s.abort = code
                    s.outbox.put(None)

    # -- what the test reads -----------------------------------------------------------------------
    def messages(self, kind: str | None = None) -> list[tuple[int, agent_pb2.AgentMessage]]:
        with self.lock:
            return [(n, m) for n, m in self.received if kind is None or m.WhichOneof("message") == kind]

    def updates(self, attempt_id: str) -> list[agent_pb2.AttemptUpdate]:
        """Every AttemptUpdate seen for the attempt, Hello observations included, in arrival order."""
        out = []
        for _, m in self.messages():
            kind = m.WhichOneof("message")
            if kind == "attempt_update" and m.attempt_update.attempt_id == attempt_id:
                out.append(m.attempt_update)
            elif kind == "hello":
                out += [o.status for o in m.hello.attempts if o.status.attempt_id == attempt_id]
        return out

    def phases(self, attempt_id: str) -> list[str]:
        return [PHASE_NAMES[u.phase] for u in self.updates(attempt_id)]

    def final(self, attempt_id: str) -> agent_pb2.AttemptUpdate | None:
        for u in self.updates(attempt_id):
            if PHASE_NAMES[u.phase] in TERMINAL:
                return u
        return None

    def wait_final(self, attempt_id: str, timeout: float = 30.0) -> agent_pb2.AttemptUpdate:
        return wait_for(lambda: self.final(attempt_id), timeout, what=f"the end of {attempt_id} "
                                                                      f"(phases so far {self.phases(attempt_id)})")

    def progress(self, attempt_id: str) -> list[agent_pb2.Progress]:
        out = []
        for _, m in self.messages():
            kind = m.WhichOneof("message")
            if kind == "progress" and m.progress.attempt_id == attempt_id:
                out.append(m.progress)
            elif kind == "hello":
                out += [o.progress for o in m.hello.attempts
                        if o.status.attempt_id == attempt_id and o.HasField("progress")]
        return out

    def truncate_log(self, attempt_id: str, size: int) -> None:
        """As if the server lost the log's tail: the agent's next chunk leaves a gap."""
        with self.lock:
            del self.logs.setdefault(attempt_id, bytearray())[size:]

    def log(self, attempt_id: str) -> str:
        with self.lock:
            return bytes(self.logs.get(attempt_id, b"")).decode(errors="replace")

    def hellos(self) -> list[agent_pb2.Hello]:
        return [m.hello for _, m in self.messages("hello")]

    # -- BlobService -------------------------------------------------------------------------------
    def Put(self, request_iterator: Iterator[blob_pb2.PutRequest], context: grpc.ServicerContext) -> blob_pb2.BlobRef:
        self._auth(context)
        header = next(request_iterator).header
        data = b"".join(r.data for r in request_iterator)
        digest = hashlib.sha256(data).hexdigest()
        if (header.sha256 and header.sha256 != digest) or (header.size and header.size != len(data)):
            context.abort(grpc.StatusCode.DATA_LOSS, f"declared {header.sha256}/{header.size}, got {digest}/{len(data)}")
        with self.lock:
            self.blobs[digest] = data
        return blob_pb2.BlobRef(sha256=digest, size=len(data), uri=f"blob://sha256/{digest}")

    def Get(self, request: blob_pb2.GetBlobRequest, context: grpc.ServicerContext) -> Iterator[blob_pb2.BlobChunk]:
        self._auth(context)
        with self.lock:
            data = self.blobs.get(request.sha256)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        assert data is not None
        for i in range(request.offset, len(data), 1 << 20):
            yield blob_pb2.BlobChunk(data=data[i:i + (1 << 20)])

    def Stat(self, request: blob_pb2.StatBlobRequest, context: grpc.ServicerContext) -> blob_pb2.BlobRef:
        self._auth(context)
        with self.lock:
            data = self.blobs.get(request.sha256)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        assert data is not None
        return blob_pb2.BlobRef(sha256=request.sha256, size=len(data), uri=f"blob://sha256/{request.sha256}")

    def AppendLog(self, request_iterator: Iterator[blob_pb2.LogChunk], context: grpc.ServicerContext) -> blob_pb2.LogAck:
        self._auth(context)
        size = 0
        taken = 0
        for chunk in request_iterator:
            if taken and self.log_faults > 0:
                self.log_faults -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "the test broke this stream")
            taken += 1
            with self.lock:
                log = self.logs.setdefault(chunk.attempt_id, bytearray())
                if chunk.offset > len(log):
                    context.set_trailing_metadata((("log-size", str(len(log))),))
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gap: the log has {len(log)} bytes")
                skip = len(log) - chunk.offset
                if skip < len(chunk.data):
                    log += chunk.data[skip:]
                if chunk.eof:
                    self.log_eof.add(chunk.attempt_id)
                size = len(log)
        return blob_pb2.LogAck(size=size)


class AgentProcess:
    """A real `nodus-agent` process pointed at a (fake or real) coordinator, for integration tests."""

    def __init__(self, work_dir: Path, coordinator: str, token: str, *, node: str = "node-a",
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.work_dir.parent / f"{self.work_dir.name}.token"
        self.token_file.write_text(token + "\n")
        self.log_path = self.work_dir.parent / f"{self.work_dir.name}.log"
        self.coordinator = coordinator
        self.node = node
        self.extra_args = extra_args
        self.env = env
        self.proc: Any = None

    def argv(self) -> list[str]:
        import sys

        return [str(Path(sys.executable).parent / "nodus-agent"), "--coordinator", self.coordinator,
                "--node", self.node, "--work-dir", str(self.work_dir), "--join-token-file", str(self.token_file),
                "--reconnect-base", "0.05", "--reconnect-max", "0.5", "--poll-interval", "0.1",
                "--stop-grace", "3", "--runtime", "process", *self.tls_args(), *self.extra_args]
        # (--runtime process as before auto; --runtime oci in extra_args overrides)

    def tls_args(self) -> list[str]:
        """--coordinator-ca for a real coordinator's address (conftest.GrpcAddress knows its CA), else
        plaintext: a FakeCoordinator, or a coordinator run with --grpc-insecure."""
        ca = getattr(self.coordinator, "ca", None)
        return ["--coordinator-ca", str(ca)] if ca is not None else ["--coordinator-insecure"]

    def start(self) -> "AgentProcess":
        import os
        import subprocess

        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def signal(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return int(self.proc.wait(20))
        finally:
            self.proc = None

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL if it does not stop within 20 s; False when it had to be killed."""
        import signal as signals

        proc = self.proc
        clean = True
        if proc is not None and proc.poll() is None:
            try:
                self.signal(signals.SIGTERM)
            except Exception:  # noqa: BLE001 - it did not stop in time: a test must not leak it
                proc.kill()
                proc.wait()
                clean = False
        self.proc = None
        return clean

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def state(self) -> dict[str, Any]:
        from nodus.agent.statefile import read_json

        return read_json(self.work_dir / "state.json") or {}

    def leftovers(self) -> list[str]:
        """What a test must not leave behind it, as dask's gen_cluster checks at teardown: a process
        working in an attempt's directory once that attempt has ended (the agent forgets an ended,
        acknowledged attempt's directory, so the processes are found by their working directory), and
        an ended or forgotten attempt's cgroup that still exists, with processes in it or empty."""
        return self._process_leftovers() + self._cgroup_leftovers()

    def _cgroup_root(self) -> str:
        args = list(self.extra_args)
        return args[args.index("--cgroup-root") + 1] if "--cgroup-root" in args else "nodus"

    def _cgroup_leftovers(self) -> list[str]:
        """The supervisor removes its attempt's cgroup on the way out and the agent never does later, so
        one still there once the attempt ended is a leak. An attempt with a directory names its cgroup in
        spec.json; a forgotten one (directory removed) is found by the name the process runtime gives its
        cgroups (runtime/process.py `cgroup_name`: the work dir's digest, then the directory's name)."""
        from nodus.agent.cgroups import Cgroup
        from nodus.agent.layout import AttemptLayout
        from nodus.agent.statefile import read_json

        attempts = self.work_dir.resolve() / "attempts"
        scope = hashlib.sha256(str(self.work_dir.resolve()).encode()).hexdigest()[:8] + "-"
        ended: dict[tuple[str, str], str] = {}
        """(cgroup root, cgroup name) → the ended attempt it belongs to, as the message says it."""
        if attempts.is_dir():
            for d in attempts.iterdir():
                layout = AttemptLayout(d)
                status, spec = read_json(layout.status) or {}, read_json(layout.spec) or {}
                if spec.get("cgroups", True) and status.get("phase") in TERMINAL:
                    where = (spec.get("cgroup_root", "nodus"), spec.get("cgroup_name") or d.name)
                    ended[where] = f"ended attempt {d.name} ({status['phase']})"
        root = self._cgroup_root()
        for name in Cgroup.names(root):
            if name.startswith(scope) and not (attempts / name[len(scope):]).exists():
                ended[(root, name)] = f"forgotten attempt {name[len(scope):]}"
        found: list[str] = []
        for (root, name), attempt in sorted(ended.items()):
            cgroup = Cgroup.locate(root, name)
            if not cgroup.usable:
                continue
            pids = sorted(p for p in cgroup.pids() if _alive(p))
            if pids:
                found.append(f"pids {pids} still run in the cgroup of {attempt}: {root}/{name}")
            else:
                found.append(f"the cgroup of {attempt} was left behind, empty: "
                             f"{', '.join(str(p) for p in cgroup.paths.values())}")
        return found

    def _process_leftovers(self) -> list[str]:
        import os

        from nodus.agent.layout import AttemptLayout
        from nodus.agent.statefile import read_json

        prefix = str(self.work_dir.resolve() / "attempts") + os.sep
        found: list[str] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or not _alive(int(entry)):
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if not cwd.startswith(prefix):
                continue
            attempt = cwd[len(prefix):].split(os.sep)[0].removesuffix(" (deleted)")
            status = read_json(AttemptLayout(Path(prefix) / attempt).status) or {}
            if status and status.get("phase") not in TERMINAL:
                continue  # still running on purpose (a test that ends with it): reap() kills it
            found.append(f"pid {entry} still works in ended attempt {attempt} ({status.get('phase', 'forgotten')})")
        return found

    def reap(self) -> None:
        """Stops the agent and kills every workload it left (tests must not leak processes); fails
        when the agent needed SIGKILL to stop."""
        clean = self.stop()
        try:
            self._kill_workloads()
        finally:
            assert clean, f"nodus-agent did not stop on SIGTERM:\n{self.log()[-2000:]}"

    def _kill_workloads(self) -> None:
        import os
        import signal as signals

        from nodus.agent.cgroups import Cgroup
        from nodus.agent.layout import AttemptLayout
        from nodus.agent.statefile import read_json

        attempts = self.work_dir / "attempts"
        if not attempts.is_dir():
            return
        for d in attempts.iterdir():
            layout = AttemptLayout(d)
            status = read_json(layout.status) or {}
            pids = [status.get("supervisor_pid"), *(status.get("process_groups") or [])]
            for pid in pids:
                if not pid:
                    continue
                for kill in (os.killpg, os.kill):
                    try:
                        kill(int(pid), signals.SIGKILL)
                    except OSError:
                        pass
            spec = read_json(layout.spec) or {}
            cg = Cgroup.locate(spec.get("cgroup_root", "nodus"), spec.get("cgroup_name") or d.name)
            cg.kill_all()
            cg.remove()


def _alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    """The double on loopback (lease 5 s, a heartbeat every 0.2 s), stopped after the test (a test module
    uses it by importing it)."""
    f = FakeCoordinator(lease=5.0, heartbeat=0.2).start()
    try:
        yield f
    finally:
        f.stop()


def reachable_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory every uid can pass through (pytest's tmp is 0700: an attempt's own uid could not
    reach its work dir there), removed after: `yield from reachable_dir(...)` in a fixture."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
