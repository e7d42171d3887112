"""Following $NODUS_PROGRESS: JSON lines the program appends, folded into one latest Progress.

Later lines override earlier ones field by field (metrics key by key), so a program may report its
stage in one line and its loss in the next. Lines that are not JSON objects are skipped.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from nodus.v1 import agent_pb2

MAX_READ = 1 << 20
MAX_LINE = 64 << 10


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _decimal(value: Any) -> str:
    if isinstance(value, float):
        return repr(value) if value == value else "NaN"
    return str(value)


@dataclass(slots=True)
class ProgressTail:
    path: Path
    offset: int = 0
    partial: bytes = b""
    state: dict[str, Any] = field(default_factory=dict)
    changed: bool = False

    def skip_to_tail(self) -> None:
        """After an agent restart: read only the last MAX_READ bytes (the latest lines win anyway)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size > MAX_READ:
            self.offset = size - MAX_READ
            self.partial = b""  # the first, cut line fails to parse and is skipped

    def poll(self) -> bool:
        """Reads what was appended since the last call; True when the folded progress changed."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:  # truncated or replaced: start over
                self.offset, self.partial = 0, b""
            if size == self.offset:
                return False
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, min(size - self.offset, MAX_READ))
        finally:
            os.close(fd)
        self.offset += len(data)
        buf = self.partial + data
        lines = buf.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            self.partial = b""
        changed = False
        for line in lines:
            changed |= self.fold(line)
        self.changed |= changed
        return changed

    def fold(self, line: bytes) -> bool:
        try:
            obj = json.loads(line)
        except ValueError:
            return False
        if not isinstance(obj, dict):
            return False
        s = self.state
        before = json.dumps(s, sort_keys=True, default=str)
        if isinstance(obj.get("stage"), str):
            s["stage"] = obj["stage"]
        units = obj.get("units")
        if isinstance(units, dict):
            for key in ("completed", "total"):
                if (v := _int(units.get(key))) is not None:
                    s[key] = v
        metrics = obj.get("metrics")
        if isinstance(metrics, dict):
            s.setdefault("metrics", {}).update({str(k): _decimal(v) for k, v in metrics.items()})
        for key in ("step", "totalSteps", "gpuMemoryBytes"):
            if (v := _int(obj.get(key))) is not None:
                s[key] = v
        if obj.get("tokensPerSecond") is not None:
            s["tokensPerSecond"] = _decimal(obj["tokensPerSecond"])
        return json.dumps(s, sort_keys=True, default=str) != before

    def message(self, attempt_id: str, now: float | None = None) -> agent_pb2.Progress | None:
        """The Progress to send, stamped `now` (the agent clock's Unix seconds; None: the host's)."""
        s = self.state
        if not s:
            return None
        ts = Timestamp()
        if now is None:
            ts.GetCurrentTime()
        else:
            ts.FromNanoseconds(int(now * 1e9))
        return agent_pb2.Progress(
            attempt_id=attempt_id, stage=s.get("stage", ""), units_completed=s.get("completed", 0),
            units_total=s.get("total", 0), metrics=s.get("metrics", {}), step=s.get("step", 0),
            total_steps=s.get("totalSteps", 0), tokens_per_second=s.get("tokensPerSecond", ""),
            gpu_memory_bytes=s.get("gpuMemoryBytes", 0), time=ts)
