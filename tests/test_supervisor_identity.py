"""A step of the process runtime starts with vfork while its supervisor wears the attempt's identity
(supervisor/identity.py, ADR 0072): the step runs in the attempt's cgroup, with OOM score 0, as the
attempt's uid with no way back to root and no capabilities; the supervisor is itself again afterwards,
also when the step could not start. Where it could not come back, the step joins in its child instead.

Each case runs in a fresh single-threaded interpreter (pytest's own may hold threads), as root with a
writable cgroup hierarchy (tests/cgroup_root.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from cgroup_root import cgroups_unavailable, own_root

pytestmark = pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")

UID = 200_977
STEP_PYTHON = "/usr/bin/python3"
"""The steps run under UID, which cannot reach an interpreter under /root (pyenv, a venv there)."""

SCRIPT = r"""
import json, os, subprocess, sys, threading
from nodus.agent.cgroups import Cgroup
from nodus.agent.supervisor.identity import AttemptIdentity

root, argv, threaded = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
open("/proc/self/oom_score_adj", "w").write("100")  # raising needs no privilege; a step must get 0 anyway
cgroup = Cgroup.create(root, "att")
if threaded:
    threading.Thread(target=threading.Event().wait, daemon=True).start()

def me():
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    return {"uids": os.getresuid(), "gids": os.getresgid(), "groups": sorted(os.getgroups()),
            "cgroup": open("/proc/self/cgroup").read(), "oom": open("/proc/self/oom_score_adj").read().strip(),
            "caps": {k: status[k].strip() for k in ("CapPrm", "CapEff", "CapAmb")}}

before = me()
identity = AttemptIdentity.of(cgroup, {"uid": %(uid)d, "gid": %(uid)d, "groups": []})
error, step = None, ""
if identity is None:
    print(json.dumps({"identity": None}))
else:
    try:
        with identity.worn():
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                                    close_fds=True, cwd="/")
        step = proc.communicate()[0].decode()
    except OSError as e:
        error = e.strerror
    print(json.dumps({"identity": True, "before": before, "after": me(), "step": step, "error": error,
                      "members": sorted(cgroup.pids())}))
cgroup.kill_all()
cgroup.remove()
"""

STEP = ("import json, os; s = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() "
        "if ':\\t' in l); print(json.dumps({'uids': os.getresuid(), 'gids': os.getresgid(), "
        "'groups': os.getgroups(), 'oom': open('/proc/self/oom_score_adj').read().strip(), "
        "'cgroup': open('/proc/self/cgroup').read(), 'caps': {k: s[k].strip() for k in ('CapPrm', 'CapEff', 'CapAmb')}}))")


@pytest.fixture
def root() -> Iterator[str]:
    yield from own_root("nodus-test-identity")


def _run(root: str, argv: list[str], threaded: bool = False) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", SCRIPT % {"uid": UID}, root, json.dumps(argv), "1" if threaded else "0"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _in_attempt_cgroup(proc_cgroup: str, root: str) -> bool:
    return f"/{root}/att" in proc_cgroup


def test_a_step_runs_as_the_attempt_in_its_cgroup_and_the_supervisor_comes_back(root: str) -> None:
    seen = _run(root, [STEP_PYTHON, "-c", STEP])
    assert seen["identity"] and seen["error"] is None
    step = json.loads(seen["step"])
    assert step["uids"] == [UID] * 3 and step["gids"] == [UID] * 3 and step["groups"] == []
    assert step["oom"] == "0"
    assert {int(v, 16) for v in step["caps"].values()} == {0}, step["caps"]
    assert _in_attempt_cgroup(step["cgroup"], root), step["cgroup"]
    before, after = seen["before"], seen["after"]
    assert after == before, "the supervisor is not itself again after starting a step"
    assert not _in_attempt_cgroup(after["cgroup"], root)
    assert after["oom"] == "100" and after["uids"] == [0, 0, 0]


def test_the_supervisor_comes_back_when_the_step_cannot_start(root: str) -> None:
    seen = _run(root, ["/nonexistent/program"])
    assert seen["error"] and "No such file" in seen["error"]
    assert seen["after"] == seen["before"]
    assert seen["members"] == [], "the supervisor stayed in the attempt's cgroup"


def test_a_supervisor_with_a_thread_does_not_wear_it(root: str) -> None:
    """setresuid changes every thread of a process: with a second thread the step joins in its child."""
    assert _run(root, ["true"], threaded=True) == {"identity": None}


def test_a_step_that_joins_in_its_child_gets_the_same(tmp_path: Path, root: str) -> None:
    """The fallback (a `preexec_fn`, a full fork): the same cgroup, user and score as with vfork."""
    script = tmp_path / "fallback.py"
    script.write_text(
        "import sys\n"
        "from nodus.agent.cgroups import Cgroup\n"
        "from nodus.agent.clock import SystemClock\n"
        "from nodus.agent.supervisor.processes import Processes\n"
        f"procs = Processes(1, '/', {{'uid': {UID}, 'gid': {UID}, 'groups': []}}, lambda: None, SystemClock())\n"
        f"procs.cgroup = Cgroup.create({root!r}, 'att')\n"
        "procs.runtime.identity_of = procs.cgroup  # as if AttemptIdentity.of had said no\n"
        f"child = procs.spawn('main', [{STEP_PYTHON!r}, '-c', {STEP!r}], {{}}, None)\n"
        "procs.wait(30, [child])\n"
        "procs.cgroup.remove()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    step = json.loads(out.stdout.strip().splitlines()[-1])
    assert step["uids"] == [UID] * 3 and step["oom"] == "0" and _in_attempt_cgroup(step["cgroup"], root)
    assert {int(v, 16) for v in step["caps"].values()} == {0}
    assert os.geteuid() == 0
