"""The process runtime, driven through a real `nodus-agent` and observed over the wire.

One agent (and one protocol double of the coordinator) serves the module; each test runs its own
attempts and reads what came back: AttemptUpdates, Progress, the shipped log and the uploaded blobs.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import zstandard

from httpsfiles import HttpsFiles
from nodus.agent import cgroups
from agent_double import AgentProcess, FakeCoordinator, free_port, wait_for
from nodus.v1 import agent_pb2

PY = sys.executable
SECRET_ENV_VALUE = "s3cr3t-env-value-7d1f"
SECRET_FILE_VALUE = b"hunter2-file-value-9c2e"


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]]:
    tmp = tmp_path_factory.mktemp("runtime")
    https = HttpsFiles(tmp)
    fake = FakeCoordinator(lease=30.0, heartbeat=0.5).start()
    agent = AgentProcess(tmp / "work", fake.address, fake.token,
                         extra_args=("--input-ca-file", str(https.ca)), env={"NODUS_LOG_LEVEL": "DEBUG"}).start()
    try:
        wait_for(fake.current, 15, what="the agent's stream")
        yield fake, agent, https, tmp
        # invariants at teardown: nothing of an attempt that ended is left running
        wait_for(lambda: not agent.leftovers(), 10, what="ended attempts to leave nothing (AgentProcess.leftovers)")
    finally:
        agent.reap()
        fake.stop()
        https.close()


def run(fake: FakeCoordinator, a: agent_pb2.Assignment, timeout: float = 30) -> agent_pb2.AttemptUpdate:
    fake.assign(a)
    end = fake.wait_final(a.attempt_id, timeout)
    wait_for(lambda: a.attempt_id in fake.log_eof, 10, what="the log's eof")
    return end


def assignment(attempt_id: str, code: str, *args: str, **fields: object) -> agent_pb2.Assignment:
    a = agent_pb2.Assignment(attempt_id=attempt_id, index=0, attempt_number=1, command=[PY, "-c", code, *args],
                             **fields)
    a.job.project, a.job.name = "default", "job-" + attempt_id
    return a


def untar(data: bytes) -> dict[str, bytes]:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as zr:
        with tarfile.open(fileobj=zr, mode="r|") as tar:
            return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar}  # type: ignore[union-attr]


def blob_of(fake: FakeCoordinator, end: agent_pb2.AttemptUpdate, name: str) -> bytes:
    out = next(o for o in end.outputs if o.name == name)
    data = fake.blobs[out.sha256]
    assert hashlib.sha256(data).hexdigest() == out.sha256 and len(data) == out.size_bytes
    assert out.uri == f"blob://sha256/{out.sha256}"
    return data


# -- the environment contract ------------------------------------------------------------------------
ENV_DUMP = r"""
import json, os, stat, sys, time
from pathlib import Path
keys = [k for k in os.environ if k.startswith(("NODUS_", "JOB_")) or k in ("FOO", "API_KEY", "HOME", "TMPDIR")]
secret = Path(os.environ["NODUS_SECRETS_DIR"]) / "db" / "password"
dump = {"env": {k: os.environ[k] for k in keys}, "cwd": os.getcwd(),
        "secret_mode": oct(stat.S_IMODE(secret.stat().st_mode)), "secret": secret.read_text(),
        "dirs": {k: os.path.isdir(os.environ[k]) for k in ("NODUS_STATE_DIR", "NODUS_INPUTS_DIR", "NODUS_OUTPUTS_DIR")}}
Path(os.environ["NODUS_OUTPUTS_DIR"], "env.json").write_text(json.dumps(dump))
print("dumped", flush=True)
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


