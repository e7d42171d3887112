"""Node-scoped access (issue 15, item 3; docs/adr/0045), with a real coordinator and a real agent: a node
reads and writes only the blobs, logs and checkpoints of attempts placed on it, and only while they run.

Node A (a real agent) runs a producer and a consumer that reads the producer's output, is suspended into
a checkpoint and resumed from it. The join token alone, and node B (enrolled: a valid node certificate
of its own), get PERMISSION_DENIED (reason NodeScope) for A's attempt's output, log and checkpoint; A
itself reads them with its own certificate, but not a blob its attempt does not name, and not once the
attempt ended; its uploads are taken for the grace after the end, and refused past it."""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from e2e import agent_md, attempts_of, create, ended, patch_state, start_agent, suspend, units, wait_job

from nodus.agent.x509 import new_key
from nodus.coordinator.clock import OffsetClock
from nodus.coordinator.controllers.attempt_machine import AttemptPhase
from nodus.coordinator.node_scope import GRACE_SECONDS
from nodus.v1 import blob_pb2, blob_pb2_grpc

PRODUCE = r"""
import os, sys
from pathlib import Path
Path(os.environ["NODUS_OUTPUTS_DIR"], "model.bin").write_bytes(sys.argv[1].encode() * 1000)
"""

# Reads its input, then counts in the state dir (checkpointed on suspend) until cancelled.
CONSUME = r"""
import os, signal, sys, time
from pathlib import Path
from nodus import progress
assert Path(os.environ["NODUS_INPUTS_DIR"], "data").read_bytes() == b"weights " * 1000
path = os.path.join(os.environ["NODUS_STATE_DIR"], "counter")
n = int(open(path).read()) if os.path.exists(path) else 0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    progress.report(stage="count", completed=n, total=1_000_000)
    print("count", n, flush=True)
    time.sleep(0.1)
"""


def reason(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, error
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in status.details)
    return str(info.reason)


@pytest.fixture(scope="module")
def offset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The coordinator's --clock-offset-file: seconds its clock runs ahead."""
    return tmp_path_factory.mktemp("clock") / "offset"


