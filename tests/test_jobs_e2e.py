"""Issue 3's "Done when", end to end: a real `nodus-coordinator` and a real `nodus-agent` process, driven
through the REST API and the `nodus` CLI the way a customer drives them.

One coordinator and one agent serve the whole module; every test uses Job names of its own. Commands
are tiny Python programs that leave marker files (pids, starts) in the test's tmp dir, so a test can
tell what really ran and that nothing is left running. Every wait polls with a bounded deadline.
"""
from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import orjson
import psutil
import pytest

from conftest import Coordinator
from e2e import ENDED, JOBS, attempts_of, create, following, patch_state, settled, start_agent, status, wait_status
from httpsfiles import HttpsFiles
from agent_double import AgentProcess, free_port, wait_for

PY = sys.executable

WAIT_FOR_GO = r"""
import os, sys, time
from pathlib import Path
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()} {os.environ['NODUS_ATTEMPT_NUMBER']}\n")
print("waiting", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print("went", flush=True)
"""
"""argv: MARKER GO. Appends `pid attempt-number` to MARKER, then waits until GO exists."""


# -- fixtures ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsFiles]:
    with HttpsFiles(tmp_path_factory.mktemp("https")) as server:
        (server.root / "data.txt").write_bytes(b"the input's content\n")
        yield server


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    return shared_coordinator


