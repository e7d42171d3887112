"""End to end: a real `nodus-coordinator` and a real `nodus-agent`, driven over REST like a customer."""
from __future__ import annotations

import hashlib
import io
import signal
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import zstandard

from conftest import Coordinator, job
from e2e import JOBS, ended, get_job, start_agent
from agent_double import AgentProcess, wait_for

INDEXED = r"""
import os, sys, time
from nodus import progress
i = int(os.environ["NODUS_INDEX"])
assert os.environ["JOB_COMPLETION_INDEX"] == str(i)
with open(sys.argv[1], "a") as f:
    f.write(f"start {i} {time.time()}\n")
for k in range(1, 4):
    progress.report(stage="work", completed=k, total=3, metrics={"index": i})
    time.sleep(0.15)
with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "result.txt"), "w") as f:
    f.write(f"index {i} of job {os.environ['NODUS_JOB']}\n")
print("done", i, flush=True)
with open(sys.argv[1], "a") as f:
    f.write(f"end {i} {time.time()}\n")
"""


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with start_agent(coordinator, tmp_path / "agent", "e2e-node") as a:
        yield a


def test_indexed_job_with_progress_outputs_and_logs(coordinator: Coordinator, agent: AgentProcess,
                                                    tmp_path: Path) -> None:
    marker = tmp_path / "timeline"
    body = job("indexed", command=[sys.executable, "-c", INDEXED, str(marker)], completions=4, parallelism=2)
    s = coordinator.session()
    assert s.post(coordinator.url(JOBS), json=body).status_code == 201
    progress_seen: list[dict[str, Any]] = []

    def done() -> dict[str, Any] | None:
        j = get_job(coordinator, "indexed")
        status = j.get("status") or {}
        if status.get("progress"):
            progress_seen.append(status["progress"])
        return j if status.get("phase") in ("Succeeded", "Failed") else None

    j = wait_for(done, 90, interval=0.1, what="the Job to finish")
    st = j["status"]
    assert st["phase"] == "Succeeded", st
    assert st["succeeded"] == 4 and st["completedIndexes"] == "0-3" and st.get("failed", 0) == 0
    assert progress_seen, "progress showed in status while the Job ran"
    assert st["progress"]["stage"] == "work" and st["progress"]["units"]["total"] >= 3

    # parallelism 2: never more than two indexes at once
    events = sorted((float(t), kind) for kind, _, t in (line.split() for line in marker.read_text().splitlines()))
    running = peak = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak <= 2 and len(events) == 8

    outputs = {o["index"]: o for o in st["outputs"] if o["name"] == "outputs"}
    assert sorted(outputs) == [0, 1, 2, 3]
    for index, out in outputs.items():
        assert len(out["sha256"]) == 64 and out["size"] > 0
        r = s.get(coordinator.url(f"{JOBS}/indexed/outputs/outputs"), params={"index": index})
        assert r.status_code == 200, r.text
        assert hashlib.sha256(r.content).hexdigest() == out["sha256"]
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(r.content)) as zr:
            with tarfile.open(fileobj=zr, mode="r|") as tar:
                files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        assert files == {"result.txt": f"index {index} of job indexed\n".encode()}
    r = s.get(coordinator.url(f"{JOBS}/indexed/log"), params={"index": 2})
    assert r.status_code == 200 and "done 2" in r.text


WAIT_FOR_GO = r"""
import sys, time
from pathlib import Path
Path(sys.argv[1]).open("a").write("started\n")
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print("finished")
"""


def test_kill9_of_the_agent_does_not_lose_or_repeat_the_work(coordinator: Coordinator, agent: AgentProcess,
                                                             tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    body = job("survivor", command=[sys.executable, "-c", WAIT_FOR_GO, str(marker), str(go)])
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_for(marker.exists, 60, what="the attempt to start")
    assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
    agent.start()
    wait_for(lambda: "re-adopted attempt" in agent.log(), 30, what="the re-adoption")
    go.touch()
    j = ended(coordinator, "survivor", 60)
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert (j["status"].get("attempts") or {}).get("total", 1) == 1
    assert marker.read_text() == "started\n", "the command ran exactly once"