@pytest.fixture(scope="module")
def c(offset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("scope") / "data").start(
            extra_args=("--clock-offset-file", str(offset))) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def a(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(c, tmp_path_factory.mktemp("node-a") / "work", "scope-a") as agent:
        yield agent


def own_channel(c: Coordinator, agent: AgentProcess) -> grpc.Channel:
    """The agent port over mTLS with the key and certificate the agent enrolled for itself."""
    identity = agent.work_dir / "identity"
    creds = grpc.ssl_channel_credentials(c.grpc.ca.read_bytes() if c.grpc.ca else None,
                                         (identity / "node.key").read_bytes(), (identity / "node.crt").read_bytes())
    return grpc.secure_channel(c.agent_address, creds)


def read(stub: Any, attempt_id: str, sha256: str, md: Any = ()) -> bytes:
    return b"".join(ch.data for ch in stub.Get(blob_pb2.GetBlobRequest(sha256=sha256, attempt_id=attempt_id),
                                               metadata=md, timeout=10))


def put(stub: Any, attempt_id: str, data: bytes, md: Any = ()) -> Any:
    def parts() -> Iterator[blob_pb2.PutRequest]:
        yield blob_pb2.PutRequest(header=blob_pb2.PutHeader(sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                                                            attempt_id=attempt_id))
        yield blob_pb2.PutRequest(data=data)
    return stub.Put(parts(), metadata=md, timeout=10)


def append(stub: Any, attempt_id: str, md: Any = ()) -> Any:
    chunk = blob_pb2.LogChunk(attempt_id=attempt_id, offset=1 << 40, data=b"forged line\n")
    return stub.AppendLog(iter([chunk]), metadata=md, timeout=10)


def denied(call: Any, *words: str) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
    assert reason(refused.value) == "NodeScope", refused.value
    details = refused.value.details() or ""
    for word in words:
        assert word in details, details
    return details


@pytest.fixture(scope="module")
def world(c: Coordinator, a: AgentProcess) -> dict[str, Any]:
    """A's producers, and a consumer of `model` suspended into a checkpoint and resumed from it (running)."""
    for name, word in (("prod", "weights "), ("other", "private ")):
        create(c, name, command=[sys.executable, "-c", PRODUCE, word],
               outputs=[{"name": "model", "path": "/nodus/outputs/model.bin"}])
    outputs = {name: next(o for o in ended(c, name)["status"]["outputs"] if o["name"] == "model")["sha256"]
               for name in ("prod", "other")}
    create(c, "cons", command=[sys.executable, "-c", CONSUME],
           inputs=[{"name": "data", "output": {"job": "prod", "name": "model"}}])
    wait_job(c, "cons", lambda j: units(j) >= 3, what="the consumer to count")
    suspend(c, "cons")
    [first] = attempts_of(c, "cons")
    [checkpoint] = first["status"]["checkpoints"]
    patch_state(c, "cons", "Running")
    wait_job(c, "cons", lambda j: len(attempts_of(c, "cons")) == 2 and units(j) > 0, what="the consumer to resume")
    resumed = max(attempts_of(c, "cons"), key=lambda x: int(x["spec"]["number"]))
    assert resumed["spec"]["node"] == "scope-a"
    return {"model": outputs["prod"], "other": outputs["other"], "checkpoint": checkpoint["sha256"],
            "attempt": resumed["spec"]["id"], "ended": first["spec"]["id"]}


def test_the_join_token_alone_reads_and_writes_no_blob(c: Coordinator, world: dict[str, Any]) -> None:
    attempt = world["attempt"]
    with c.channel() as channel:
        stub = blob_pb2_grpc.BlobServiceStub(channel)
        denied(lambda: read(stub, attempt, world["model"], agent_md(c)), "join token")
        denied(lambda: read(stub, attempt, world["checkpoint"], agent_md(c)), "join token")
        denied(lambda: append(stub, attempt, agent_md(c)), "join token")
        denied(lambda: put(stub, attempt, b"planted", agent_md(c)), "join token")


def test_another_node_reaches_nothing_of_node_as_attempt(c: Coordinator, world: dict[str, Any]) -> None:
    attempt = world["attempt"]
    with c.node_channel("scope-b", new_key()) as channel:
        stub = blob_pb2_grpc.BlobServiceStub(channel)
        denied(lambda: read(stub, attempt, world["model"]), f"attempt {attempt}", "scope-b")
        denied(lambda: read(stub, attempt, world["checkpoint"]), f"attempt {attempt}")
        denied(lambda: stub.Stat(blob_pb2.StatBlobRequest(sha256=world["model"], attempt_id=attempt), timeout=10))
        denied(lambda: append(stub, attempt), f"attempt {attempt}")
        denied(lambda: put(stub, attempt, b"planted"), f"attempt {attempt}")
        denied(lambda: read(stub, "", world["model"]), "names no attempt")


def test_the_node_reads_its_attempts_blobs_only_while_it_runs(c: Coordinator, a: AgentProcess, offset: Path,
                                                               world: dict[str, Any]) -> None:
    attempt = world["attempt"]
    with own_channel(c, a) as channel:
        stub = blob_pb2_grpc.BlobServiceStub(channel)
        assert read(stub, attempt, world["model"]) == b"weights " * 1000, "its input"
        assert hashlib.sha256(read(stub, attempt, world["checkpoint"])).hexdigest() == world["checkpoint"], \
            "the checkpoint it resumed from"
        ref = stub.Stat(blob_pb2.StatBlobRequest(sha256=world["model"], attempt_id=attempt), timeout=10)
        assert ref.sha256 == world["model"]
        denied(lambda: read(stub, attempt, world["other"]), f"blob {world['other']}", f"attempt {attempt}")
        denied(lambda: read(stub, world["ended"], world["checkpoint"]), f"attempt {world['ended']} has ended")
        assert put(stub, attempt, b"an upload of a running attempt").size == 30

        patch_state(c, "cons", "Cancelled")
        ended(c, "cons")
        wait_for(lambda: all(AttemptPhase.parse(x["status"].get("phase")).terminal for x in attempts_of(c, "cons")), 60,
                 what="the resumed attempt to end")
        denied(lambda: read(stub, attempt, world["model"]), f"attempt {attempt} has ended")
        # Within the grace the node may still upload for it (the log's tail and eof come after the end) ...
        assert put(stub, attempt, b"the last upload").size == 15
        # ... and past it, nothing.
        offset.write_text(str(GRACE_SECONDS + 3600))
        time.sleep(OffsetClock.REREAD * 4)  # the coordinator reads the file again by then
        try:
            denied(lambda: put(stub, attempt, b"too late"), f"attempt {attempt} has ended")
            denied(lambda: append(stub, attempt), f"attempt {attempt} has ended")
        finally:
            offset.write_text("0")
