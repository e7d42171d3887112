"""The agent's snapshot and restore of an attempt's state: handshake, freeze and SIGSTOP holds, the
copy released before compression, and restores that verify before they write."""
from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

import pytest

from agent_double import wait_for
import zstandard

from nodus.agent.cgroups import Cgroup
from nodus.agent import checkpointing
from nodus.agent.checkpointing import (HANDSHAKE_TIMEOUT, CheckpointFailed, Hold, handshake_env, physical, restore,
                                       take)
from nodus.agent.layout import AttemptLayout

HANDSHAKE = r"""
import json, os, signal, sys, time
state = sys.argv[1]
def on_request(*_):
    seq = json.load(open(os.environ["NODUS_CHECKPOINT_REQUEST"]))["seq"]
    with open(os.path.join(state, "model.bin"), "w") as f:
        f.write(f"consistent at {seq}")
    with open(os.environ["NODUS_CHECKPOINT_DONE"], "w") as f:
        f.write(str(seq))
signal.signal(signal.SIGUSR1, on_request)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""

SLEEPER = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01)\n"

# Rewrites its parts in place without pause, non-atomically (truncate, then write): a copy taken
# while it runs sees parts of different rounds, half-written ones, and changes under its feet.
WRITER = r"""
import os, signal, sys
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # opted in, but never answers the handshake
state, n = sys.argv[1], 0
def round_():
    for i in range(8):
        with open(os.path.join(state, f"part-{i}"), "w") as f:
            f.write(str(n) * 512)
round_()
print("ready", flush=True)
while True:
    n += 1
    round_()
"""


def parts(state: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(state.glob("part-*"))}


def watched_copy(monkeypatch: pytest.MonkeyPatch, state: Path) -> dict[str, dict[str, bytes]]:
    """Wraps the agent's local copy: records the parts as the held program left them, and fails if
    any of them moves during the copy or in a window after it (the writer rewrites them in ~1 ms)."""
    seen: dict[str, dict[str, bytes]] = {}
    real = checkpointing.copy_tree

    def copy_tree(src: Path, dst: Path) -> None:
        seen["held"] = parts(state)
        real(src, dst)
        window = time.monotonic() + 0.3
        while time.monotonic() < window:
            assert parts(state) == seen["held"], "the program moved while held for the copy"
    monkeypatch.setattr(checkpointing, "copy_tree", copy_tree)
    return seen


def archived(snap_archive: Path, sha256: str, tmp_path: Path) -> dict[str, bytes]:
    target = attempt(tmp_path, "restored")
    restore(target, snap_archive, sha256)
    return parts(target.state)


def attempt(tmp_path: Path, name: str = "a") -> AttemptLayout:
    layout = AttemptLayout(tmp_path / name)
    for d in (layout.state, layout.run):
        d.mkdir(parents=True, exist_ok=True)
    return layout


def spawn(code: str, layout: AttemptLayout, *args: str, preexec=None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **handshake_env(layout)}
    handshake_dir = Path(env["NODUS_CHECKPOINT_REQUEST"]).parent
    handshake_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            start_new_session=True, preexec_fn=preexec)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def state_of(proc: subprocess.Popen[bytes]) -> str:
    return Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].split()[0]


def test_physical_paths_map_the_contract_into_the_attempt(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    assert physical(layout, "/nodus/state") == layout.state
    assert physical(layout, "/nodus/state/sub/") == layout.state / "sub"
    assert physical(layout, "/data/ckpt") == Path("/data/ckpt")


def test_a_program_that_opted_in_gets_the_handshake(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    (layout.state / "model.bin").write_text("torn")
    proc = spawn(HANDSHAKE, layout, str(layout.state))
    try:
        snap = take(layout, 7, ["/nodus/state"], opted_in=True, main_pid=proc.pid, cgroup=None)
    finally:
        proc.kill()
        proc.wait()
    assert snap.method == "handshake" and snap.seq == 7 and snap.paths == ("/nodus/state",)
    assert hashlib.sha256(snap.archive.read_bytes()).hexdigest() == snap.sha256
    assert snap.size == snap.archive.stat().st_size and snap.pause > 0  # its length: bench/agent_timings.py
    assert not list(layout.run.glob("checkpoint-*.d")), "the local copy is gone once archived"
    assert not Path(handshake_env(layout)["NODUS_CHECKPOINT_REQUEST"]).exists(), "released"
    target = attempt(tmp_path, "b")
    restore(target, snap.archive, snap.sha256, snap.size)
    assert (target.state / "model.bin").read_text() == "consistent at 7"


def test_a_program_that_does_not_answer_is_held_anyway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = attempt(tmp_path)
    seen = watched_copy(monkeypatch, layout.state)
    proc = spawn(WRITER, layout, str(layout.state))
    try:
        snap = take(layout, 1, ["/nodus/state"], opted_in=True, main_pid=proc.pid, cgroup=None,
                    handshake_timeout=0.2)
        assert snap.method == "sigstop"
        # released before compression and upload: it writes again
        wait_for(lambda: parts(layout.state) != seen["held"], 10, what="the writer to move after the copy")
    finally:
        proc.kill()
        proc.wait()
    assert len(seen["held"]) == 8
    assert archived(snap.archive, snap.sha256, tmp_path) == seen["held"], "the archive is what was held"


class SteppedClock:
    """The agent's two clocks, moved only by the hold's own pauses: a deadline passes without being waited out."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_767_225_600.0, 1000.0
        self.on_sleep: list[Callable[[], None]] = []

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds
        for hook in self.on_sleep:
            hook()


