"""A Job never starts without its inputs, end to end: a real coordinator and a real agent, over REST.

What must hold (docs/adr/0037): a consumer of another Job's output stays Pending with reason
WaitingForInput and a message naming the producer and the output, with no attempt created, while
the producer runs; once the producer commits the output the consumer runs with exactly those bytes.
A consumer whose producer does not exist, or ended without that output, fails with InputFailed
naming the input and the producer, and its program never runs."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Iterator

import pytest

from agent_double import AgentProcess
from conftest import Coordinator
from e2e import attempts_of, create, ended, start_agent, wait_status

PRODUCE = r"""
import os, sys, time
from pathlib import Path
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
Path(os.environ["NODUS_OUTPUTS_DIR"], "model.bin").write_bytes(b"weights " * 1000)
"""

CONSUME = r"""
import os, sys
from pathlib import Path
data = Path(os.environ["NODUS_INPUTS_DIR"], "data").read_bytes()
Path(sys.argv[1]).write_bytes(data)
"""

MODEL = [{"name": "model", "path": "/nodus/outputs/model.bin"}]


@pytest.fixture(scope="module")
def agent(shared_coordinator: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(shared_coordinator, tmp_path_factory.mktemp("agent"), "inputs-node") as a:
        yield a


def test_a_consumer_waits_for_its_producer_then_runs_with_its_output(shared_coordinator: Coordinator,
                                                                     agent: AgentProcess, tmp_path: Path) -> None:
    c = shared_coordinator
    go, seen = tmp_path / "go", tmp_path / "seen"
    create(c, "train", command=[sys.executable, "-c", PRODUCE, str(go)], outputs=MODEL)
    wait_status(c, "train", lambda s: s.get("phase") == "Running", what="the producer to run")
    create(c, "eval", command=[sys.executable, "-c", CONSUME, str(seen)],
           inputs=[{"name": "data", "output": {"job": "train", "name": "model"}}])
    st = wait_status(c, "eval", lambda s: s.get("reason") == "WaitingForInput", what="the consumer to wait")
    assert st["phase"] == "Pending" and st["message"] == "input data: waiting for output model of Job train", st
    ready = next(x for x in st["conditions"] if x["type"] == "InputsReady")
    assert (ready["status"], ready["reason"]) == ("False", "WaitingForInput")
    assert attempts_of(c, "eval") == [], "no attempt exists while the input is not committed"

    go.touch()
    done = ended(c, "eval", timeout=120)["status"]
    assert done["phase"] == "Succeeded", done
    produced = next(o for o in ended(c, "train")["status"]["outputs"] if o["name"] == "model")
    assert seen.read_bytes() == b"weights " * 1000, "the consumer read the producer's bytes"
    assert hashlib.sha256(seen.read_bytes()).hexdigest() == produced["sha256"]
    assert done["inputs"] == [{"name": "data", "sha256": produced["sha256"]}], "status.inputs has the verified digest"
    assert next(x for x in done["conditions"] if x["type"] == "InputsReady")["status"] == "True"


def test_a_missing_producer_fails_the_consumer_before_anything_runs(shared_coordinator: Coordinator,
                                                                    agent: AgentProcess, tmp_path: Path) -> None:
    c = shared_coordinator
    seen = tmp_path / "seen"
    create(c, "orphan", command=[sys.executable, "-c", CONSUME, str(seen)],
           inputs=[{"name": "data", "output": {"job": "no-such-job", "name": "model"}}])
    st = ended(c, "orphan", timeout=60)["status"]
    assert st["phase"] == "Failed" and st["reason"] == "InputFailed", st
    assert "input data: Job no-such-job (spec.inputs[0].output.job) does not exist" in st["message"]
    assert attempts_of(c, "orphan") == [] and not seen.exists(), "the program never ran"


def test_a_producer_that_ended_without_the_output_fails_the_consumer(shared_coordinator: Coordinator,
                                                                     agent: AgentProcess, tmp_path: Path) -> None:
    c = shared_coordinator
    seen = tmp_path / "seen"
    # It declares the output, but a failing program commits none.
    create(c, "broken", command=[sys.executable, "-c", "raise SystemExit(3)"], outputs=MODEL, backoffLimit=0)
    create(c, "after-broken", command=[sys.executable, "-c", CONSUME, str(seen)],
           inputs=[{"name": "data", "output": {"job": "broken", "name": "model"}}])
    assert ended(c, "broken")["status"]["phase"] == "Failed"
    st = ended(c, "after-broken", timeout=60)["status"]
    assert st["phase"] == "Failed" and st["reason"] == "InputFailed", st
    assert st["message"] == "input data: Job broken ended Failed without committing its output model", st
    assert attempts_of(c, "after-broken") == [] and not seen.exists()


PRODUCE_TREE = r"""
import os
from pathlib import Path
root = Path(os.environ["NODUS_OUTPUTS_DIR"], "ckpt")
(root / "shards" / "deep").mkdir(parents=True)
(root / "config.json").write_text('{"layers": 2}')
(root / "shards" / "0.bin").write_bytes(b"zero" * 500)
(root / "shards" / "deep" / "1.bin").write_bytes(b"one" * 700)
"""

LIST_TREE = r"""
import json, os, sys
from pathlib import Path
root = Path(os.environ["NODUS_INPUTS_DIR"], sys.argv[2])
seen = {"is_dir": root.is_dir(), "files": {}}
if root.is_dir():
    for p in sorted(root.rglob("*")):
        if p.is_file():
            seen["files"][p.relative_to(root).as_posix()] = p.read_bytes().decode()
Path(sys.argv[1]).write_text(json.dumps(seen))
"""

TREE = {"config.json": '{"layers": 2}', "shards/0.bin": "zero" * 500, "shards/deep/1.bin": "one" * 700}


def test_a_directory_output_reaches_its_consumer_as_that_directory(shared_coordinator: Coordinator,
                                                                   agent: AgentProcess, tmp_path: Path) -> None:
    import json
    c = shared_coordinator
    create(c, "tree-producer", command=[sys.executable, "-c", PRODUCE_TREE],
           outputs=[{"name": "ckpt", "path": "/nodus/outputs/ckpt"}])
    produced = ended(c, "tree-producer", timeout=120)["status"]
    assert produced["phase"] == "Succeeded", produced
    by_name = {o["name"]: o for o in produced["outputs"]}
    assert by_name["ckpt"].get("directory") is True, "status.outputs says the output is a directory"
    assert by_name["outputs"].get("directory") is True, "the default outputs directory is one too"

    for i, wanted in enumerate(("ckpt", "outputs")):
        seen = tmp_path / f"seen-{i}"
        create(c, f"tree-consumer-{i}", command=[sys.executable, "-c", LIST_TREE, str(seen), "data"],
               inputs=[{"name": "data", "output": {"job": "tree-producer", "name": wanted}}])
        done = ended(c, f"tree-consumer-{i}", timeout=120)["status"]
        assert done["phase"] == "Succeeded", done
        got = json.loads(seen.read_text())
        assert got["is_dir"], f"input {wanted} is a directory at $NODUS_INPUTS_DIR/data, not an archive file"
        expected = TREE if wanted == "ckpt" else {f"ckpt/{k}": v for k, v in TREE.items()}
        assert got["files"] == expected, got
        assert done["inputs"] == [{"name": "data", "sha256": by_name[wanted]["sha256"]}]
