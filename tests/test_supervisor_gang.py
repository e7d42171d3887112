"""A gang member's supervisor: the gate, and the launch the agent opens it with (run/launch.json).

Each test starts a real `python -m nodus.agent.supervisor` on an attempt directory of its own,
without an agent: it writes spec.json (and later launch.json or cancel.json) as the agent would,
and reads what the supervisor leaves in status.json, the attempt log and the files its steps write.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from agent_double import free_port
from nodus.agent.layout import AttemptLayout
from nodus.agent.statefile import read_json, write_json
from nodus.agent.launch import GangLaunch, split_endpoint
from nodus.launchers.model import Role

PY = sys.executable
SECRET = "s3cr3t-gang-value-41c9"
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def wait_until(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Member:
    """One supervisor started on its own attempt directory, as the agent would start it."""

    def __init__(self, root: Path, *, command: list[str] | None = None, gang: bool = True,
                 **spec: Any) -> None:
        self.layout = AttemptLayout(root)
        self.layout.make()
        write_json(self.layout.spec, {
            "attempt_id": root.name, "command": command or [PY, "-c", "open('spec-command-ran', 'w')"],
            "env": {**BASE_ENV, "ONLY_IN_SPEC": "spec"}, "working_dir": str(root), "outputs": [],
            "resources": {}, "cgroups": False, "stop_grace": 2,
            **({"gang": {"epoch": 1, "rank": 1}} if gang else {}), **spec})
        self.proc = subprocess.Popen([PY, "-m", "nodus.agent.supervisor", str(root)], stdin=subprocess.PIPE,
                                     stdout=open(self.layout.run / "supervisor.log", "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"env": {"API_KEY": SECRET}}).encode())
        self.proc.stdin.close()

    def status(self) -> dict[str, Any]:
        return read_json(self.layout.status) or {}

    def log(self) -> str:
        return self.layout.log.read_text() if self.layout.log.exists() else ""

    def at_gate(self) -> dict[str, Any]:
        return wait_until(lambda: self.status().get("gate") == "waiting" and self.status(), 15, "the gate")

    def open_gate(self, argv: list[str], **launch: Any) -> None:
        write_json(self.layout.launch, {"launcher": "Torchrun", "rank": 1, "role": "member", "argv": argv,
                                        "env": {**BASE_ENV, "GANG_VAR": "from-launch"}, "setup": [],
                                        "teardown": [], "files": {}, "runs_command": True,
                                        "waits_for_head": False, "head": "127.0.0.1:1", "head_timeout_s": 5,
                                        **launch})

    def stop(self, reason: str = "GangDone") -> None:
        write_json(self.layout.cancel, {"phase": "CANCELLED", "reason": reason, "grace_seconds": 2})

    def final(self, timeout: float = 20) -> dict[str, Any]:
        self.proc.wait(timeout)
        status = self.status()
        assert status.get("finish_time"), status
        return status

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def member(tmp_path: Path) -> Iterator[Callable[..., Member]]:
    started: list[Member] = []

    def start(**kw: Any) -> Member:
        m = Member(tmp_path / f"member-{len(started)}", **kw)
        started.append(m)
        return m

    yield start
    for m in started:
        m.reap()


def append(trace: Path, word: str, code: int = 0) -> list[str]:
    """A step that appends `word` to `trace` and exits with `code`."""
    return ["sh", "-c", f'echo {word} >> "{trace}"; echo "{word} says hi"; exit {code}']


# -- the gate --------------------------------------------------------------------------------------
SIDECAR = ("import os, time\nprint('sidecar up', flush=True)\n"
           "open(os.environ['NODUS_READY_FILE'], 'w')\ntime.sleep(60)\n")
SHOW_ENV = ("import os, sys\n"
            "print('GANG_VAR=' + os.environ['GANG_VAR'])\n"
            "print('ONLY_IN_SPEC=' + os.environ.get('ONLY_IN_SPEC', '-'))\n"
            "print('secret ok' if os.environ['API_KEY'] == %r else 'secret missing')\n"
            "print('ready file ' + os.environ['NODUS_READY_FILE'])\n"
            "sys.exit(3)\n" % SECRET)


def test_the_gate_holds_the_member_until_launch_json_then_runs_its_argv(member: Callable[..., Member]) -> None:
    m = member(init={"command": [PY, "-c", "print('init done')"], "timeout": 30},
               sidecars=[{"name": "side", "command": [PY, "-c", SIDECAR], "env": {}, "startup_timeout": 15}])
    waiting = m.at_gate()
    assert waiting["phase"] == "STARTING_SIDECARS"  # no phase of its own: the gate is a field
    wait_until(lambda: "waiting at the gate" in m.log(), 5, "the gate's log line")
    # A command wrongly started before the gate is by now a process of the supervisor's (or has left
    # its file): only the sidecar may run.
    running = [" ".join(c.cmdline()) for c in psutil.Process(m.proc.pid).children(recursive=True)]
    assert len(running) == 1 and "sidecar up" in running[0], running
    assert m.status()["gate"] == "waiting" and m.status()["start_time"] is None
    assert not (m.layout.root / "spec-command-ran").exists()

    m.open_gate([PY, "-c", SHOW_ENV])
    end = m.final()
    assert end["gate"] == "open"
    assert (end["phase"], end["reason"], end["exit_code"]) == ("FAILED", "Error", 3)
    log = m.log()
    assert "[init] init done" in log and "[sidecar side] sidecar up" in log
    assert "GANG_VAR=from-launch" in log  # the launch's env, not the spec's ...
    assert "ONLY_IN_SPEC=-" in log
    assert "secret ok" in log  # ... with the secret env on top
    assert f"ready file {m.layout.ready / 'main'}" in log
    assert SECRET not in log
    assert not (m.layout.root / "spec-command-ran").exists()


def test_a_stop_at_the_gate_cancels_promptly(member: Callable[..., Member]) -> None:
    m = member()
    m.at_gate()
    m.stop("ScaledDown")
    end = m.final(timeout=30)  # a wait, not a measure: how prompt is bench/agent_timings.py's
    assert (end["phase"], end["reason"]) == ("CANCELLED", "ScaledDown")
    assert end["start_time"] is None and end["gate"] == "waiting"


def test_sigterm_at_the_gate_ends_the_member_lost(member: Callable[..., Member]) -> None:
    m = member()
    m.at_gate()
    m.proc.send_signal(signal.SIGTERM)
    end = m.final(timeout=5)
    assert (end["phase"], end["reason"]) == ("LOST", "Terminated")


def test_without_gang_the_command_runs_at_once_and_no_gate_is_reported(member: Callable[..., Member]) -> None:
    m = member(gang=False)
    end = m.final()
    assert (end["phase"], end["reason"]) == ("SUCCEEDED", "Completed")
    assert "gate" not in end and (m.layout.root / "spec-command-ran").exists()


def test_a_launch_for_another_rank_is_an_agent_fault(member: Callable[..., Member]) -> None:
    m = member()
    m.at_gate()
    m.open_gate([PY, "-c", "pass"], rank=0)
    end = m.final()
    assert (end["phase"], end["reason"]) == ("LOST", "AgentFault")
    assert "rank 0" in end["message"]


# -- the launch ----------------------------------------------------------------------------------------
def test_files_then_setup_in_order_then_main_then_teardown(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    hostfile = tmp_path / "launcher" / "deep" / "hostfile"
    main = ["sh", "-c", f'echo main >> "{trace}"; cat "{hostfile}"']
    m = member()
    m.at_gate()
    m.open_gate(main, setup=[append(trace, "setup1"), append(trace, "setup2")],
                teardown=[append(trace, "teardown1", 1), append(trace, "teardown2")],
                files={str(hostfile): "node-0 slots=1\nnode-1 slots=1\n"})
    end = m.final()
    # teardown1's exit 1 is only logged, never the member's result
    assert (end["phase"], end["reason"], end["exit_code"]) == ("SUCCEEDED", "Completed", 0)
    assert trace.read_text().split() == ["setup1", "setup2", "main", "teardown1", "teardown2"]
    assert hostfile.read_text() == "node-0 slots=1\nnode-1 slots=1\n"
    log = m.log()
    assert "[setup] setup2 says hi" in log and "[teardown] teardown2 says hi" in log
    assert "node-1 slots=1" in log  # main read the file the launch wrote
    assert "[nodus] teardown step 1 (sh) exited with code 1" in log


def test_a_failing_setup_fails_the_member_and_main_never_runs(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    m = member()
    m.at_gate()
    m.open_gate(append(trace, "main"), setup=[append(trace, "setup1"), append(trace, "boom", 4)],
                teardown=[append(trace, "teardown")])
    end = m.final()
    assert (end["phase"], end["reason"]) == ("FAILED", "LaunchFailed")
    assert "setup step 2 (sh) exited with code 4" in end["message"] and "boom says hi" in end["message"]
    assert end["start_time"] is None
    # teardown is armed once a launch step has started: what setup began is ended
    assert trace.read_text().split() == ["setup1", "boom", "teardown"]


RUNS_UNTIL_STOPPED = ("import signal, sys, time\n"
                      "def bye(*a):\n"
                      "    print('main got SIGTERM', flush=True)\n"
                      "    sys.exit(143)\n"
                      "signal.signal(signal.SIGTERM, bye)\n"
                      "print('main up', flush=True)\n"
                      "while True: time.sleep(0.05)\n")


def test_teardown_runs_after_a_stop(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    m = member()
    m.at_gate()
    m.open_gate([PY, "-c", RUNS_UNTIL_STOPPED], teardown=[append(trace, "teardown")])
    wait_until(lambda: "main up" in m.log(), 15, "the main step")
    assert m.status()["phase"] == "RUNNING"
    m.stop("Preempted")
    end = m.final()
    assert (end["phase"], end["reason"]) == ("CANCELLED", "Preempted")
    assert trace.read_text().split() == ["teardown"]
    log = m.log()
    assert log.index("main got SIGTERM") < log.index("[teardown] teardown says hi")


# -- waiting for the head -----------------------------------------------------------------------------
def test_a_worker_waits_for_the_head_to_listen(member: Callable[..., Member], tmp_path: Path) -> None:
    port = free_port()
    opened: list[float] = []
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def open_later() -> None:
        time.sleep(1.0)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        opened.append(time.time())

    started = tmp_path / "started"
    m = member()
    m.at_gate()
    opener = threading.Thread(target=open_later, daemon=True)
    opener.start()
    m.open_gate([PY, "-c", f"import time; open({str(started)!r}, 'w').write(repr(time.time()))"],
                waits_for_head=True, head=f"127.0.0.1:{port}", head_timeout_s=15)
    try:
        end = m.final()
    finally:
        opener.join()
        listener.close()
    assert (end["phase"], end["reason"]) == ("SUCCEEDED", "Completed")
    assert float(started.read_text()) >= opened[0]
    assert f"the gang's head at 127.0.0.1:{port} accepts connections" in m.log()


def test_a_head_that_never_listens_loses_the_member(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    port = free_port()
    m = member()
    m.at_gate()
    m.open_gate(append(trace, "main"), setup=[append(trace, "setup")], teardown=[append(trace, "teardown")],
                waits_for_head=True, head=f"127.0.0.1:{port}", head_timeout_s=1)
    end = m.final()
    assert (end["phase"], end["reason"]) == ("LOST", "RendezvousTimeout")
    assert f"127.0.0.1:{port} did not accept connections within 1s" in end["message"]
    assert not trace.exists()  # nothing of the launch ran: no setup, no main, nothing to tear down


# -- a member that runs no command (a Ray worker) ------------------------------------------------------
def test_a_service_that_exits_by_itself_loses_the_member(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    m = member()
    m.at_gate()
    m.open_gate([PY, "-c", "print('worker lost the head'); raise SystemExit(0)"], role="worker",
                runs_command=False, teardown=[append(trace, "teardown")])
    end = m.final()
    assert (end["phase"], end["reason"], end["exit_code"]) == ("LOST", "GangMemberExited", 0)
    assert "exited on its own with code 0" in end["message"] and "worker lost the head" in end["message"]
    assert trace.read_text().split() == ["teardown"]


def test_a_stopped_service_ends_with_the_stops_reason(member: Callable[..., Member], tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    m = member()
    m.at_gate()
    m.open_gate([PY, "-c", RUNS_UNTIL_STOPPED], role="worker", runs_command=False,
                teardown=[append(trace, "teardown")])
    wait_until(lambda: "main up" in m.log(), 15, "the service")
    m.stop("GangCompleted")
    end = m.final()
    assert (end["phase"], end["reason"]) == ("CANCELLED", "GangCompleted")
    assert trace.read_text().split() == ["teardown"]


# -- the launch.json value -----------------------------------------------------------------------------
def test_launch_json_parses_into_a_launch() -> None:
    gl = GangLaunch.parse({"launcher": "Ray", "rank": 2, "role": "worker", "argv": ["ray", "start"],
                           "env": {"A": "1"}, "setup": [["a"], ["b", "c"]], "teardown": [["ray", "stop"]],
                           "files": {"/x/y": "z"}, "runs_command": False, "waits_for_head": True,
                           "head": "[fd00::1]:6379", "head_timeout_s": 900})
    assert gl.launch.role is Role.WORKER and gl.launch.setup == (("a",), ("b", "c"))
    assert gl.launch.steps == (("a",), ("b", "c"), ("ray", "start"), ("ray", "stop"))
    assert (gl.head, gl.head_timeout_s) == ("[fd00::1]:6379", 900)
    assert split_endpoint("[fd00::1]:6379") == ("fd00::1", 6379)
    assert split_endpoint("head.example:29500") == ("head.example", 29500)
    for bad in ({"rank": 0}, {"launcher": "X", "rank": 0, "role": "member", "argv": "python"},
                {"launcher": "X", "rank": 0, "role": "member", "argv": ["p"], "files": {"rel/path": ""}},
                {"launcher": "X", "rank": 0, "role": "member", "argv": ["p"], "waits_for_head": True,
                 "head": "nohost"}):
        with pytest.raises(ValueError):
            GangLaunch.parse(bad)


def test_launch_json_round_trips_what_the_agent_writes() -> None:
    from nodus.launchers.model import Launch, Role
    launch = Launch("Torchrun", 1, Role.MEMBER, ("torchrun", "--nnodes", "2"), {"MASTER_PORT": "29500"},
                    setup=(("true",),), files={"/tmp/x": "y"}, waits_for_head=True)
    gl = GangLaunch(launch, "10.0.0.1:29500", 900)
    assert GangLaunch.parse(gl.to_json()) == gl


def test_the_rendezvous_reservation_holds_the_port_and_refuses_connections() -> None:
    """A worker waits for rank 0's head by connecting to the rendezvous port: the agent's reservation of
    that port must not answer in the head's place, yet nobody else may bind it meanwhile."""
    from nodus.agent.gang import _reserve

    held = _reserve("127.0.0.1", listen=False)
    try:
        port = held.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("0.0.0.0", port))
    finally:
        held.close()
    probe = _reserve("127.0.0.1")
    try:
        socket.create_connection(("127.0.0.1", probe.getsockname()[1]), timeout=2).close()  # it listens
    finally:
        probe.close()
