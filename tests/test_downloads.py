"""REST downloads against a real coordinator and a real node agent: committed outputs and attempt logs.

Outputs and logs arrive the way they do in production: a `nodus-agent` process runs the Job, uploads
its outputs and streams its log through BlobService, and the Job controller folds the OutputCommits
into `status.outputs`. One log test plays the agent itself (AppendLog from a thread) for an attempt
that no node can run, so that it controls every byte and the timing.
"""
from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import zstandard

from conftest import Coordinator, job
from e2e import ATTEMPTS, JOBS, agent_md, following, start_agent
from agent_double import AgentProcess
from nodus.v1 import blob_pb2, blob_pb2_grpc

UNPLACEABLE = {"resources": {"gpu": {"count": 8, "type": ["H100"]}}}
"""No test node has GPUs: such a Job keeps its first Attempt Pending, and nobody writes its log."""

PRODUCE = r"""
import os, shutil, sys
index = os.environ["NODUS_INDEX"]
model = os.urandom(3 * 1024 * 1024 + int(index))
open(os.path.join(os.environ["NODUS_STATE_DIR"], "model.bin"), "wb").write(model)
out = os.environ["NODUS_OUTPUTS_DIR"]
os.makedirs(os.path.join(out, "sub"), exist_ok=True)
open(os.path.join(out, "a.txt"), "w").write("index " + index + "\n")
open(os.path.join(out, "sub", "b.txt"), "w").write("beta\n")
open(os.path.join(sys.argv[1], "model-" + index + ".bin"), "wb").write(model)
print("produced index", index)
"""


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    return shared_coordinator


