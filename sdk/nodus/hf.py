"""Hugging Face Trainer inside a Nodus attempt: `from nodus.hf import NodusCheckpointCallback, resume_from_checkpoint`.

    trainer = Trainer(..., callbacks=[NodusCheckpointCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

The agent asks for every checkpoint through the handshake (nodus.handshake's request file). The callback turns the request into a
Trainer save at the next step end (`control.should_save`), answers once `checkpoint-N` is written
(`on_save`), and holds training until the agent has copied the state paths, so the copy sees the
checkpoint as saved. Point Trainer's `output_dir` under $NODUS_STATE_DIR. The callback announces
itself (a `listener` file beside the request file), so with integration Auto or HFTrainer the agent
asks through the request file alone, without the opt-in variable and without SIGUSR1 (which would end
a launcher such as torchrun); HFTrainer waits longer for the answer (a save takes a while). With
integration None, or before the callback is made, the program is frozen for the copy, and the newest
complete `checkpoint-N` is what resumes. One process per attempt: under a multi-process launcher each
rank sees the request at its own step end, and nothing lines the ranks' saves up yet.

After a restore the agent passes the newest complete `checkpoint-N` as $NODUS_RESUME_FROM
(Auto and HFTrainer); `resume_from_checkpoint()` returns it, or None for a first run. Outside an
attempt both do nothing. transformers is imported only when the callback is made, and is not a
dependency of Nodus.
"""
from __future__ import annotations

import os
import signal
from typing import Any

from nodus.handshake import DONE_ENV, LISTENER, REQUEST_ENV, RESUME_FROM_ENV, answer, requested



def resume_from_checkpoint() -> str | None:
    """The `checkpoint-N` directory the agent restored, for `trainer.train(resume_from_checkpoint=…)`."""
    return os.environ.get(RESUME_FROM_ENV) or None


def _base() -> type:
    try:
        from transformers import TrainerCallback  # noqa: PLC0415 - optional: only programs that train import it
    except ImportError:
        return object
    return TrainerCallback


class _Handshake:
    """The program's side of one checkpoint request: asked (SIGUSR1) → saving → answered and held."""

    def __init__(self, request: str | None, done: str | None, hold_timeout: float) -> None:
        self.request, self.done, self.hold_timeout = request, done, hold_timeout
        self.seq: int | None = None
        """The request being saved for (should_save was set for it)."""
        self.answered = 0
        """The last seq answered: a request file the agent has not removed yet is not a new request."""

    @property
    def active(self) -> bool:
        return bool(self.request and self.done)

    def announce(self) -> None:
        """Tells the agent this program answers the handshake (agent/checkpointing.py LISTENER)."""
        if not self.active:
            return
        path = os.path.join(os.path.dirname(self.request or ""), LISTENER)
        try:
            with open(f"{path}.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(f"{path}.tmp", path)
        except OSError:
            pass  # the agent freezes the program for the copy instead

    def install(self) -> bool:
        if not self.active:
            return False
        signal.signal(signal.SIGUSR1, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Trainer saves only between steps: the request file is read at the next step end. (A SIGUSR1
        sent because the Job also set NODUS_CHECKPOINT_SIGNAL=1 must not end the process.)"""

    def pending(self) -> int | None:
        """The requested seq, when a request is waiting."""
        return requested(self.request) if self.request and self.done else None

    def answer(self, seq: int) -> None:
        """Answers and holds until the agent has copied the state (nodus.handshake.answer)."""
        if self.request and self.done:
            answer(self.request, self.done, seq, self.hold_timeout)
        self.answered = seq


class NodusCheckpointCallback(_base()):  # type: ignore[misc]
    """A `transformers.TrainerCallback` that saves when the agent asks for a checkpoint.

    Duck-typed: it needs only what Trainer passes (`control.should_save`), so it also works, and is
    tested, without transformers installed."""

    def __init__(self, *, hold_timeout: float = 300.0, install: bool = True) -> None:
        super().__init__()
        self._handshake = _Handshake(os.environ.get(REQUEST_ENV), os.environ.get(DONE_ENV), hold_timeout)
        self._handshake.announce()
        self.installed = self._handshake.install() if install else False
        """Whether SIGUSR1 is handled here (False outside a Nodus attempt)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        h = self._handshake
        if h.seq is None:
            seq = h.pending()  # one failed open() a step when nothing is asked
            if seq is not None and seq != h.answered:
                h.seq = seq
                control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        h = self._handshake
        if h.seq is not None:
            seq, h.seq = h.seq, None
            if h.pending() == seq:  # still wanted: the agent did not give up and freeze meanwhile
                h.answer(seq)
        return control
