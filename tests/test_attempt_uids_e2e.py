"""Attempts under their own uids, end to end (ADR 0040): a real coordinator and a real root agent with
--attempt-uids, process runtime. Job A of project team-a keeps a state file and a secret; Job B of the
default project, on the same node, tries to read them, list A's directory, read A's environment,
signal and ptrace A's program: each is denied with the errno the kernel's uid rules give, and A
then finishes normally across an agent restart that re-adopts it under the same uid. A checkpoint
taken as root and restored into a later attempt belongs to that attempt's uid.

The agents' work dirs live under a 0755 directory and the programs are the host's /usr/bin/python3:
an attempt uid reaches neither pytest's 0700 tmp dirs nor this venv's interpreter under /root.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Coordinator, job
from e2e import JOBS, attempts_of, joined, patch_state, registered, suspend, units, wait_job
from agent_double import AgentProcess, reachable_dir, wait_for

from nodus.agent.uids import UidRange

RANGE = UidRange.parse("210000:1000")
"""This module's own range: agents of other modules run with --attempt-uids off (conftest.py)."""
SECRET = "NODUS-TEST-SECRET-7f3a9c"
"""A recognisable value (the suite's marker, tests/secret_scan.py): it must show up in no log or status."""
TEAM_A = "/apis/nodus.dev/v1/namespaces/team-a"


def host_python() -> str:
    """An interpreter any uid can run; the test is skipped, loudly, where there is none or we are not root."""
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: per-attempt uids need a root agent (setuid); this host's tests run unprivileged, "
                    "so the isolation between attempts is NOT tested here")
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None or subprocess.run([py, "-c", "pass"], user=RANGE.last, group=RANGE.last).returncode != 0:
        pytest.skip("LOUD SKIP: no python3 in /usr/bin that an unprivileged uid can run; attempt isolation is NOT "
                    "tested here")
    return py


@pytest.fixture
def base() -> Iterator[Path]:
    yield from reachable_dir("nodus-uids-")


@pytest.fixture
def agent(coordinator: Coordinator, base: Path) -> Iterator[AgentProcess]:
    a = AgentProcess(base / "work", coordinator.grpc, coordinator.join_token, node="uids-node",
                     extra_args=("--attempt-uids", str(RANGE)))
    with joined([a.start()], coordinator) as [started]:
        yield started


def attempt_dir(agent: AgentProcess, project: str, name: str) -> Path:
    """The attempt directory of Job project/name on the agent (read as root from its spec.json)."""
    def find() -> Path | None:
        for d in (agent.work_dir / "attempts").iterdir():
            try:
                env = json.loads((d / "run" / "spec.json").read_text())["env"]
            except (OSError, ValueError, KeyError):
                continue
            if env.get("NODUS_PROJECT") == project and env.get("NODUS_JOB") == name:
                return d
        return None
    return wait_for(find, 60, what=f"the attempt directory of {project}/{name}")


def held(agent: AgentProcess) -> dict[str, int]:
    return dict(json.loads((agent.work_dir / "uids.json").read_text())["attempts"])


A_PROGRAM = r"""
import json, os, time
state = os.environ["NODUS_STATE_DIR"]
with open(os.path.join(state, "a-state.txt"), "w") as f:
    f.write("A's state")
secret = open(os.path.join(os.environ["NODUS_SECRETS_DIR"], "a-db", "password")).read()
with open(os.environ["NODUS_PROGRESS"], "a") as f:
    f.write(json.dumps({"stage": "waiting", "units": {"completed": 1, "total": 2}}) + "\n")
while not os.path.exists(os.path.join(state, "go")):
    time.sleep(0.05)
assert open(os.path.join(state, "a-state.txt")).read() == "A's state"
assert open(os.path.join(os.environ["NODUS_SECRETS_DIR"], "a-db", "password")).read() == secret
with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "a.txt"), "w") as f:
    f.write("A finished")
print("A finished as uid", os.getuid(), flush=True)
"""