def test_the_handshake_deadline_passes_on_the_agents_clock(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    clock = SteppedClock()
    proc = spawn(WRITER, layout, str(layout.state))  # opted in, never answers
    try:
        hold = Hold(layout, 3, opted_in=True, main_pid=proc.pid, cgroup=None, clock=clock, sleep=clock.sleep)
        hold.acquire()
        assert hold.method == "sigstop", "no answer by the deadline: held by SIGSTOP instead"
        assert clock.mono >= 1000.0 + HANDSHAKE_TIMEOUT, "the deadline is the agent clock's"
        assert not Path(handshake_env(layout)["NODUS_CHECKPOINT_REQUEST"]).exists(), "the request is withdrawn"
        wait_for(lambda: state_of(proc) == "T", 10, what="the program to be stopped")
        assert hold.release() >= HANDSHAKE_TIMEOUT, "the pause is measured on the agent's clock"
        wait_for(lambda: state_of(proc) != "T", 10, what="the program to continue")
    finally:
        proc.kill()
        proc.wait()


class FreezingV1(Cgroup):
    """A cgroup v1 freezer as the kernel shows it: FREEZING after the write, until every task stops
    (here: until `stuck` of the hold's pauses have passed; -1 never)."""

    def __init__(self, root: Path, clock: SteppedClock, stuck: int) -> None:
        super().__init__(1, {"freezer": root})
        root.mkdir(parents=True, exist_ok=True)
        self.state, self.pauses = root / "freezer.state", 0
        self.state.write_text("THAWED\n")

        def kernel() -> None:
            self.pauses += 1
            if stuck < 0 or self.pauses < stuck:
                self.state.write_text("FREEZING\n")
        clock.on_sleep.append(kernel)

    def freeze(self, frozen: bool = True) -> bool:
        self.state.write_text("FREEZING\n" if frozen else "THAWED\n")
        return True


def test_a_v1_freeze_is_waited_for_until_the_kernel_says_frozen(tmp_path: Path) -> None:
    clock = SteppedClock()
    cgroup = FreezingV1(tmp_path / "freezer", clock, stuck=5)
    hold = Hold(attempt(tmp_path), 1, opted_in=False, main_pid=None, cgroup=cgroup, clock=clock, sleep=clock.sleep)
    hold.acquire()
    assert hold.method == "freeze" and cgroup.state.read_text().strip() == "FROZEN"
    assert cgroup.pauses >= 5, "the copy must not start while the cgroup still reads FREEZING"


def test_a_freeze_that_never_completes_thaws_and_fails_the_checkpoint(tmp_path: Path) -> None:
    clock = SteppedClock()
    cgroup = FreezingV1(tmp_path / "freezer", clock, stuck=-1)
    hold = Hold(attempt(tmp_path), 1, opted_in=False, main_pid=None, cgroup=cgroup, clock=clock, sleep=clock.sleep)
    with pytest.raises(CheckpointFailed, match="did not freeze"):
        hold.acquire()
    assert cgroup.state.read_text().strip() == "THAWED", "a failed hold leaves the program running"
    assert hold.method == "none"


def test_an_answer_within_the_deadline_ends_the_handshake_at_the_agents_time(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    clock = SteppedClock()
    done = Path(handshake_env(layout)["NODUS_CHECKPOINT_DONE"])

    def answer_at_12s() -> None:  # the program answers 12 s (of the agent's clock) after the request
        if clock.mono >= 1012.0 and not done.exists():
            done.write_text("5")
    clock.on_sleep.append(answer_at_12s)
    proc = spawn(WRITER, layout, str(layout.state))
    try:
        hold = Hold(layout, 5, opted_in=True, main_pid=proc.pid, cgroup=None, clock=clock, sleep=clock.sleep)
        hold.acquire()
        assert hold.method == "handshake" and state_of(proc) != "T", "answered: not stopped"
        pause = hold.release()
    finally:
        proc.kill()
        proc.wait()
    assert 12.0 <= pause < 12.5, f"the pause is the agent clock's 12 s, not the real one ({pause})"
    assert not done.exists(), "released: the answer is cleared for the next request"


def test_the_cgroup_freezer_holds_the_attempt_for_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = Cgroup.create("nodus-tests", f"ckpt-{os.getpid()}")
    if not cg.usable or ("freezer" not in cg.paths and "unified" not in cg.paths):
        cg.remove()
        pytest.skip("no cgroup freezer here")
    layout = attempt(tmp_path)
    seen = watched_copy(monkeypatch, layout.state)
    proc = spawn(WRITER, layout, str(layout.state), preexec=lambda: cg.attach())
    try:
        snap = take(layout, 2, ["/nodus/state"], opted_in=False, main_pid=proc.pid, cgroup=cg)
        assert snap.method == "freeze"
        wait_for(lambda: parts(layout.state) != seen["held"], 10, what="the writer to move after the copy")
        if "freezer" in cg.paths:
            assert (cg.paths["freezer"] / "freezer.state").read_text().strip() == "THAWED"
    finally:
        proc.kill()
        proc.wait()
        cg.kill_all()
        cg.remove()
    assert len(seen["held"]) == 8
    assert archived(snap.archive, snap.sha256, tmp_path) == seen["held"], "the archive is what was held"


def test_a_missing_path_fails_the_checkpoint_with_a_reason(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    with pytest.raises(CheckpointFailed, match="does not exist"):
        take(layout, 1, ["/nodus/nothing-here"], opted_in=False, main_pid=None, cgroup=None)
    with pytest.raises(CheckpointFailed, match="ArchiveTooLarge"):
        (layout.state / "big").write_bytes(os.urandom(1 << 16))
        take(layout, 2, ["/nodus/state"], opted_in=False, main_pid=None, cgroup=None, max_size=1024)
    assert not list(layout.run.glob("checkpoint-*")), "nothing half-made is left"


def _archive(tmp_path: Path, members: list[tuple[str, bytes]]) -> tuple[Path, str]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "crafted.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_restore_verifies_the_digest_before_writing_anything(tmp_path: Path) -> None:
    path, sha = _archive(tmp_path, [("nodus/state/x", b"1")])
    layout = attempt(tmp_path)
    with pytest.raises(CheckpointFailed, match="DigestMismatch"):
        restore(layout, path, "0" * 64)
    assert not (layout.state / "x").exists()
    restore(layout, path, sha)
    assert (layout.state / "x").read_bytes() == b"1"


@pytest.mark.parametrize("member", ["../escape", "nodus/state/../../escape", "/etc/evil", "elsewhere/file", "zzz/file"])
def test_restore_refuses_archives_that_leave_the_attempt(tmp_path: Path, member: str) -> None:
    path, sha = _archive(tmp_path, [("nodus/state/ok", b"ok"), (member, b"evil")])
    layout = attempt(tmp_path)
    with pytest.raises(CheckpointFailed):
        restore(layout, path, sha)
    assert not (tmp_path / "escape").exists() and not (layout.state / "ok").exists()


HELPER = r"""
import os, sys, time
from nodus import handshake
state = sys.argv[1]
n = 0
def save(seq):
    with open(os.path.join(state, "saved"), "w") as f:
        f.write(f"{seq}:{n}")
def tick():
    with open(os.path.join(state, "live.tmp"), "w") as f:
        f.write(str(n))
    os.replace(os.path.join(state, "live.tmp"), os.path.join(state, "live"))
tick()  # the state exists before any checkpoint can be asked for
assert handshake.on_checkpoint(save)
print("ready", flush=True)
while True:
    n += 1
    tick()
    time.sleep(0.001)
"""


def test_the_program_side_helper_answers_and_holds_until_the_copy_is_done(tmp_path: Path) -> None:
    layout = attempt(tmp_path)
    proc = spawn(HELPER, layout, str(layout.state))
    try:
        snap = take(layout, 4, ["/nodus/state"], opted_in=True, main_pid=proc.pid, cgroup=None)
        assert snap.method == "handshake"
        # released after the copy: the program goes on counting from where it was held
        held = int((layout.state / "live").read_text() or 0)
        wait_for(lambda: int((layout.state / "live").read_text() or 0) > held, 10, what="the program to go on")
    finally:
        proc.kill()
        proc.wait()
    target = attempt(tmp_path, "b")
    restore(target, snap.archive, snap.sha256)
    seq, at = (target.state / "saved").read_text().split(":")
    assert seq == "4"
    # Held from the answer until the copy ended: the copy saw the state as saved.
    live = int((target.state / "live").read_text())
    assert live in (int(at), int(at) - 1)  # the signal may land between the count and its write


def test_the_helper_does_nothing_outside_an_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodus import handshake
    monkeypatch.delenv("NODUS_CHECKPOINT_REQUEST", raising=False)
    assert handshake.on_checkpoint(lambda seq: None) is False


# -- integration HFTrainer / Auto: where Trainer resumes ----------------------------------------------

class _Blobs:
    def __init__(self, archive: Path) -> None:
        self.archive = archive

    async def get(self, attempt_id: str, sha256: str, dest: Path) -> None:  # as BlobClient.get: names its attempt
        dest.write_bytes(self.archive.read_bytes())


def _trainer_checkpoint(d: Path, step: int, *, complete: bool) -> None:
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "optimizer.pt").write_bytes(b"adam")
    if complete:  # Trainer writes trainer_state.json last
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def _restore_trainer_state(tmp_path: Path, integration: int, env: dict[str, str] | None = None):
    from nodus.agent import recovery
    from nodus.v1 import agent_pb2

    source = attempt(tmp_path, "old")
    _trainer_checkpoint(source.state / "out" / "checkpoint-100", 100, complete=True)
    _trainer_checkpoint(source.state / "out" / "checkpoint-200", 200, complete=False)  # killed mid-save
    snap = take(source, 3, ["/nodus/state"], opted_in=False, main_pid=None, cgroup=None)
    a = agent_pb2.Assignment(attempt_id="att-2", env=env or {},
                             checkpoint=agent_pb2.CheckpointPolicy(paths=["/nodus/state"], integration=integration),
                             restore_from=agent_pb2.CheckpointRef(seq=3, sha256=snap.sha256, size_bytes=snap.size))
    layout = attempt(tmp_path, "new")
    seq = asyncio.run(recovery.restore_before_start(_Blobs(snap.archive), None, a, layout))  # type: ignore[arg-type]
    assert seq == 3 and (layout.state / "out" / "checkpoint-200" / "optimizer.pt").exists()
    return a, layout


@pytest.mark.parametrize("integration", ["CHECKPOINT_INTEGRATION_HF_TRAINER", "CHECKPOINT_INTEGRATION_AUTO"])
def test_trainer_resumes_from_the_newest_complete_checkpoint(tmp_path: Path, integration: str) -> None:
    from nodus.v1 import agent_pb2

    a, layout = _restore_trainer_state(tmp_path, getattr(agent_pb2, integration))
    assert a.env["NODUS_RESUME_FROM"] == str(layout.state / "out" / "checkpoint-100")


def test_integration_none_passes_no_resume_path(tmp_path: Path) -> None:
    from nodus.v1 import agent_pb2

    a, _ = _restore_trainer_state(tmp_path, agent_pb2.CHECKPOINT_INTEGRATION_NONE)
    assert "NODUS_RESUME_FROM" not in a.env


def test_the_customers_own_resume_path_wins(tmp_path: Path) -> None:
    from nodus.v1 import agent_pb2

    a, _ = _restore_trainer_state(tmp_path, agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER,
                                  env={"NODUS_RESUME_FROM": "/mine"})
    assert a.env["NODUS_RESUME_FROM"] == "/mine"


def test_the_resume_path_reaches_the_supervisors_environment(tmp_path: Path) -> None:
    """The daemon writes the supervisor's spec from the Assignment after restore_before_start returns."""
    from nodus.agent.runtime.process import attempt_env
    from nodus.v1 import agent_pb2

    a, layout = _restore_trainer_state(tmp_path, agent_pb2.CHECKPOINT_INTEGRATION_HF_TRAINER)
    env = attempt_env(a, layout, {})
    assert env["NODUS_RESUME_FROM"] == str(layout.state / "out" / "checkpoint-100")
