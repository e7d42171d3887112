"""Report progress from inside a Nodus attempt: `from nodus import progress`.

    progress.report(stage="train", completed=120, total=1000, metrics={"loss": 0.81})
    progress.report(step=500, totalSteps=10_000, tokensPerSecond=41_200.5, gpuMemoryBytes=71 << 30)

Each call appends one JSON line to $NODUS_PROGRESS, which the node agent follows and forwards to
the coordinator (status.progress). Outside an attempt ($NODUS_PROGRESS unset) it does nothing, so
the same program runs anywhere. Writes are single appends, so lines from several processes of one
attempt never interleave mid-line.
"""
from __future__ import annotations

import json
import os
from decimal import Decimal
from typing import Any, Mapping

TRAINING_KEYS = ("step", "totalSteps", "tokensPerSecond", "gpuMemoryBytes")
_ALIASES = {"total_steps": "totalSteps", "tokens_per_second": "tokensPerSecond", "gpu_memory_bytes": "gpuMemoryBytes"}


def _metric(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def report(stage: str | None = None, completed: int | None = None, total: int | None = None,
           metrics: Mapping[str, Any] | None = None, **training: Any) -> bool:
    """Appends one progress line; returns False (and does nothing) outside an attempt.

    `training` takes step, totalSteps, tokensPerSecond and gpuMemoryBytes (snake_case accepted).
    """
    path = os.environ.get("NODUS_PROGRESS")
    if not path:
        return False
    line: dict[str, Any] = {}
    if stage is not None:
        line["stage"] = str(stage)
    if completed is not None or total is not None:
        units: dict[str, int] = {}
        if completed is not None:
            units["completed"] = int(completed)
        if total is not None:
            units["total"] = int(total)
        line["units"] = units
    if metrics:
        line["metrics"] = {str(k): _metric(v) for k, v in metrics.items()}
    for key, value in training.items():
        key = _ALIASES.get(key, key)
        if key not in TRAINING_KEYS:
            raise TypeError(f"report() got an unexpected keyword argument {key!r}")
        if value is None:
            continue
        line[key] = _metric(value) if key == "tokensPerSecond" else int(value)
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True