def test_environment_contract_secrets_and_outputs(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, agent, _, tmp = env
    go = tmp / "env.go"
    a = assignment("rt-env", ENV_DUMP, str(go), env={"FOO": "bar", "NODUS_PROJECT": "from-coordinator"})
    a.index, a.attempt_number = 2, 3
    a.secret_env.add(name="API_KEY", value=SECRET_ENV_VALUE)
    a.secrets.add(name="db", version=1, data={"password": SECRET_FILE_VALUE})
    fake.assign(a)
    wait_for(lambda: "dumped" in fake.log("rt-env"), 20, what="the program to run")
    # while it runs: the secret env value is in no file the agent or the supervisor wrote, nor in the agent log
    for path in agent.work_dir.rglob("*"):
        if path.is_file() and "secrets" not in path.parts and path.name != "env.json":
            assert SECRET_ENV_VALUE.encode() not in path.read_bytes(), f"secret value found in {path}"
    assert SECRET_ENV_VALUE not in agent.log()
    go.touch()
    end = fake.wait_final("rt-env")
    assert end.phase == 9, end
    dump = json.loads(untar(blob_of(fake, end, "outputs"))["env.json"])
    e = dump["env"]
    attempt_dir = str(agent.work_dir / "attempts" / "rt-env")
    assert e["NODUS_INDEX"] == e["JOB_COMPLETION_INDEX"] == "2"
    assert e["NODUS_ATTEMPT"] == "rt-env" and e["NODUS_ATTEMPT_NUMBER"] == "3"
    assert e["NODUS_PROJECT"] == "from-coordinator", "the Assignment's env wins over the agent's fallback"
    assert e["NODUS_JOB"] == "job-rt-env" and e["FOO"] == "bar" and e["API_KEY"] == SECRET_ENV_VALUE
    assert e["NODUS_STATE_DIR"] == attempt_dir + "/state" and e["NODUS_INPUTS_DIR"] == attempt_dir + "/inputs"
    assert e["NODUS_OUTPUTS_DIR"] == attempt_dir + "/outputs"
    assert e["NODUS_PROGRESS"] == attempt_dir + "/run/progress.jsonl"
    assert e["NODUS_READY_FILE"].startswith(attempt_dir + "/run/ready/")
    assert all(dump["dirs"].values())
    assert dump["cwd"] == attempt_dir, "workingDir defaults to the attempt directory"
    assert dump["secret_mode"] == "0o400" and dump["secret"] == SECRET_FILE_VALUE.decode()
    assert SECRET_ENV_VALUE not in agent.log()


def test_working_dir_is_honoured(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, agent, _, _ = env
    end = run(fake, assignment("rt-wd", "import os; print(os.getcwd())", working_dir="/nodus/state/sub"))
    assert end.phase == 9
    assert fake.log("rt-wd").strip() == str(agent.work_dir / "attempts" / "rt-wd" / "state" / "sub")


# -- inputs ----------------------------------------------------------------------------------------
LIST_INPUTS = r"""
import os, stat
root = os.environ["NODUS_INPUTS_DIR"]
for dirpath, dirs, files in sorted(os.walk(root)):
    for f in sorted(files):
        p = os.path.join(dirpath, f)
        print(os.path.relpath(p, root), open(p).read().strip(), "writable" if os.stat(p).st_mode & 0o222 else "ro")
"""


def test_inputs_from_https_and_the_blob_store(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, https, tmp = env
    url, digest = https.publish("weights.txt", b"w=1\n")
    blob = b"plain blob\n"
    fake.blobs[hashlib.sha256(blob).hexdigest()] = blob
    src = tmp / "volume-src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("volume a\n")
    (src / "sub" / "b.txt").write_text("volume b\n")
    from nodus.agent.archive import pack_dir
    archive = tmp / "volume.tar.zst"
    vdigest, _ = pack_dir(src, archive)
    fake.blobs[vdigest] = archive.read_bytes()

    a = assignment("rt-inputs", LIST_INPUTS)
    a.inputs.add(name="weights", source=agent_pb2.Location(uri=url), sha256=digest)
    a.inputs.add(name="notes", source=agent_pb2.Location(uri=f"blob://sha256/{hashlib.sha256(blob).hexdigest()}"))
    a.inputs.add(name="dataset", source=agent_pb2.Location(uri=f"blob://sha256/{vdigest}"), archive=True)
    end = run(fake, a)
    assert end.phase == 9, end
    assert end.HasField("inputs_ready_time") and end.inputs_ready_time.ToNanoseconds() <= end.start_time.ToNanoseconds()
    assert fake.log("rt-inputs").splitlines() == [
        "notes plain blob ro", "weights w=1 ro", "dataset/a.txt volume a ro", "dataset/sub/b.txt volume b ro"]


def test_an_input_whose_digest_does_not_match_fails_the_attempt(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, https, tmp = env
    url, digest = https.publish("tampered.bin", b"what was published\n")
    wrong = hashlib.sha256(b"what was pinned").hexdigest()
    marker = tmp / "digest.marker"
    a = assignment("rt-badinput", f"open({str(marker)!r}, 'w')")
    a.inputs.add(name="model", source=agent_pb2.Location(uri=url), sha256=wrong)
    end = run(fake, a)
    assert end.phase == 10 and end.reason == "InputFailed"
    assert "input model" in end.message and wrong in end.message and digest in end.message
    assert not marker.exists(), "nothing ran"
    assert "sha256 mismatch" in fake.log("rt-badinput")


# -- init command ------------------------------------------------------------------------------------
def test_a_failing_init_command_fails_the_attempt_with_three_lines(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, tmp = env
    marker = tmp / "init.marker"
    a = assignment("rt-init", f"open({str(marker)!r}, 'w')")
    a.init_command.command.extend([PY, "-c", "import sys\nfor i in range(5): print('preflight', i)\nsys.exit(4)"])
    end = run(fake, a)
    assert end.phase == 10 and end.reason == "InitFailed"
    assert end.message.splitlines() == ["preflight 2", "preflight 3", "preflight 4"]
    assert not marker.exists(), "the main command never started"
    assert "[init] preflight 0" in fake.log("rt-init")

    slow = assignment("rt-init-slow", "print('main')")
    slow.init_command.command.extend([PY, "-c", "import time; print('waiting', flush=True); time.sleep(60)"])
    slow.init_command.timeout.FromMilliseconds(500)
    end = run(fake, slow)  # its 60 s sleep outlasts run()'s wait: only the 500 ms timeout ends it in time
    assert end.phase == 10 and end.reason == "InitFailed" and "timed out" in end.message


def test_a_passing_init_command_runs_before_the_main_command(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, tmp = env
    go = tmp / "init-ok.go"
    a = assignment("rt-init-ok", "import os; print('main sees', open(os.environ['NODUS_STATE_DIR'] + '/prepared').read())")
    # The init command holds until the test has seen INITIALIZING, so that phase cannot be coalesced away.
    a.init_command.command.extend(["sh", "-c", 'echo ready > "$NODUS_STATE_DIR/prepared"; '
                                   f'while [ ! -e {str(go)!r} ]; do sleep 0.02; done; echo prepared'])
    fake.assign(a)
    wait_for(lambda: "INITIALIZING" in fake.phases("rt-init-ok"), 30, what="INITIALIZING")
    assert "RUNNING" not in fake.phases("rt-init-ok")
    go.touch()
    end = fake.wait_final("rt-init-ok", 30)
    wait_for(lambda: "rt-init-ok" in fake.log_eof, 10, what="the log's eof")
    assert end.phase == 9
    assert fake.log("rt-init-ok") == "[init] prepared\nmain sees ready\n\n"
    phases = fake.phases("rt-init-ok")
    assert phases.index("INITIALIZING") < phases.index("SUCCEEDED")


# -- sidecars --------------------------------------------------------------------------------------
WEB = r"""
import http.server, os, signal, sys, time
os.makedirs("www", exist_ok=True)
open("www/hello.txt", "w").write("hello from the sidecar")
def bye(*a):
    print("web stopping", time.monotonic_ns(), flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("web starting", flush=True)
time.sleep(0.3)  # not ready before it listens
handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory="www", **k)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
"""
AFTER = r"""
import os, signal, sys, time, urllib.request
def bye(*a):
    print("after stopping", time.monotonic_ns(), flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, bye)
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/hello.txt").read().decode()
print("after saw", body, flush=True)
open(os.environ["NODUS_READY_FILE"], "w").close()
while True: time.sleep(0.05)
"""
MAIN_FETCH = r"""
import sys, urllib.request
print("main got", urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/hello.txt").read().decode(), flush=True)
"""


def test_sidecars_start_in_order_ready_and_stop_in_reverse(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, _ = env
    port = str(free_port())
    a = assignment("rt-sidecars", MAIN_FETCH, port)
    a.sidecars.add(name="web", command=[PY, "-c", WEB, port]).startup_timeout.FromSeconds(20)
    a.sidecars.add(name="after", command=[PY, "-c", AFTER, port]).startup_timeout.FromSeconds(20)
    end = run(fake, a)
    assert end.phase == 9, (end, fake.log("rt-sidecars"))
    lines = fake.log("rt-sidecars").splitlines()

    def at(prefix: str) -> int:
        return next(i for i, line in enumerate(lines) if line.startswith(prefix))

    assert at("[sidecar web] web starting") < at("[nodus] sidecar web is ready") < at("[sidecar after] after saw")
    assert at("[nodus] sidecar after is ready") < at("main got hello from the sidecar")
    assert at("main got") < at("[sidecar after] after stopping") < at("[sidecar web] web stopping"), lines
    assert "STARTING_SIDECARS" in fake.phases("rt-sidecars")


def test_a_sidecar_that_is_never_ready_or_dies_fails_the_attempt(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, tmp = env
    marker = tmp / "sidecar.marker"
    a = assignment("rt-sc-slow", f"open({str(marker)!r}, 'w')")
    a.sidecars.add(name="mute", command=[PY, "-c", "import time; time.sleep(60)"]).startup_timeout.FromMilliseconds(700)
    end = run(fake, a)
    assert end.phase == 10 and end.reason == "SidecarFailed" and "mute" in end.message and "0.7s" in end.message
    b = assignment("rt-sc-dies", f"open({str(marker)!r}, 'w')")
    b.sidecars.add(name="crash", command=[PY, "-c", "import sys; print('bad config'); sys.exit(2)"])
    end = run(fake, b)
    assert end.phase == 10 and end.reason == "SidecarFailed"
    assert "crash exited with code 2" in end.message and "bad config" in end.message
    assert not marker.exists()


# -- outputs, logs, progress -----------------------------------------------------------------------
WRITE_OUTPUTS = r"""
import os
s = os.environ["NODUS_STATE_DIR"]
os.makedirs(s + "/model/layers", exist_ok=True)
open(s + "/model/config.json", "w").write('{"d": 8}')
open(s + "/model/layers/0.bin", "wb").write(bytes(range(256)) * 64)
open(s + "/score.txt", "w").write("0.93\n")
open(os.environ["NODUS_OUTPUTS_DIR"] + "/summary.txt", "w").write("ok\n")
for i in range(3): print("log line", i)
"""


def test_declared_outputs_and_the_outputs_dir_are_uploaded(
        env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, _ = env
    a = assignment("rt-outputs", WRITE_OUTPUTS)
    a.outputs.add(name="model", path="/nodus/state/model")
    a.outputs.add(name="score", path="/nodus/state/score.txt")
    end = run(fake, a)
    assert end.phase == 9, end
    assert {o.name: o.path for o in end.outputs} == {"model": "/nodus/state/model", "score": "/nodus/state/score.txt",
                                                    "outputs": "/nodus/outputs"}
    model = untar(blob_of(fake, end, "model"))
    assert model["config.json"] == b'{"d": 8}' and model["layers/0.bin"] == bytes(range(256)) * 64
    assert blob_of(fake, end, "score") == b"0.93\n"
    assert untar(blob_of(fake, end, "outputs")) == {"summary.txt": b"ok\n"}
    assert fake.log("rt-outputs") == "log line 0\nlog line 1\nlog line 2\n"

    missing = assignment("rt-missing", "pass")
    missing.outputs.add(name="model", path="/nodus/state/nothing-here")
    end = run(fake, missing)
    assert end.phase == 10 and end.reason == "OutputMissing" and "/nodus/state/nothing-here" in end.message


def test_progress_is_folded_and_rate_limited(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, _ = env
    code = ("import time\nfrom nodus import progress\n"
            "for i in range(1, 151):\n"
            "    progress.report(stage='train', completed=i, total=150, metrics={'loss': round(2 / i, 4)})\n"
            "progress.report(step=7, totalSteps=10, tokensPerSecond=1234.5, gpuMemoryBytes=1 << 30)\n")
    end = run(fake, assignment("rt-progress", code))
    assert end.phase == 9
    sent = fake.progress("rt-progress")
    assert sent, "progress reached the coordinator"
    # 151 reports written back to back: folded, not one message each (the rate: bench/agent_timings.py)
    assert len(sent) < 20, f"{len(sent)} Progress messages for 151 reports: not folded"
    last = sent[-1]
    assert (last.stage, last.units_completed, last.units_total) == ("train", 150, 150)
    assert last.metrics["loss"] == str(round(2 / 150, 4))
    assert (last.step, last.total_steps, last.tokens_per_second, last.gpu_memory_bytes) == (7, 10, "1234.5", 1 << 30)
    msgs = [m for _, m in fake.messages() if m.WhichOneof("message") in ("progress", "attempt_update")
            and (m.progress.attempt_id or m.attempt_update.attempt_id) == "rt-progress"]
    assert msgs[-1].WhichOneof("message") == "attempt_update", "the last progress goes before the end"


def _memory_cgroups_work() -> str | None:
    if cgroups.version() == 0:
        return "no cgroup hierarchy"
    probe = cgroups.Cgroup.create("nodus-probe", f"p{os.getpid()}", memory_bytes=64 << 20)
    try:
        if "memory" not in probe.paths and "unified" not in probe.paths:
            return "cannot create a memory cgroup here: " + ", ".join(probe.missing)
        return None
    finally:
        probe.remove()


def test_an_oom_kill_is_reported_as_oomkilled(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    reason = _memory_cgroups_work()
    if reason:
        pytest.skip(reason)
    fake, _, _, _ = env
    a = assignment("rt-oom", "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n")
    a.resources.memory_bytes = 64 << 20
    end = run(fake, a, timeout=60)
    assert end.phase == 10 and end.reason == "OOMKilled" and end.oom_killed
    assert end.exit_code == 137


def test_a_missing_command_fails_with_exit_127(env: tuple[FakeCoordinator, AgentProcess, HttpsFiles, Path]) -> None:
    fake, _, _, _ = env
    a = assignment("rt-nocmd", "")
    a.ClearField("command")
    a.command.append("/nonexistent/program")
    end = run(fake, a)
    assert end.phase == 10 and end.reason == "Error" and end.exit_code == 127
    assert "/nonexistent/program" in end.message


# sh, not the venv's python: the venv may live where the workload user cannot reach (/root).
AS_USER = r"""
echo "uid $(id -u) gid $(id -g)"
echo "secret $(cat "$NODUS_SECRETS_DIR/db/password")"
echo "cwd is writable" > in-cwd.txt && echo "cwd writable"
printf 'from nobody' > "$NODUS_OUTPUTS_DIR/o.txt"
echo '{"stage": "as-user", "units": {"completed": 1, "total": 1}}' >> "$NODUS_PROGRESS"
for f in run/spec.json run/status.json; do
    if cat "$HOME/$f" > /dev/null 2>&1; then echo "$f readable"; else echo "$f denied"; fi
done
if mv "$HOME/run" "$HOME/stolen" 2>/dev/null; then echo "run moved"; else echo "run stays"; fi
"""


def test_attempts_run_as_the_workload_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching to the workload user needs root")
    import pwd
    import shutil
    import tempfile
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="nodus-user-"))  # pytest's tmp is 0700: the workload could not reach it
    base.chmod(0o755)
    fake = FakeCoordinator(lease=30.0, heartbeat=0.5).start()
    agent = AgentProcess(base / "work", fake.address, fake.token, extra_args=("--workload-user", "nobody")).start()
    try:
        wait_for(fake.current, 15, what="the agent's stream")
        a = assignment("rt-user", "")
        a.ClearField("command")
        a.command.extend(["sh", "-c", AS_USER])
        a.secrets.add(name="db", version=1, data={"password": b"pw"})
        end = run(fake, a)
        assert end.phase == 9, (end, fake.log("rt-user"))
        assert fake.log("rt-user").splitlines() == [
            f"uid {nobody.pw_uid} gid {nobody.pw_gid}", "secret pw", "cwd writable", "run/spec.json denied",
            "run/status.json readable", "run stays"]
        assert untar(blob_of(fake, end, "outputs")) == {"o.txt": b"from nobody"}
        assert fake.progress("rt-user")[-1].stage == "as-user"
    finally:
        agent.reap()
        fake.stop()
        shutil.rmtree(base, ignore_errors=True)
