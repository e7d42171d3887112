"""nodus.hf, the program's side of integration HFTrainer: a checkpoint request becomes a Trainer save at
the next step end, answered once saved and held until the agent's copy is done; and the resume path
the agent passes after a restore. transformers is not a dependency of Nodus (the callback is duck-typed);
it is a test dependency, for the one test that needs the real class."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodus import hf
from nodus.agent.checkpointing import handshake_env, listening, restore, take
from nodus.agent.layout import AttemptLayout


@dataclass
class Control:
    """The part of transformers.TrainerControl the callback touches."""

    should_save: bool = False


def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    request, done = tmp_path / "request.json", tmp_path / "done"
    monkeypatch.setenv("NODUS_CHECKPOINT_REQUEST", str(request))
    monkeypatch.setenv("NODUS_CHECKPOINT_DONE", str(done))
    return request, done


def test_a_request_saves_at_the_next_step_end_and_is_answered_after_the_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request, done = files(tmp_path, monkeypatch)
    cb = hf.NodusCheckpointCallback(install=False, hold_timeout=10)
    control = Control()
    assert cb.on_step_end(None, None, control).should_save is False, "nothing asked"

    request.write_text(json.dumps({"seq": 5}))
    assert cb.on_step_end(None, None, control).should_save is True
    assert not done.exists(), "answered only once Trainer saved"

    saver = threading.Thread(target=cb.on_save, args=(None, None, control))
    saver.start()
    deadline = time.monotonic() + 5
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert done.read_text() == "5"
    time.sleep(0.05)
    assert saver.is_alive(), "training is held while the agent copies the state"
    request.unlink()  # the agent's copy is done
    saver.join(5)
    assert not saver.is_alive()

    control.should_save = False
    assert cb.on_step_end(None, None, control).should_save is False


def test_a_request_the_agent_gave_up_on_is_not_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request, done = files(tmp_path, monkeypatch)
    cb = hf.NodusCheckpointCallback(install=False, hold_timeout=10)
    request.write_text(json.dumps({"seq": 2}))
    control = cb.on_step_end(None, None, Control())
    request.unlink()  # no answer in time: the agent froze the program instead
    cb.on_save(None, None, control)
    assert not done.exists()


def test_outside_an_attempt_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODUS_CHECKPOINT_REQUEST", raising=False)
    monkeypatch.delenv("NODUS_CHECKPOINT_DONE", raising=False)
    monkeypatch.delenv("NODUS_RESUME_FROM", raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    cb = hf.NodusCheckpointCallback()
    assert cb.installed is False and signal.getsignal(signal.SIGUSR1) == before
    assert cb.on_step_end(None, None, Control()).should_save is False
    assert hf.resume_from_checkpoint() is None
    monkeypatch.setenv("NODUS_RESUME_FROM", "/state/out/checkpoint-100")
    assert hf.resume_from_checkpoint() == "/state/out/checkpoint-100"


TRAINER = r"""
import os, sys, time
from dataclasses import dataclass
from nodus.hf import NodusCheckpointCallback
state = sys.argv[1]

@dataclass
class Control:
    should_save: bool = False

cb = NodusCheckpointCallback(install=sys.argv[2] == "signal")
print("ready", flush=True)
step = 0
while True:  # Trainer's loop, as far as the callback sees it
    step += 1
    with open(os.path.join(state, "live"), "w") as f:
        f.write(str(step))
    control = cb.on_step_end(None, None, Control())
    if control.should_save:
        os.makedirs(os.path.join(state, f"checkpoint-{step}"))
        with open(os.path.join(state, f"checkpoint-{step}", "trainer_state.json"), "w") as f:
            f.write(str(step))
        cb.on_save(None, None, control)
    time.sleep(0.002)
"""


@pytest.mark.parametrize("how", ["signal", "poll"])
def test_the_agents_handshake_gets_a_trainer_save(tmp_path: Path, how: str) -> None:
    """With the opt-in variable the agent also sends SIGUSR1; without it, only the request file, since
    the callback said it listens (a SIGUSR1 would end a program that handles none)."""
    layout = AttemptLayout(tmp_path / "a")
    for d in (layout.state, layout.run):
        d.mkdir(parents=True)
    env = {**os.environ, **handshake_env(layout)}
    Path(env["NODUS_CHECKPOINT_REQUEST"]).parent.mkdir(parents=True)
    assert not listening(layout)
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(layout.state), how], env=env,
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        assert listening(layout)
        snap = take(layout, 9, ["/nodus/state"], opted_in=True, main_pid=proc.pid, cgroup=None,
                    send_signal=how == "signal")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert snap.method == "handshake"
    target = AttemptLayout(tmp_path / "b")
    target.run.mkdir(parents=True)
    restore(target, snap.archive, snap.sha256)
    saved = [p.name for p in target.state.glob("checkpoint-*")]
    assert len(saved) == 1
    # Held from the save until the copy ended: the copy saw the step that saved as the last one.
    assert saved[0] == f"checkpoint-{(target.state / 'live').read_text()}"


def test_the_callback_is_a_real_trainer_callback() -> None:
    import transformers

    cb = hf.NodusCheckpointCallback(install=False)
    assert isinstance(cb, transformers.TrainerCallback)
    control = transformers.TrainerControl()
    assert cb.on_step_end(None, transformers.TrainerState(), control) is control