@pytest.fixture(scope="module")
def agent(c: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(c, tmp_path_factory.mktemp("agent") / "work") as a:
        yield a


def wait_for_phase(c: Coordinator, name: str, phases: tuple[str, ...] = ("Succeeded",),
                   timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = c.session().get(c.url(f"{JOBS}/{name}")).json()
        phase = (got.get("status") or {}).get("phase")
        if phase in phases:
            return got
        assert phase not in ("Failed", "Cancelled", "Succeeded"), f"job {name} ended {phase}: {got.get('status')}"
        assert time.monotonic() < deadline, f"job {name} is still {phase} after {timeout}s: {got.get('status')}"
        time.sleep(0.1)


def wait_for_attempt(c: Coordinator, name: str, index: int = 0, timeout: float = 30) -> dict[str, Any]:
    """The job controller creates the index's Attempt; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.session().get(c.url(ATTEMPTS),
                            params={"labelSelector": f"nodus.dev/job={name},nodus.dev/index={index}"})
        assert r.status_code == 200, r.text
        if r.json()["items"]:
            return r.json()["items"][-1]
        assert time.monotonic() < deadline, f"no Attempt for job {name} index {index} after {timeout}s"
        time.sleep(0.05)


def entry(job_obj: dict[str, Any], name: str, index: int) -> dict[str, Any]:
    return next(o for o in job_obj["status"]["outputs"] if o["name"] == name and o["index"] == index)


@pytest.fixture(scope="module")
def produced(c: Coordinator, agent: AgentProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Job of two indexes, each committing a file output `model` and the outputs directory."""
    copies = tmp_path_factory.mktemp("copies")
    body = job("dl-1", command=[sys.executable, "-c", PRODUCE, str(copies)], completions=2, parallelism=2,
               outputs=[{"name": "model", "path": "/nodus/state/model.bin"}])
    r = c.session().post(c.url(JOBS), json=body)
    assert r.status_code == 201, r.text
    done = wait_for_phase(c, "dl-1")
    return {"job": done, "model": {i: (copies / f"model-{i}.bin").read_bytes() for i in (0, 1)}}


# ---- outputs ---------------------------------------------------------------------------------------

def test_download_a_file_output(c: Coordinator, produced: dict[str, Any]) -> None:
    committed = entry(produced["job"], "model", 0)
    r = c.session().get(c.url(f"{JOBS}/dl-1/outputs/model"), params={"index": 0})
    assert r.status_code == 200, r.text
    digest = hashlib.sha256(r.content).hexdigest()
    assert r.content == produced["model"][0], "the bytes the program wrote"
    assert digest == committed["sha256"] and len(r.content) == committed["size"]
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert int(r.headers["Content-Length"]) == len(r.content)
    assert r.headers["ETag"] == f'"{digest}"' and r.headers["X-Content-SHA256"] == digest
    assert r.headers["Digest"] == "sha-256=" + base64.b64encode(bytes.fromhex(digest)).decode()
    assert r.headers["Content-Disposition"] == 'attachment; filename="dl-1-model-0.bin"'
    assert r.headers["X-Request-Id"].startswith("req_")
    other = c.session().get(c.url(f"{JOBS}/dl-1/outputs/model"), params={"index": 1})
    assert other.content == produced["model"][1] and other.content != r.content


def test_download_a_directory_output_is_tar_zst(c: Coordinator, produced: dict[str, Any]) -> None:
    for index in (0, 1):
        params = {"index": index} if index else {}  # index defaults to 0
        r = c.session().get(c.url(f"{JOBS}/dl-1/outputs/outputs"), params=params)
        assert r.status_code == 200, r.text
        assert hashlib.sha256(r.content).hexdigest() == entry(produced["job"], "outputs", index)["sha256"]
        assert r.headers["Content-Type"] == "application/zstd"
        assert r.headers["Content-Disposition"] == f'attachment; filename="dl-1-outputs-{index}.tar.zst"'
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(r.content)) as raw:
            with tarfile.open(fileobj=raw, mode="r|") as tar:
                files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        assert files == {"a.txt": f"index {index}\n".encode(), "sub/b.txt": b"beta\n"}


def test_conditional_range_and_head(c: Coordinator, produced: dict[str, Any]) -> None:
    s = c.session()
    url = c.url(f"{JOBS}/dl-1/outputs/model")
    model = produced["model"][0]
    etag = f'"{hashlib.sha256(model).hexdigest()}"'
    assert s.get(url, headers={"If-None-Match": etag}).status_code == 304
    part = s.get(url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == model[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(model)}"
    suffix = s.get(url, headers={"Range": "bytes=-7"})
    assert suffix.status_code == 206 and suffix.content == model[-7:]
    head = s.head(url)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) == len(model)


def test_missing_outputs_are_404_with_a_fix(c: Coordinator, produced: dict[str, Any]) -> None:
    s = c.session()
    for path, params, words in (
        (f"{JOBS}/dl-1/outputs/model", {"index": 5}, 'no committed output "model" for index 5'),
        (f"{JOBS}/dl-1/outputs/nope", {}, 'no committed output "nope"'),
    ):
        r = s.get(c.url(path), params=params)
        assert r.status_code == 404, r.text
        status = r.json()
        assert status["kind"] == "Status" and status["reason"] == "NotFound" and words in status["message"]
        assert "model (index 0)" in status["fix"] and status["requestId"].startswith("req_")
    assert s.post(c.url(JOBS), json=job("dl-waiting", **UNPLACEABLE)).status_code == 201
    waiting = s.get(c.url(f"{JOBS}/dl-waiting/outputs/outputs")).json()
    assert waiting["reason"] == "NotFound" and "(yet)" in waiting["message"]
    assert "nodus outputs get dl-waiting outputs" in waiting["fix"]
    gone = s.get(c.url(f"{JOBS}/no-such-job/outputs/outputs"))
    assert gone.status_code == 404 and gone.json()["details"]["kind"] == "jobs"
    bad = s.get(c.url(f"{JOBS}/dl-1/outputs/model"), params={"index": "x"})
    assert bad.status_code == 400 and bad.json()["reason"] == "BadRequest"


def test_output_whose_content_is_no_longer_stored(c: Coordinator, agent: AgentProcess) -> None:
    code = "import os; open(os.path.join(os.environ['NODUS_OUTPUTS_DIR'], 'x'), 'w').write('soon gone')"
    assert c.session().post(c.url(JOBS), json=job("dl-lost", command=[sys.executable, "-c", code])).status_code == 201
    digest = entry(wait_for_phase(c, "dl-lost"), "outputs", 0)["sha256"]
    (c.data_dir / "blobs" / "sha256" / digest[:2] / digest[2:]).unlink()  # what retention will do
    r = c.session().get(c.url(f"{JOBS}/dl-lost/outputs/outputs"))
    assert r.status_code == 404 and "no longer stored" in r.json()["message"]


def test_viewers_download_and_other_projects_are_forbidden(c: Coordinator, produced: dict[str, Any]) -> None:
    viewer = c.grpc_token("default", "viewer")
    ok = c.session(viewer).get(c.url(f"{JOBS}/dl-1/outputs/model"))
    assert ok.status_code == 200 and ok.content == produced["model"][0]
    c.run("nodus", "project", "create", "dl-other")
    outsider = c.grpc_token("dl-other", "admin")
    for path in (f"{JOBS}/dl-1/outputs/model", f"{JOBS}/dl-1/log"):
        r = c.session(outsider).get(c.url(path))
        assert r.status_code == 403, r.text
        assert r.json()["reason"] == "Forbidden" and r.json()["fix"]
    assert c.session("nodus_bad").get(c.url(f"{JOBS}/dl-1/outputs/model")).status_code == 401


def test_cli_outputs_get_and_list(c: Coordinator, produced: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "model.bin"
    out = c.run("nodus", "outputs", "get", "dl-1", "model", "--index", "1", "-o", str(target))
    assert target.read_bytes() == produced["model"][1]
    assert entry(produced["job"], "model", 1)["sha256"] in out.stderr
    listing = c.run("nodus", "outputs", "list", "dl-1").stdout
    assert "model" in listing and "outputs" in listing
    missing = c.run("nodus", "outputs", "get", "dl-1", "nope", check=False)
    assert missing.returncode == 1 and "no committed output" in missing.stderr and "fix:" in missing.stderr


# ---- logs ------------------------------------------------------------------------------------------

def append(c: Coordinator, stub: Any, attempt_id: str, offset: int, data: bytes, eof: bool = False) -> int:
    chunk = blob_pb2.LogChunk(attempt_id=attempt_id, offset=offset, data=data, eof=eof)
    return int(stub.AppendLog(iter([chunk]), metadata=agent_md(c)).size)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """A --grpc-insecure coordinator: the join token appends to any attempt's log there (no node
    certificates), so the test can be the agent of an attempt no node runs (docs/adr/0045)."""
    with Coordinator(tmp_path_factory.mktemp("plain") / "data").start(extra_args=("--grpc-insecure",)) as p:
        yield p


def test_log_follow_streams_appends_until_eof(plain: Coordinator) -> None:
    c = plain
    with c.channel() as channel:
        follow_appends(c, blob_pb2_grpc.BlobServiceStub(channel))


def follow_appends(c: Coordinator, stub: Any) -> None:
    s = c.session()
    assert s.post(c.url(JOBS), json=job("logs-1", **UNPLACEABLE)).status_code == 201
    attempt = wait_for_attempt(c, "logs-1")
    log_id = attempt["spec"]["id"]
    empty = s.get(c.url(f"{JOBS}/logs-1/log"))
    assert empty.status_code == 200 and empty.content == b""
    assert empty.headers["Content-Type"].startswith("text/plain")
    assert empty.headers["X-Nodus-Attempt"] == log_id

    got: list[bytes] = []
    first = threading.Event()

    def follow() -> None:
        with c.session().get(c.url(f"{JOBS}/logs-1/log"), params={"index": 0, "follow": "true"},
                             stream=True, timeout=60) as r:
            assert r.status_code == 200
            for data in r.iter_content(None):
                got.append(data)
                first.set()

    reader = threading.Thread(target=follow)
    reader.start()
    lines = [f"step {i}: loss {1 / (i + 1):.3f}\n".encode() for i in range(20)]

    def writer() -> None:  # the agent's side, from another thread
        offset = append(c, stub, log_id, 0, lines[0])
        assert first.wait(15), "the follower receives what was appended"
        for line in lines[1:]:
            offset = append(c, stub, log_id, offset, line)
            assert append(c, stub, log_id, offset - len(line), line) == offset, "a resent chunk adds nothing"
        append(c, stub, log_id, offset, b"", eof=True)

    writing = threading.Thread(target=writer)
    writing.start()
    writing.join(30)
    reader.join(30)
    assert not reader.is_alive(), "the follower ends at eof"
    assert b"".join(got) == b"".join(lines)
    again = s.get(c.url(f"{JOBS}/logs-1/log"), params={"index": 0, "attempt": attempt["spec"]["number"]})
    assert again.content == b"".join(lines)


def test_logs_of_a_running_job_followed_live(c: Coordinator, agent: AgentProcess, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import sys, time, pathlib\nprint('first line', flush=True)\n"
            "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.02)\n"
            "for i in range(3): print('line', i, flush=True)\n")
    assert c.session().post(c.url(JOBS), json=job("logs-live", command=[sys.executable, "-c", code, str(go)])) \
        .status_code == 201
    out = tmp_path / "follow.out"
    with following(c, "logs-live", out) as follower:
        deadline = time.monotonic() + 60
        while b"first line" not in out.read_bytes():
            assert follower.poll() is None, follower.stderr.read() if follower.stderr else ""
            assert time.monotonic() < deadline, "the follower never saw the first line"
            time.sleep(0.05)
        go.touch()  # the rest is printed only now: the follower is live, not replaying a finished log
        assert follower.wait(60) == 0
    assert out.read_text() == "first line\nline 0\nline 1\nline 2\n"
    wait_for_phase(c, "logs-live")
    assert c.run("nodus", "logs", "logs-live").stdout == "first line\nline 0\nline 1\nline 2\n"


def test_log_errors(c: Coordinator) -> None:
    s = c.session()
    assert s.post(c.url(JOBS), json=job("logs-2", **UNPLACEABLE)).status_code == 201
    wait_for_attempt(c, "logs-2")
    r = s.get(c.url(f"{JOBS}/logs-2/log"), params={"attempt": 99})
    assert r.status_code == 404 and r.json()["details"]["kind"] == "attempts"
    assert "nodus get attempts logs-2" in r.json()["fix"]
    r = s.get(c.url(f"{JOBS}/logs-2/log"), params={"index": 5})
    assert r.status_code == 404 and "index 5" in r.json()["message"]
    assert s.get(c.url(f"{JOBS}/nobody/log")).status_code == 404
