"""Small JSON files written so that a crash leaves either the old or the new content, never half.

Temp file in the same directory, fsync, rename over the target, fsync the directory: the pattern
dstack's shim uses for its state, and what both the agent (state.json) and every attempt's
supervisor (status.json) rely on to be re-read after a kill -9.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, value: Any, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replaces `path` with `value` as JSON."""
    data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_json(path: Path) -> Any | None:
    """The file's JSON, or None when it does not exist or is unreadable (a torn write never is)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