@pytest.fixture(scope="module")
def agent(c: Coordinator, files: HttpsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with start_agent(c, tmp_path_factory.mktemp("agent") / "work", "jobs-e2e",
                     extra_args=("--input-ca-file", str(files.ca))) as a:
        yield a


# -- helpers -----------------------------------------------------------------------------------------------------

def pids(marker: Path) -> list[int]:
    return [int(line.split()[0]) for line in marker.read_text().splitlines()] if marker.exists() else []


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_gone(pid: int, what: str = "the command") -> None:
    # The supervisor kills before it reports the end, so this should already hold; a short bound
    # only absorbs the reap.
    wait_for(lambda: gone(pid), 5, what=f"{what} (pid {pid}) to be gone")


def parse(t: str) -> float:
    from nodus.coordinator.clock import parse as parse_time
    return float(parse_time(t))


# -- the tests ---------------------------------------------------------------------------------------------------

INDEXED = r"""
import os, time
from nodus import progress
i = int(os.environ["NODUS_INDEX"])
assert os.environ["JOB_COMPLETION_INDEX"] == str(i)
for k in range(1, 5):
    progress.report(stage="work", completed=k, total=4)
    time.sleep(0.1)
with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "result.txt"), "w") as f:
    f.write(f"index {i}\n")
"""


def test_indexed_job_never_runs_more_than_parallelism_at_once(c: Coordinator, agent: AgentProcess) -> None:
    create(c, "e2e-indexed", command=[PY, "-c", INDEXED], completions=4, parallelism=2, backoffLimit=0)
    st = settled(c, "e2e-indexed", 90)
    assert st["phase"] == "Succeeded", st
    assert st["completedIndexes"] == "0-3" and st["succeeded"] == 4 and st.get("failed", 0) == 0
    attempts = attempts_of(c, "e2e-indexed")
    assert [(a["spec"]["index"], a["spec"]["number"]) for a in attempts] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert all(a["status"]["phase"] == "Succeeded" and a["status"]["exitCode"] == 0 and
               a["spec"]["node"] == "jobs-e2e" for a in attempts)
    # Never more than two at once, from the Attempts' own start and finish times (a finish and a start at
    # the same instant count as one ending before the other begins).
    events = sorted([(parse(a["status"]["startTime"]), 1) for a in attempts] +
                    [(parse(a["status"]["finishTime"]), -1) for a in attempts])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert 1 <= peak <= 2, f"never more than spec.parallelism at once: {events}"
    listed = c.run("nodus", "get", "attempts", "e2e-indexed").stdout
    assert listed.count("Succeeded") == 4, listed


FAILING = r"""
for n in range(1, 6):
    print(f"customer line {n}", flush=True)
raise SystemExit(3)
"""


def test_customer_failures_back_off_then_fail_with_the_last_log_lines(c: Coordinator, agent: AgentProcess) -> None:
    create(c, "e2e-backoff", command=[PY, "-c", FAILING], backoffLimit=1)
    st = settled(c, "e2e-backoff")
    assert st["phase"] == "Failed" and st["reason"] == "BackoffLimitExceeded", st
    assert st["failed"] == 2 and st["fix"]
    assert "exit code 3" in st["message"], st["message"]
    assert st["message"].endswith("customer line 3\ncustomer line 4\ncustomer line 5"), st["message"]
    assert "customer line 2" not in st["message"], "at most three log lines"
    attempts = attempts_of(c, "e2e-backoff")
    assert [(a["spec"]["number"], a["status"]["phase"], a["status"]["exitCode"]) for a in attempts] == \
        [(1, "Failed", 3), (2, "Failed", 3)]


def test_timeout_fails_the_job_and_kills_the_command(c: Coordinator, agent: AgentProcess, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    create(c, "e2e-timeout", command=[PY, "-c", WAIT_FOR_GO, str(marker), str(tmp_path / "never")], timeout="2s")
    wait_for(marker.exists, 30, what="the command to start")
    st = settled(c, "e2e-timeout", 30)
    assert st["phase"] == "Failed" and st["reason"] == "DeadlineExceeded", st
    assert st.get("failed", 0) == 0
    assert parse(st["timeoutTime"]) - parse(st["timeoutStartTime"]) == pytest.approx(2)
    assert_gone(pids(marker)[0])


def test_suspend_stops_the_attempt_and_resume_runs_a_new_one(c: Coordinator, agent: AgentProcess,
                                                             tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    create(c, "e2e-suspend", command=[PY, "-c", WAIT_FOR_GO, str(marker), str(go)])
    wait_status(c, "e2e-suspend", lambda s: s.get("phase") == "Running", 30, "Running")
    wait_for(marker.exists, 30, what="the command to start")
    patch_state(c, "e2e-suspend", "Suspended")
    st = wait_status(c, "e2e-suspend", lambda s: s.get("phase") == "Suspended" and not s.get("active"), 30,
                     "Suspended with nothing active")
    assert st["reason"] == "Suspended"
    first = attempts_of(c, "e2e-suspend")[0]
    assert first["status"]["phase"] == "Cancelled" and first["status"]["reason"] == "Suspended", first["status"]
    assert_gone(pids(marker)[0], "the suspended attempt's command")
    patch_state(c, "e2e-suspend", "Running")
    wait_for(lambda: len(pids(marker)) == 2, 30, what="a new attempt to start")
    go.touch()
    st = settled(c, "e2e-suspend")
    assert st["phase"] == "Succeeded" and st.get("failed", 0) == 0 and st["suspendedDuration"], st
    assert [ln.split()[1] for ln in marker.read_text().splitlines()] == ["1", "2"]
    assert [a["status"]["phase"] for a in attempts_of(c, "e2e-suspend")] == ["Cancelled", "Succeeded"]


def test_cancel_stops_the_job_for_good(c: Coordinator, agent: AgentProcess, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    create(c, "e2e-cancel", command=[PY, "-c", WAIT_FOR_GO, str(marker), str(tmp_path / "never")])
    wait_for(marker.exists, 30, what="the command to start")
    patch_state(c, "e2e-cancel", "Cancelled")
    st = settled(c, "e2e-cancel", 30)
    assert st["phase"] == "Cancelled" and st["reason"] == "Cancelled" and st.get("failed", 0) == 0, st
    assert_gone(pids(marker)[0])
    assert [a["status"]["phase"] for a in attempts_of(c, "e2e-cancel")] == ["Cancelled"]
    assert len(pids(marker)) == 1, "nothing ran again"


def test_ttl_deletes_the_finished_job(c: Coordinator, agent: AgentProcess) -> None:
    create(c, "e2e-no-ttl", command=[PY, "-c", "print('stay')"])
    assert settled(c, "e2e-no-ttl")["phase"] == "Succeeded"
    rv = c.session().get(c.url(JOBS)).json()["metadata"]["resourceVersion"]
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        with c.session().get(c.url(JOBS), params={"watch": "true", "resourceVersion": rv,
                                                  "fieldSelector": "metadata.name=e2e-ttl",
                                                  "timeoutSeconds": "60"}, stream=True) as resp:
            for line in resp.iter_lines():
                if line:
                    seen.append(orjson.loads(line))
                    if seen[-1]["type"] == "DELETED":
                        return

    watcher = threading.Thread(target=watch)
    watcher.start()
    create(c, "e2e-ttl", ttlSecondsAfterFinished=1, command=[PY, "-c", "print('bye')"])
    watcher.join(70)
    # Deleted, and only once it had finished: the watch saw it Succeeded (with a completionTime) first.
    assert [e["type"] for e in seen][-1:] == ["DELETED"], seen
    finished = [e for e in seen if (e["object"].get("status") or {}).get("phase") == "Succeeded"]
    assert finished and finished[0] is not seen[-1], [e["type"] for e in seen]
    assert finished[0]["object"]["status"].get("completionTime"), finished[0]
    wait_for(lambda: not attempts_of(c, "e2e-ttl"), 30, what="the TTL'd Job's Attempts to be deleted")
    # A finished Job without the TTL stays.
    assert c.session().get(c.url(f"{JOBS}/e2e-no-ttl")).status_code == 200
    c.session().delete(c.url(f"{JOBS}/e2e-no-ttl"))


# Each sidecar records, when told to stop, whether the main command had finished by then.
SIDECAR_HTTP = r"""
import functools, http.server, os, signal, sys
pid_file, port, www, done, stopped = sys.argv[1:6]
open(pid_file, "w").write(str(os.getpid()))
def stop(*_):
    open(stopped, "w").write("after main" if os.path.exists(done) else "before main")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=www)
http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), handler).serve_forever(poll_interval=0.05)
"""
SIDECAR_SECOND = r"""
import os, signal, sys, time, urllib.request
pid_file, port, done, stopped, ready = sys.argv[1:6]
open(pid_file, "w").write(str(os.getpid()))
def stop(*_):
    open(stopped, "w").write("after main" if os.path.exists(done) else "before main")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
# Started only once the first sidecar is ready: its server answers right away.
urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5).read()
print("second sees the first", flush=True)
open(ready, "w").close()
open(os.environ["NODUS_READY_FILE"], "w").close()
while True:
    time.sleep(0.05)
"""
MAIN_FETCHES = r"""
import os, sys, urllib.request
port, ready, done = sys.argv[1:4]
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5).read().decode().strip())
print("main sees the second ready" if os.path.exists(ready) else "main started before the second was ready")
open(done, "w").close()
"""


def test_sidecars_start_in_order_are_ready_first_and_stop_after(c: Coordinator, agent: AgentProcess,
                                                                tmp_path: Path) -> None:
    port = free_port()
    www = tmp_path / "www"
    www.mkdir()
    (www / "hello.txt").write_text("hello from the sidecar\n")
    first_pid, second_pid = tmp_path / "first.pid", tmp_path / "second.pid"
    first_stop, second_stop = tmp_path / "first.stop", tmp_path / "second.stop"
    ready, done = tmp_path / "second.ready", tmp_path / "main.done"
    create(c, "e2e-sidecars", backoffLimit=0, command=[PY, "-c", MAIN_FETCHES, str(port), str(ready), str(done)],
           sidecars=[
        {"name": "web", "command": [PY, "-c", SIDECAR_HTTP, str(first_pid), str(port), str(www), str(done),
                                    str(first_stop)], "startupTimeout": "30s"},
        {"name": "second", "command": [PY, "-c", SIDECAR_SECOND, str(second_pid), str(port), str(done),
                                       str(second_stop), str(ready)], "startupTimeout": "30s"}])
    st = settled(c, "e2e-sidecars")
    assert st["phase"] == "Succeeded", st
    log = c.run("nodus", "logs", "e2e-sidecars").stdout
    assert "hello from the sidecar" in log, log                          # the first was ready before main
    assert "[sidecar second] second sees the first" in log, log          # ... and before the second
    assert "main sees the second ready" in log, log                      # the second was ready before main
    for pid_file, stop_file in ((first_pid, first_stop), (second_pid, second_stop)):
        assert_gone(int(pid_file.read_text()), f"sidecar {pid_file.stem}")
        assert stop_file.read_text() == "after main", stop_file.stem     # stopped after main, by SIGTERM


def test_a_failing_init_command_fails_the_job_naming_it(c: Coordinator, agent: AgentProcess,
                                                        tmp_path: Path) -> None:
    ran = tmp_path / "main-ran"
    create(c, "e2e-init", backoffLimit=0, command=[PY, "-c", f"open({str(ran)!r}, 'w')"],
           initCommand={"command": [PY, "-c", "import sys; print('preflight: no GPU driver', flush=True); "
                                             "sys.exit(4)"]})
    st = settled(c, "e2e-init")
    assert st["phase"] == "Failed", st
    attempt = attempts_of(c, "e2e-init")[0]["status"]
    assert attempt["phase"] == "Failed" and attempt["reason"] == "InitFailed", attempt
    assert "preflight: no GPU driver" in attempt["message"] and "preflight: no GPU driver" in st["message"], st
    assert not ran.exists(), "the main command never starts after a failed init"


def test_url_inputs_are_checked_against_their_sha256(c: Coordinator, agent: AgentProcess,
                                                     files: HttpsFiles) -> None:
    content = (files.root / "data.txt").read_bytes()
    good = hashlib.sha256(content).hexdigest()
    read = "import os; print(open(os.path.join(os.environ['NODUS_INPUTS_DIR'], 'data')).read().strip())"
    create(c, "e2e-input-ok", backoffLimit=0, command=[PY, "-c", read],
           inputs=[{"name": "data", "url": {"url": f"{files.url}/data.txt", "sha256": good}}])
    bad = "0" * 64
    create(c, "e2e-input-bad", backoffLimit=0, command=[PY, "-c", "print('must not run')"],
           inputs=[{"name": "data", "url": {"url": f"{files.url}/data.txt", "sha256": bad}}])
    ok = settled(c, "e2e-input-ok")
    assert ok["phase"] == "Succeeded" and ok.get("inputsReadyTime"), ok
    assert "the input's content" in c.run("nodus", "logs", "e2e-input-ok").stdout
    st = settled(c, "e2e-input-bad")
    assert st["phase"] == "Failed", st
    attempt = attempts_of(c, "e2e-input-bad")[0]["status"]
    assert attempt["phase"] == "Failed" and attempt["reason"] == "InputFailed", attempt
    for text in (attempt["message"], st["message"]):
        assert "data" in text and bad in text and good in text, text
    assert "must not run" not in c.run("nodus", "logs", "e2e-input-bad", check=False).stdout


PRODUCES = r"""
import os, time
from nodus import progress
out = os.environ["NODUS_OUTPUTS_DIR"]
open(os.path.join(out, "metrics.json"), "w").write('{"accuracy": 0.93}\n')
open(os.path.join(os.environ["NODUS_STATE_DIR"], "model.bin"), "wb").write(os.urandom(200_000))
for k in range(1, 21):
    progress.report(stage="train", completed=k, total=20)
    time.sleep(0.1)
"""


def test_outputs_download_with_matching_sha256_and_progress_shows_in_status(
        c: Coordinator, agent: AgentProcess, tmp_path: Path) -> None:
    create(c, "e2e-outputs", backoffLimit=0, command=[PY, "-c", PRODUCES],
           outputs=[{"name": "model", "path": "/nodus/state/model.bin"}])
    seen = wait_status(c, "e2e-outputs", lambda s: ((s.get("progress") or {}).get("units") or {}).get("completed")
                       and s.get("phase") == "Running", 60, "progress while Running")
    assert seen["progress"]["units"]["total"] == 20 and seen["progress"]["stage"] == "train"
    st = settled(c, "e2e-outputs")
    assert st["phase"] == "Succeeded", st
    assert st["progress"]["units"] == {"completed": 20, "total": 20}
    committed = {o["name"]: o for o in st["outputs"] if o["index"] == 0}
    assert set(committed) == {"model", "outputs"}
    for name, entry in committed.items():
        dest = tmp_path / f"{name}.download"
        c.run("nodus", "outputs", "get", "e2e-outputs", name, "-o", str(dest))
        data = dest.read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size"], name


LIVE = r"""
import sys, time
from pathlib import Path
print("first line", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.02)
for i in range(3):
    print("line", i, flush=True)
    time.sleep(0.2)
"""


def test_logs_follow_a_running_job_live_and_exit_at_its_end(c: Coordinator, agent: AgentProcess,
                                                            tmp_path: Path) -> None:
    go = tmp_path / "go"
    create(c, "e2e-follow", command=[PY, "-c", LIVE, str(go)])
    out = tmp_path / "follow.out"
    with following(c, "e2e-follow", out) as follower:
        wait_for(lambda: b"first line" in out.read_bytes() or follower.poll() is not None, 60,
                 what="the follower to print the first line")
        assert follower.poll() is None, follower.stderr.read() if follower.stderr else ""
        # The command cannot end before `go` exists: this line arrived while the Job runs.
        assert status(c, "e2e-follow").get("phase") not in ENDED
        go.touch()
        wait_for(lambda: b"line 0" in out.read_bytes(), 30, what="a line printed after the follow began")
        assert follower.wait(60) == 0
    assert out.read_text() == "first line\nline 0\nline 1\nline 2\n"
    assert status(c, "e2e-follow").get("phase") == "Succeeded"
