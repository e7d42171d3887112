"""Take part in the checkpoint handshake from inside a Nodus attempt: `from nodus import handshake`.

    handshake.on_checkpoint(lambda seq: save_model(os.environ["NODUS_STATE_DIR"]))

Opt in with `NODUS_CHECKPOINT_SIGNAL=1` in the Job's env. Before a snapshot the agent writes the
request file ($NODUS_CHECKPOINT_REQUEST, `{"seq": N}`) and sends SIGUSR1; the handler installed here
calls `save(N)` (write a consistent state under $NODUS_STATE_DIR), answers by writing N to
$NODUS_CHECKPOINT_DONE, and then holds the program until the agent has copied the state (it removes
the request file), so nothing changes the state mid-copy. Compression and upload happen after the
program continues. A program that never answers is frozen for the copy instead (ADR 0012). Outside an
attempt (the variables unset) this does nothing, so the same program runs anywhere.
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

OPT_IN_ENV = "NODUS_CHECKPOINT_SIGNAL"
"""Set to 1 in a Job's env: the program answers a checkpoint request (SIGUSR1 and the request file)."""
REQUEST_ENV = "NODUS_CHECKPOINT_REQUEST"
DONE_ENV = "NODUS_CHECKPOINT_DONE"
LISTENER = "listener"
"""Written beside the request file by a helper that polls it between steps (nodus.hf): the agent then
asks through the file alone, without the opt-in variable and without SIGUSR1."""
RESUME_FROM_ENV = "NODUS_RESUME_FROM"
"""Integration Auto/HFTrainer: the newest complete `checkpoint-N` the agent restored."""


def on_checkpoint(save: Callable[[int], Any], *, hold_timeout: float = 300.0) -> bool:
    """Installs the SIGUSR1 handler; returns False outside a Nodus attempt."""
    request, done = os.environ.get(REQUEST_ENV), os.environ.get(DONE_ENV)
    if not request or not done:
        return False

    def handler(signum: int, frame: Any) -> None:
        seq = requested(request)
        if seq is None:
            return  # a stale signal: no request pending
        save(seq)
        answer(request, done, seq, hold_timeout)

    signal.signal(signal.SIGUSR1, handler)
    return True


def requested(request: str) -> int | None:
    """The seq the agent asks for in the request file; None when no request is waiting (the agent
    removes the file when it has its copy, or gives up)."""
    try:
        with open(request) as f:
            return int(json.load(f)["seq"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def answer(request: str, done: str, seq: int, hold_timeout: float) -> None:
    """Writes the answer for `seq`, then holds until the agent has copied the state paths (it removes
    the request file) or `hold_timeout` passes: the copy sees the state as saved."""
    tmp = f"{done}.tmp"
    with open(tmp, "w") as f:
        f.write(str(seq))
    os.replace(tmp, done)
    deadline = time.monotonic() + hold_timeout
    while os.path.exists(request) and time.monotonic() < deadline:
        time.sleep(0.005)
