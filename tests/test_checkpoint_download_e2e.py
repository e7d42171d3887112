"""A Job's checkpoints out of Nodus, through the daemons and the installed CLI: `nodus checkpoint ls
--job` lists what the coordinator keeps for an index, and `nodus checkpoint get` downloads one
(verified against the committed sha256) to a file or restores it into a directory, as it was when
the program was held for it. The REST routes behind them answer missing checkpoints with the fix."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Coordinator
from e2e import JOBS, attempts_of, create, patch_state, start_agent, suspend, units, wait_job
from agent_double import AgentProcess

# Counts in $NODUS_STATE_DIR/counter beside 1 MiB of random weights; the marker records the weights'
# digest, so the test can tell the restored bytes are the program's.
PROGRAM = r"""
import hashlib, os, signal, sys, time
from nodus import progress
state = os.environ["NODUS_STATE_DIR"]
weights = os.path.join(state, "model", "weights.bin")
if not os.path.exists(weights):
    os.makedirs(os.path.dirname(weights), exist_ok=True)
    with open(weights, "wb") as f:
        f.write(os.urandom(1 << 20))
with open(sys.argv[1], "w") as f:
    f.write(hashlib.sha256(open(weights, "rb").read()).hexdigest())
path = os.path.join(state, "counter")
n = int(open(path).read()) if os.path.exists(path) else 0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while n < 10_000:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    progress.report(stage="count", completed=n, total=10_000)
    time.sleep(0.1)
"""


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path) -> Iterator[AgentProcess]:
    with start_agent(coordinator, tmp_path / "agent", "dl-node") as a:
        yield a


def test_a_jobs_checkpoint_is_listed_downloaded_and_restored(coordinator: Coordinator, agent: AgentProcess,
                                                            tmp_path: Path) -> None:
    c, marker = coordinator, tmp_path / "weights.sha256"
    create(c, "keeper", command=[sys.executable, "-c", PROGRAM, str(marker)])
    wait_job(c, "keeper", lambda j: units(j) >= 5, what="the counter to pass 5")
    j = suspend(c, "keeper")
    [record] = attempts_of(c, "keeper")[0]["status"]["checkpoints"]
    assert j["status"]["checkpoint"]["seq"] == record["seq"]

    table = c.run("nodus", "checkpoint", "ls", "--job", "keeper").stdout.splitlines()
    assert table[0].split() == ["SEQ", "TIME", "SIZE", "REASON", "FORMAT", "ATTEMPT", "STORED"]
    assert table[1].split()[0] == str(record["seq"]) and table[1].split()[3:] == ["Suspend", "Snapshot", "1", "nodus"]

    # Into a directory: the state as it was when the program was held.
    into = tmp_path / "restored"
    out = c.run("nodus", "checkpoint", "get", "keeper", "--into", str(into))
    assert f"restored checkpoint {record['seq']} of job keeper" in out.stdout and "sha256 verified" in out.stdout
    state = into / "nodus" / "state"
    weights = (state / "model" / "weights.bin").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == marker.read_text()
    assert 5 <= int((state / "counter").read_text()) <= units(j)

    # As the archive file, byte for byte what was committed.
    archive = tmp_path / "keeper.tar.zst"
    c.run("nodus", "checkpoint", "get", "keeper", "--seq", str(record["seq"]), "-o", str(archive))
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == record["sha256"]
    assert "ok" in c.run("nodus", "checkpoint", "verify", str(archive), "--sha256", record["sha256"]).stdout

    missing = c.run("nodus", "checkpoint", "get", "keeper", "--seq", "99", "-o", str(tmp_path / "x"), check=False)
    assert missing.returncode == 1
    assert 'job "keeper" has no committed checkpoint 99 for index 0' in missing.stderr
    assert "nodus checkpoint ls --job keeper" in missing.stderr, missing.stderr
    assert not (tmp_path / "x").exists()

    # The routes themselves, as any HTTP client sees them.
    listed = c.session().get(c.url(f"{JOBS}/keeper/checkpoints"), params={"index": 0})
    assert listed.status_code == 200 and listed.json()["kind"] == "CheckpointList"
    assert [i["seq"] for i in listed.json()["items"]] == [record["seq"]]
    bad = c.session().get(c.url(f"{JOBS}/keeper/checkpoints/latest"))
    assert bad.status_code == 400 and bad.json()["kind"] == "Status", bad.text
    assert "is not a sequence number" in json.dumps(bad.json())
    patch_state(c, "keeper", "Cancelled")