B_PROBE = r"""
import ctypes, errno, json, os, signal, sys
a_state, a_secret, a_dir, a_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def tried(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return errno.errorcode[e.errno]
seen = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "read_state": tried(lambda: open(a_state).read()),
        "read_secret": tried(lambda: open(a_secret).read()),
        "list_dir": tried(lambda: os.listdir(a_dir)),
        "read_environ": tried(lambda: open(f"/proc/{a_pid}/environ").read()),
        "kill0": tried(lambda: os.kill(a_pid, 0)),
        "sigkill": tried(lambda: os.kill(a_pid, signal.SIGKILL))}
libc = ctypes.CDLL(None, use_errno=True)
seen["ptrace"] = "allowed" if libc.ptrace(16, a_pid, None, None) == 0 else errno.errorcode[ctypes.get_errno()]
seen["caps"] = {k: v.strip() for k, v in (line.split(":", 1) for line in open("/proc/self/status")
                                          if line.startswith("Cap"))}
print("PROBE " + json.dumps(seen), flush=True)
"""


def test_an_attempt_of_one_project_cannot_read_signal_or_ptrace_another_projects(
        coordinator: Coordinator, agent: AgentProcess) -> None:
    py = host_python()
    c = coordinator
    c.run("nodus", "project", "create", "team-a")
    s = c.session()
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "a-db"},
              "stringData": {"password": SECRET}}
    assert s.post(c.url(f"{TEAM_A}/secrets"), json=secret).status_code == 201
    assert s.post(c.url(f"{TEAM_A}/jobs"), json=job("a-job", command=[py, "-c", A_PROGRAM],
                                                    secrets=[{"name": "a-db"}])).status_code == 201
    a_dir = attempt_dir(agent, "team-a", "a-job")
    a_state, a_secret = a_dir / "state" / "a-state.txt", a_dir / "run" / "secrets" / "a-db" / "password"
    wait_for(lambda: a_state.exists(), 60, what="A's state file")
    a_status = json.loads((a_dir / "run" / "status.json").read_text())
    a_pid = int(a_status["main_pid"])

    # What A owns: its uid from the range, its directories closed to every other uid.
    uid_a = held(agent)[a_dir.name]
    assert uid_a in RANGE
    root = a_dir.stat()
    assert (root.st_uid, root.st_gid, stat.S_IMODE(root.st_mode)) == (0, uid_a, 0o1770)
    for d in ("state", "outputs", "run/tmp", "run/ready", "run/checkpoint"):
        st = (a_dir / d).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid_a, uid_a, 0o700), d
    st = a_secret.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid_a, 0o400)
    assert stat.S_IMODE(a_secret.parent.stat().st_mode) == 0o500
    with open(f"/proc/{a_pid}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert uids == [str(uid_a)] * 4  # real, effective, saved, filesystem

    # B, of another project on the same node, tries everything against A.
    probe = job("b-probe", command=[py, "-c", B_PROBE, str(a_state), str(a_secret), str(a_dir), str(a_pid)])
    assert s.post(c.url(JOBS), json=probe).status_code == 201
    b = wait_job(c, "b-probe", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), what="B's probe")
    assert b["status"]["phase"] == "Succeeded", b["status"]
    out = c.run("nodus", "logs", "b-probe").stdout
    seen: dict[str, Any] = json.loads(next(ln for ln in out.splitlines() if ln.startswith("PROBE "))[6:])
    assert seen["uid"] in RANGE and seen["uid"] != uid_a and seen["gid"] == seen["uid"] and seen["groups"] == []
    assert {k: seen[k] for k in ("read_state", "read_secret", "list_dir", "read_environ")} == {
        "read_state": "EACCES", "read_secret": "EACCES", "list_dir": "EACCES", "read_environ": "EACCES"}
    assert (seen["kill0"], seen["sigkill"], seen["ptrace"]) == ("EPERM", "EPERM", "EPERM")
    assert {k: int(v, 16) for k, v in seen["caps"].items() if k != "CapBnd"} == {
        "CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapAmb": 0}, seen["caps"]
    assert os.path.exists(f"/proc/{a_pid}")  # B's SIGKILL did nothing

    # An agent restart re-adopts A under the same uid; then A finishes normally.
    assert agent.stop()
    agent.start()
    registered(agent)
    assert held(agent)[a_dir.name] == uid_a and os.path.exists(f"/proc/{a_pid}")
    (a_dir / "state" / "go").touch()

    def a_ended() -> dict[str, Any] | None:
        j = s.get(c.url(f"{TEAM_A}/jobs/a-job")).json()
        return j if (j.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
    a = wait_for(a_ended, 90, what="A to finish")
    assert a["status"]["phase"] == "Succeeded", a["status"]
    assert units(a) >= 1
    assert f"A finished as uid {uid_a}" in c.run("nodus", "-n", "team-a", "logs", "a-job").stdout
    assert SECRET not in json.dumps(a["status"]) and SECRET not in agent.log()

    # Both ended and acknowledged: their directories go, and their uids with them.
    wait_for(lambda: held(agent) == {}, 60, what="the attempts' uids to be released")


COUNTER = r"""
import json, os, sys, time
path = os.path.join(os.environ["NODUS_STATE_DIR"], "counter")
extra = os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "extra.txt")  # a checkpoint path outside state/
n = int(open(path).read()) if os.path.exists(path) else 0
owners = [os.stat(p).st_uid if os.path.exists(p) else -1 for p in (path, extra)]
print("start", n, "uid", os.getuid(), "owners", *owners, flush=True)
while n < int(sys.argv[1]):
    n += 1
    for p in (path, extra):
        with open(p, "w") as f:  # in place: a restored file must be this attempt's to write
            f.write(str(n))
    with open(os.environ["NODUS_PROGRESS"], "a") as f:
        f.write(json.dumps({"stage": "count", "units": {"completed": n, "total": int(sys.argv[1])}}) + "\n")
    time.sleep(0.1)
print("reached", n, flush=True)
"""


def test_a_checkpoint_restores_into_the_next_attempts_uid(coordinator: Coordinator, agent: AgentProcess) -> None:
    py = host_python()
    c = coordinator
    body = job("uid-count", command=[py, "-c", COUNTER, "40"],
               recovery={"checkpoint": {"paths": ["/nodus/state", "/nodus/outputs/extra.txt"]}})
    assert c.session().post(c.url(JOBS), json=body).status_code == 201
    wait_job(c, "uid-count", lambda j: units(j) >= 8, what="the counter to pass 8")
    first_uid = held(agent)[attempt_dir(agent, "default", "uid-count").name]
    j = suspend(c, "uid-count")
    assert j["status"]["checkpoint"]["seq"] == 1
    patch_state(c, "uid-count", "Running")
    j = wait_job(c, "uid-count", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=90,
                 what="the resumed Job to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert j["status"]["checkpoint"]["restoredFromSeq"] == 1 and len(attempts_of(c, "uid-count")) == 2
    log = c.run("nodus", "logs", "uid-count").stdout
    start = next(ln for ln in log.splitlines() if ln.startswith("start ")).split()
    restored, uid, owners = int(start[1]), int(start[3]), [int(x) for x in start[5:7]]
    assert restored >= 8 and uid in RANGE and owners == [uid, uid] and uid != first_uid, log
    assert "reached 40" in log


ALL_REDUCE = r"""
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {world} as uid {os.getuid()}: all_reduce gave {t.item()}", flush=True)
dist.destroy_process_group()
sys.exit(0 if t.item() == world * (world + 1) / 2 else 3)
"""


def test_a_torchrun_gang_runs_under_its_members_own_uids(base: Path, tmp_path: Path) -> None:
    """Two agents on this host (disjoint ranges), a 2-node Torchrun gang: torchrun and its gloo workers run
    under each member's own uid, with the venv's torch on the host's python3 (PYTHONPATH)."""
    py = host_python()
    site = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").is_dir())
    tools = base / "bin"
    tools.mkdir()
    (tools / "torchrun").write_text(f"#!{py}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    (tools / "torchrun").chmod(0o755)
    (tools / "python3").symlink_to(py)  # torchrun's workers run sys.executable: the host's python3
    script = base / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    script.chmod(0o644)
    ranges = ("211000:100", "211100:100")
    with Coordinator(tmp_path / "data").start(extra_args=("--gang-probe-bytes", "1Mi", "--gang-probe-budget",
                                                          "10s")) as c:
        started = [AgentProcess(base / f"n{i}", c.grpc, c.join_token, node=f"uids-gang-n{i}",
                                extra_args=("--advertise-address", "127.0.0.1", "--attempt-uids", ranges[i])).start()
                   for i in range(2)]
        with joined(started, c):
            env = [{"name": "PATH", "value": f"{tools}:/usr/bin:/bin"}, {"name": "PYTHONPATH", "value": str(site)},
                   {"name": "HOME", "value": "/tmp"}]
            body = job("uids-torchrun", command=["python3", str(script)], env=env,
                       distributed={"nodes": 2, "launcher": "Torchrun"})
            assert c.session().post(c.url(JOBS), json=body).status_code == 201
            done = wait_job(c, "uids-torchrun", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"),
                            timeout=240, what="the gang to finish")
            assert done["status"]["phase"] == "Succeeded", done["status"]
            uids = []
            for rank in (0, 1):
                log = c.run("nodus", "logs", "uids-torchrun", "--rank", str(rank)).stdout
                line = next(ln for ln in log.splitlines() if f"rank {rank} of 2 as uid" in ln)
                assert line.endswith("all_reduce gave 3.0"), log
                uids.append(int(line.split("as uid ")[1].split(":")[0]))
            assert uids[0] in UidRange.parse(ranges[0]) and uids[1] in UidRange.parse(ranges[1]), uids


PRODUCE = r"""
import os
fd = os.open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "model.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b"weights " * 1000)
os.close(fd)
"""
CONSUME = r"""
import errno, os
inputs = os.environ["NODUS_INPUTS_DIR"]
data = open(os.path.join(inputs, "data"), "rb").read()
private = open(os.path.join(inputs, "ds", "private", "labels.txt"), "rb").read()  # 0600 in a 0700 dir
try:
    open(os.path.join(inputs, "data"), "ab")
    wrote = "allowed"
except OSError as e:
    wrote = errno.errorcode[e.errno]
print(f"read {len(data)} and {private.decode()} as uid {os.getuid()}, write {wrote}", flush=True)
"""


def test_inputs_with_private_modes_are_readable_by_the_consumers_uid(coordinator: Coordinator, agent: AgentProcess,
                                                                      base: Path) -> None:
    """Another Job's 0600 output file, and a Volume pushed from a 0700 directory of 0600 files, arrive as
    the consumer's inputs (the agent materializes them as root): its uid reads them, and cannot write them."""
    py = host_python()
    c = coordinator
    s = c.session()
    pushed = base / "dataset"
    (pushed / "private").mkdir(parents=True)
    (pushed / "private" / "labels.txt").write_text("labels")
    (pushed / "private" / "labels.txt").chmod(0o600)
    (pushed / "private").chmod(0o700)
    c.run("nodus", "volume", "push", "uid-ds", str(pushed))
    model = [{"name": "model", "path": "/nodus/outputs/model.bin"}]
    assert s.post(c.url(JOBS), json=job("uid-train", command=[py, "-c", PRODUCE], outputs=model)).status_code == 201
    inputs = [{"name": "data", "output": {"job": "uid-train", "name": "model"}},
              {"name": "ds", "volume": {"name": "uid-ds"}}]
    r = s.post(c.url(JOBS), json=job("uid-eval", command=[py, "-c", CONSUME], inputs=inputs, backoffLimit=0))
    assert r.status_code == 201, r.text
    done = wait_job(c, "uid-eval", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=120,
                    what="the consumer to finish")
    assert done["status"]["phase"] == "Succeeded", (done["status"].get("message"), done["status"].get("reason"))
    line = next(ln for ln in c.run("nodus", "logs", "uid-eval").stdout.splitlines() if ln.startswith("read "))
    assert line.startswith("read 8000 and labels as uid ") and line.endswith(", write EACCES"), line
    assert int(line.split("as uid ")[1].split(",")[0]) in RANGE


def test_a_program_its_uid_cannot_reach_fails_saying_why(coordinator: Coordinator, agent: AgentProcess,
                                                          base: Path) -> None:
    """A program under a directory only root may pass (as an interpreter under /root would be): exit 126,
    and the message says the attempt's uid could not reach it."""
    host_python()
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    program = closed / "train.sh"
    program.write_text("#!/bin/sh\necho never\n")
    program.chmod(0o755)
    c = coordinator
    assert c.session().post(c.url(JOBS), json=job("uid-unreachable", command=[str(program)],
                                                  backoffLimit=0)).status_code == 201
    done = wait_job(c, "uid-unreachable", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"),
                    what="the Job to fail")
    (first,) = attempts_of(c, "uid-unreachable")
    assert done["status"]["phase"] == "Failed" and first["status"]["exitCode"] == 126, first["status"]
    message = first["status"]["message"]
    assert f"command could not start: {program}: Permission denied (the attempt runs as uid " in message, message
    assert "a directory such as /root lets only its owner through" in message, message
