"""AgentService over the wire, against a real coordinator: a small client speaks the protocol of
agent.proto with the generated stubs, as nodus-agent does (Register with DATA_DIR/join-token, Connect,
Hello, FullState, Assignment, AttemptUpdate, Heartbeat), and the tests watch Jobs through the REST
API the way customers do. Every wait polls with a deadline; nothing sleeps for a fixed long time.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import grpc
import pytest
from google.protobuf import timestamp_pb2

import e2e
from conftest import Coordinator
from e2e import ATTEMPTS, JOBS, MERGE, attempts_of, create, patch_state
from nodus.cli.attempts import for_job
from nodus.agent.x509 import new_key
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
RUNNING, SUCCEEDED, FAILED, CANCELLED = (common_pb2.ATTEMPT_PHASE_RUNNING, common_pb2.ATTEMPT_PHASE_SUCCEEDED,
                                         common_pb2.ATTEMPT_PHASE_FAILED, common_pb2.ATTEMPT_PHASE_CANCELLED)


def ts(t: float | None = None) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int((time.time() if t is None else t) * 1e9))
    return out


NODE_KEYS: dict[str, Any] = {}
"""Node name -> the key its FakeAgents hold."""


class FakeAgent:
    """The agent's side of the conversation, driven by the test."""

    def __init__(self, c: Coordinator, name: str, *, cpus: int = 8, memory: int = 16 << 30,
                 runtimes: tuple[int, ...] = (common_pb2.RUNTIME_PROCESS,), token: str | None = None) -> None:
        self.c, self.name = c, name
        self.token = token if token is not None else c.join_token
        self.inventory = common_pb2.NodeInventory(
            hostname=name, agent_version="test", runtimes=list(runtimes), region_class="us",
            host=common_pb2.HostInventory(cpus=cpus, memory_bytes=memory, disk_bytes=100 << 30))
        self.session: agent_pb2.RegisterResponse | None = None
        self._lock = threading.Condition()
        self._inbox: list[agent_pb2.CoordinatorMessage | None] = []
        self._seq = 0
        self._out: Any = None
        self._call: Any = None
        self.error: grpc.RpcError | None = None
        self._beating = threading.Event()
        self.key = NODE_KEYS.setdefault(name, new_key())
        """The node's key, one per name: a FakeAgent of a name is that node's host coming back (a newer
        registration, a restart), so it enrols with the same key; another key is another host."""
        self._channel = self._node_channel(c)
        self.stub = agent_pb2_grpc.AgentServiceStub(self._channel)

    def _node_channel(self, c: Coordinator) -> grpc.Channel:
        """The agent port with this node's certificate, as nodus-agent connects; the TLS port without one
        when the join token is refused (Register then answers UNAUTHENTICATED, as for a stranger)."""
        try:
            return c.node_channel(self.name, self.key, self.token)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
            return c.channel()

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    def register(self) -> agent_pb2.RegisterResponse:
        self.session = self.stub.Register(agent_pb2.RegisterRequest(node_name=self.name, inventory=self.inventory),
                                          metadata=self.metadata, timeout=10)
        return self.session

    def reconnect_to(self, c: Coordinator) -> None:
        """The coordinator came back elsewhere (a restart picks new ports): same session, new channel."""
        self.close()
        self.c = c
        self._channel = self._node_channel(c)
        self.stub = agent_pb2_grpc.AgentServiceStub(self._channel)

    def connect(self, observations: list[agent_pb2.AttemptObservation] | None = None,
                session: agent_pb2.RegisterResponse | None = None) -> None:
        session = session or self.session
        assert session is not None
        import queue
        out: "queue.Queue[agent_pb2.AgentMessage | None]" = queue.Queue()
        self._out, self._seq, self.error = out, 0, None
        with self._lock:
            self._inbox = []
        self.send(hello=agent_pb2.Hello(node_id=session.node_id, session_id=session.session_id, epoch=session.epoch,
                                        attempts=observations or []))

        def requests() -> Iterator[agent_pb2.AgentMessage]:
            while (msg := out.get()) is not None:
                yield msg

        self._call = call = self.stub.Connect(requests(), metadata=self.metadata)

        def pump() -> None:
            try:
                for msg in call:
                    with self._lock:
                        self._inbox.append(msg)
                        self._lock.notify_all()
            except grpc.RpcError as e:
                self.error = e
            with self._lock:
                self._inbox.append(None)
                self._lock.notify_all()

        threading.Thread(target=pump, daemon=True).start()

    def send(self, **message: Any) -> int:
        self._seq += 1
        self._out.put(agent_pb2.AgentMessage(seq=self._seq, **message))
        return self._seq

    def close(self) -> None:
        self.stop_heartbeats()
        if self._out is not None:
            self._out.put(None)
        if self._call is not None:
            self._call.cancel()
        self._channel.close()

    def expect(self, kind: str, predicate: Callable[[Any], bool] = lambda _: True, timeout: float = 15) -> Any:
        """The next message of `kind` matching `predicate` (others stay for a later expect)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for i, msg in enumerate(self._inbox):
                    if msg is None:
                        raise AssertionError(f"the stream ended while waiting for {kind}: {self.error}")
                    if msg.WhichOneof("message") == kind and predicate(getattr(msg, kind)):
                        del self._inbox[i]
                        return getattr(msg, kind)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} within {timeout}s; have "
                                         f"{[m.WhichOneof('message') if m else None for m in self._inbox]}")
                self._lock.wait(left)

    def pending(self, kind: str) -> list[Any]:
        with self._lock:
            return [getattr(m, kind) for m in self._inbox if m is not None and m.WhichOneof("message") == kind]

    def ended(self, timeout: float = 10) -> grpc.RpcError | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while None not in self._inbox:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("the stream did not end")
                self._lock.wait(left)
        return self.error

    def update(self, attempt_id: str, phase: int, **fields: Any) -> int:
        return self.send(attempt_update=agent_pb2.AttemptUpdate(attempt_id=attempt_id, phase=phase, time=ts(),
                                                                **fields))

    def finish(self, attempt_id: str, phase: int = SUCCEEDED, **fields: Any) -> None:
        """Reports the end and waits until the coordinator acknowledged it (it is durable then)."""
        seq = self.update(attempt_id, phase, finish_time=ts(), **fields)
        self.expect("ack", lambda a: a.seq >= seq)

    def start_heartbeats(self, interval: float = 0.2) -> None:
        self._beating.set()

        def beat() -> None:
            while self._beating.is_set():
                try:
                    self.send(heartbeat=agent_pb2.Heartbeat(time=ts()))
                except Exception:  # noqa: BLE001 - the stream is gone
                    return
                time.sleep(interval)

        threading.Thread(target=beat, daemon=True).start()

    def stop_heartbeats(self) -> None:
        self._beating.clear()


# -- helpers ---------------------------------------------------------------------------------------------

def wait_job(c: Coordinator, name: str, predicate: Callable[[dict[str, Any]], Any], what: str = "") -> dict[str, Any]:
    """e2e.wait_job with a short deadline: the test drives the agent, so the coordinator answers at once."""
    return e2e.wait_job(c, name, predicate, timeout=15, what=what)


def phase_is(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda j: (j.get("status") or {}).get("phase") == phase


@pytest.fixture
def agent(coordinator: Coordinator) -> Iterator[FakeAgent]:
    a = FakeAgent(coordinator, "node-a")
    a.register()
    a.connect()
    full = a.expect("full_state")
    assert not full.assignments and not full.cancels and full.lease.valid_for.seconds == 15
    yield a
    a.close()


# -- the tests -------------------------------------------------------------------------------------------------

def test_indexed_job_runs_to_completion_with_at_most_parallelism_attempts(coordinator: Coordinator,
                                                                          agent: FakeAgent) -> None:
    c = coordinator
    create(c, "idx", completions=4, parallelism=2, env=[{"name": "GREETING", "value": "hi"}])
    outstanding: dict[str, agent_pb2.Assignment] = {}
    seen: list[int] = []
    while len(seen) < 4:
        while len(outstanding) < min(2, 4 - len(seen)):
            a = agent.expect("assignment")
            outstanding[a.attempt_id] = a
            agent.update(a.attempt_id, RUNNING, start_time=ts())
        time.sleep(0.2)
        assert not agent.pending("assignment"), "never more than spec.parallelism attempts at once"
        first = min(outstanding.values(), key=lambda a: a.index)
        env = dict(first.env)
        assert env["NODUS_INDEX"] == env["JOB_COMPLETION_INDEX"] == str(first.index)
        assert env["NODUS_PROJECT"] == "default" and env["NODUS_JOB"] == "idx" and env["GREETING"] == "hi"
        assert env["NODUS_ATTEMPT"] == first.attempt_id and env["NODUS_ATTEMPT_NUMBER"] == "1"
        assert list(first.command) == ["python3", "-c", "print('hi')"] and first.job.uid
        agent.finish(first.attempt_id, exit_code=0)
        seen.append(first.index)
        del outstanding[first.attempt_id]
    assert seen == [0, 1, 2, 3]
    done = wait_job(c, "idx", phase_is("Succeeded"))
    s = done["status"]
    assert s["completedIndexes"] == "0-3" and s["succeeded"] == 4 and s["active"] == 0 and s["failed"] == 0
    assert s["startTime"] and s["completionTime"] and s["timeoutStartTime"]
    assert any(cond["type"] == "Complete" and cond["status"] == "True" for cond in s["conditions"])
    attempts = attempts_of(c, "idx")
    assert [(a["spec"]["index"], a["spec"]["number"]) for a in attempts] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert all(a["status"]["phase"] == "Succeeded" and a["status"]["exitCode"] == 0 and a["spec"]["node"] == "node-a"
               for a in attempts)
    assert attempts[0]["metadata"]["name"] == "idx-0-1"


def test_attempts_are_read_only_and_listed_with_columns(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "ro")
    a = agent.expect("assignment")
    s = c.session()
    one = s.get(c.url(f"{ATTEMPTS}/ro-0-1"))
    assert one.status_code == 200 and one.json()["spec"]["id"] == a.attempt_id
    table = s.get(c.url(ATTEMPTS), headers={"Accept": TABLE}).json()
    assert [col["name"] for col in table["columnDefinitions"] if col["priority"] == 0] == \
        ["Name", "Job", "Index", "Number", "Node", "Phase", "Exit", "Reason", "Age"]
    assert table["rows"][0]["cells"][:6] == ["ro-0-1", "ro", 0, 1, "node-a", "Provisioning"]
    body = {**one.json(), "metadata": {"name": "ro-0-9"}}
    for method, url, data in (("POST", ATTEMPTS, body), ("PUT", f"{ATTEMPTS}/ro-0-1", one.json()),
                              ("DELETE", f"{ATTEMPTS}/ro-0-1", None)):
        r = s.request(method, c.url(url), json=data)
        assert r.status_code == 405 and r.json()["reason"] == "MethodNotAllowed" and r.json()["fix"], r.text
    r = s.patch(c.url(f"{ATTEMPTS}/ro-0-1/status"), data=b'{"status":{"phase":"Succeeded"}}', headers=MERGE)
    assert r.status_code == 405
    assert for_job("ro", None) == "nodus.dev/job=ro" and for_job("ro", "a=b") == "a=b,nodus.dev/job=ro"


def test_customer_failures_back_off_then_fail(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "bo", backoffLimit=1)
    log = "Traceback (most recent call last):\n  File \"x.py\", line 1\n    boom()\nValueError: boom"
    first = agent.expect("assignment")
    agent.update(first.attempt_id, RUNNING)
    agent.finish(first.attempt_id, FAILED, exit_code=1, reason="Error", message=log)
    second = agent.expect("assignment")
    assert second.index == 0 and second.attempt_number == 2 and second.attempt_id != first.attempt_id
    agent.finish(second.attempt_id, FAILED, exit_code=1, reason="Error", message=log)
    failed = wait_job(c, "bo", phase_is("Failed"))["status"]
    assert failed["reason"] == "BackoffLimitExceeded" and failed["failed"] == 2 and failed["fix"]
    assert failed["message"].endswith("line 1\n    boom()\nValueError: boom") and "Traceback" not in failed["message"]
    assert [a["status"]["phase"] for a in attempts_of(c, "bo")] == ["Failed", "Failed"]


def test_timeout_stops_the_attempt_with_deadline_exceeded(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "to", timeout="2s")
    a = agent.expect("assignment")
    agent.update(a.attempt_id, RUNNING)
    cancel = agent.expect("cancel", timeout=10)
    assert cancel.attempt_id == a.attempt_id and cancel.reason == "DeadlineExceeded" and cancel.grace_seconds > 0
    agent.finish(a.attempt_id, CANCELLED, reason="DeadlineExceeded")
    s = wait_job(c, "to", lambda j: j["status"].get("phase") == "Failed" and j["status"]["active"] == 0)["status"]
    assert s["reason"] == "DeadlineExceeded" and s["failed"] == 0
    from nodus.coordinator.clock import parse
    assert parse(s["timeoutTime"]) - parse(s["timeoutStartTime"]) == pytest.approx(2)


def test_suspend_then_resume(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "sr")
    a = agent.expect("assignment")
    agent.update(a.attempt_id, RUNNING)
    wait_job(c, "sr", phase_is("Running"))
    patch_state(c, "sr", "Suspended")
    suspend = agent.expect("suspend")  # continuity Checkpointed (the default): checkpoint, then stop
    assert suspend.attempt_id == a.attempt_id and suspend.reason == "Suspended" and suspend.seq == 1
    agent.finish(a.attempt_id, CANCELLED, reason="Suspended")
    s = wait_job(c, "sr", lambda j: j["status"].get("phase") == "Suspended" and j["status"]["active"] == 0)["status"]
    assert s["reason"] == "Suspended"
    patch_state(c, "sr", "Running")
    b = agent.expect("assignment")
    assert b.attempt_number == 2 and b.index == 0
    agent.update(b.attempt_id, RUNNING)
    agent.finish(b.attempt_id, exit_code=0)
    s = wait_job(c, "sr", phase_is("Succeeded"))["status"]
    assert s["failed"] == 0 and s["suspendedDuration"]
    suspended = next(cond for cond in s["conditions"] if cond["type"] == "Suspended")
    assert suspended["status"] == "False" and suspended["reason"] == "Resumed"


def test_cancel_stops_the_job_for_good(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "cx")
    a = agent.expect("assignment")
    agent.update(a.attempt_id, RUNNING)
    patch_state(c, "cx", "Cancelled")
    assert agent.expect("cancel").reason == "Cancelled"
    agent.finish(a.attempt_id, CANCELLED, reason="Cancelled")
    s = wait_job(c, "cx", lambda j: j["status"].get("phase") == "Cancelled" and j["status"]["active"] == 0)["status"]
    assert s["reason"] == "Cancelled" and s["fix"]
    assert attempts_of(c, "cx")[0]["status"]["phase"] == "Cancelled"


def test_ttl_deletes_the_job_and_its_attempts(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "ttl", ttlSecondsAfterFinished=1)
    a = agent.expect("assignment")
    agent.finish(a.attempt_id, exit_code=0)
    deadline = time.monotonic() + 15
    while c.session().get(c.url(f"{JOBS}/ttl")).status_code != 404 or attempts_of(c, "ttl"):
        assert time.monotonic() < deadline, "the Job or its attempts outlived ttlSecondsAfterFinished"
        time.sleep(0.1)


def test_queue_timeout_fails_with_capacity_unavailable(coordinator: Coordinator) -> None:
    c = coordinator
    create(c, "qt", placement={"queueTimeout": "1s"}, resources={"gpu": {"count": 8, "type": ["H100"]}})
    s = wait_job(c, "qt", phase_is("Failed"))["status"]
    assert s["reason"] == "CapacityUnavailable" and "no node has registered" in s["message"]
    assert attempts_of(c, "qt")[0]["status"]["phase"] == "Cancelled"


def test_progress_reaches_the_job_status(coordinator: Coordinator, agent: FakeAgent) -> None:
    c = coordinator
    create(c, "pg")
    a = agent.expect("assignment")
    agent.update(a.attempt_id, RUNNING)
    t0 = time.time()
    for i in range(4):
        seq = agent.send(progress=agent_pb2.Progress(attempt_id=a.attempt_id, stage="train", units_completed=10 * i,
                                                     units_total=100, metrics={"loss": f"0.{9 - i}"},
                                                     time=ts(t0 + i * 0.5)))
    agent.expect("ack", lambda ack: ack.seq >= seq)
    s = wait_job(c, "pg", lambda j: (j["status"].get("progress") or {}).get("units", {}).get("completed") == 30)
    assert s["status"]["progress"] == {"stage": "train", "metrics": {"loss": "0.6"},
                                       "units": {"completed": 30, "total": 100}}
    assert s["status"]["unitMetrics"] == {"completed": 30, "p50Ms": 50, "p95Ms": 50}


def test_the_coordinator_restarts_mid_job_and_the_job_still_finishes(coordinator: Coordinator,
                                                                    agent: FakeAgent) -> None:
    c = coordinator
    create(c, "rs")
    a = agent.expect("assignment")
    agent.update(a.attempt_id, RUNNING)
    wait_job(c, "rs", phase_is("Running"))
    c.stop()
    c.start()
    agent.reconnect_to(c)
    running = agent_pb2.AttemptObservation(status=agent_pb2.AttemptUpdate(attempt_id=a.attempt_id, phase=RUNNING,
                                                                          time=ts()))
    agent.connect([running])  # the same session: it lives in the store, not in the old process
    full = agent.expect("full_state")
    assert [x.attempt_id for x in full.assignments] == [a.attempt_id] and not full.cancels
    agent.finish(a.attempt_id, exit_code=0)
    s = wait_job(c, "rs", phase_is("Succeeded"))["status"]
    assert s["attempts"]["total"] == 1, "nothing was replaced: the restart lost no lease"


def test_join_token_and_hello_are_required(coordinator: Coordinator) -> None:
    bad = FakeAgent(coordinator, "node-x", token="nodusjoin_000000000000_" + "x" * 40)
    with pytest.raises(grpc.RpcError) as e:
        bad.register()
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    good = FakeAgent(coordinator, "node-x")
    session = good.register()
    stale = agent_pb2.RegisterResponse(node_id=session.node_id, session_id="nope", epoch=session.epoch)
    good.connect(session=stale)
    assert good.ended().code() == grpc.StatusCode.FAILED_PRECONDITION
    good.close()
    bad.close()


def test_an_attempt_stopped_before_its_agent_had_it_ends_without_the_agent(coordinator: Coordinator) -> None:
    c = coordinator
    a = FakeAgent(c, "node-a")
    a.register()  # registered, so Ready, but no stream yet: the assignment cannot go out
    create(c, "early")
    deadline = time.monotonic() + 15
    while not (attempts_of(c, "early") and attempts_of(c, "early")[0]["spec"].get("node")):
        assert time.monotonic() < deadline, "the attempt was never placed"
        time.sleep(0.05)
    patch_state(c, "early", "Cancelled")
    while not attempts_of(c, "early")[0]["spec"].get("stop"):
        assert time.monotonic() < deadline, "the stop was never requested"
        time.sleep(0.05)
    a.connect()  # its Hello knows no attempt
    full = a.expect("full_state")
    assert not full.assignments and not full.cancels
    s = wait_job(c, "early", lambda j: j["status"].get("phase") == "Cancelled" and j["status"]["active"] == 0)
    assert attempts_of(c, "early")[0]["status"]["phase"] == "Cancelled"
    assert s["status"]["failed"] == 0
    a.close()
