"""The agent's one table of attempts and its persistence (state.json).

It owns every attempt the agent knows (`Attempt`, persisted), what it holds of each in memory only
(`Volatile`: tasks, the progress tail, the assignment's secrets until the supervisor has them),
the tombstones of attempts it forgot (so an assignment sent again is never run twice) and the
lease's expiry. state.json (never a secret) is written atomically (statefile.py) by `persist` only,
so a restarted agent re-adopts the supervisors still running and keeps its lease.

The rule of state.json (ADR 0036): `persist` only asks for a write and returns; a writer thread
writes the latest state (the persists made while a write is in flight become one more write, one
fsync), so the event loop never waits on the disk, and the file only ever moves forward. A change
the agent must not lose in a crash before it acts on it is followed by `await flush()` (or
`after_flush`), which returns once a write holding it is fsynced: the SUPERVISED stage before the
supervisor is spawned (a restart then finds it and re-adopts it, else knows nothing ran), an end
before it is reported (the coordinator never hears of an end the agent could forget), the
tombstones before the forgotten attempts' directories go, and everything at shutdown. Every other
persist (an acceptance, a stop asked, a lease renewal, a gang step, an output uploaded) may be lost
to a kill -9 within one write's time, and a restarted agent redoes or re-derives it (the
supervisor's status.json and the coordinator's desired state hold the rest).
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from nodus.v1 import agent_pb2

from .attempts import Attempt
from .clock import Clock, deadline_of, wall_of
from .decisions import AttemptFacts
from .progress_tail import ProgressTail
from .statefile import StateWriter, encode_json, read_json

log = logging.getLogger("nodus.agent")

TOMBSTONES = 512
STATE_VERSION = 1


@dataclass(slots=True)
class Volatile:
    """What the agent holds about an attempt in memory only."""

    assignment: agent_pb2.Assignment | None = None
    """Kept (secrets included) only until the supervisor has them."""
    task: asyncio.Task[None] | None = None
    proc: Any = None
    progress: ProgressTail | None = None
    progress_sent: float = 0.0
    """Monotonic time of the last Progress sent."""
    log_task: asyncio.Task[None] | None = None
    log_wake: asyncio.Event = field(default_factory=asyncio.Event)
    spawning: bool = False
    """Between the persisted SUPERVISED stage and the end of the spawn: nothing to observe yet."""


class AttemptTable:
    def __init__(self, path: Path, node: str, clock: Clock) -> None:
        self.path = path
        self.node = node
        self.clock = clock
        self.attempts: dict[str, Attempt] = {}
        self.volatile: dict[str, Volatile] = {}
        self.finished: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        """Tombstones: attempt id → how it ended, for attempts forgotten after their end was acked."""
        self._finished_json: bytes | None = None
        """`finished` as state.json holds it, encoded once per change of it: up to 512 tombstones are most of
        the file, and it is written on every change of stage (bench/startup.py's CPU per index)."""
        self.lease_deadline: float | None = None
        """Monotonic; None until the first lease."""
        self.writer = StateWriter(path, self._state)

    # -- lookups -----------------------------------------------------------------------------------
    def get(self, attempt_id: str) -> Attempt | None:
        return self.attempts.get(attempt_id)

    def __iter__(self) -> Iterator[Attempt]:
        return iter(list(self.attempts.values()))

    def __len__(self) -> int:
        return len(self.attempts)

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self.attempts

    def live_ids(self) -> list[str]:
        return [i for i, a in self.attempts.items() if a.live]

    def facts(self) -> list[AttemptFacts]:
        """The attempts as the pure decisions read them."""
        return [AttemptFacts(a.id, a.stage, a.stop is not None, a.terminal_seq, a.acked, a.log_done)
                for a in self.attempts.values()]

    # -- changes -----------------------------------------------------------------------------------
    def add(self, att: Attempt, volatile: Volatile) -> Volatile:
        self.attempts[att.id] = att
        self.volatile[att.id] = volatile
        return volatile

    def forget(self, attempt_id: str) -> Volatile | None:
        """Drops an ended attempt and keeps its tombstone; returns what was held of it in memory."""
        att = self.attempts.pop(attempt_id)
        self.finished[att.id] = {"phase": att.phase, "reason": att.reason, "exit_code": att.exit_code,
                                 "finish_time": att.finish_time}
        while len(self.finished) > TOMBSTONES:
            self.finished.popitem(last=False)
        self._finished_json = None
        return self.volatile.pop(attempt_id, None)

    # -- state.json --------------------------------------------------------------------------------
    def persist(self, durable: bool = True) -> None:
        """Asks for state.json to be written and returns (written at once outside an event loop);
        `durable=False` where a crash losing the change is harmless."""
        self.writer.changed(durable)

    async def flush(self) -> None:
        """Returns once state.json durably holds every change persisted before the call."""
        await self.writer.flush()

    def after_flush(self, then: Callable[[], None]) -> None:
        """Calls `then` once state.json durably holds every change persisted so far (at once if it
        does already, and after a failed write too: the writer logs it)."""
        self.writer.after_flush(then)

    async def close(self) -> None:
        """Writes what is left and stops the writer's thread."""
        await self.writer.close()

    def _state(self) -> bytes:
        lease = None if self.lease_deadline is None else wall_of(self.clock, self.lease_deadline)
        if self._finished_json is None:
            self._finished_json = encode_json(list(self.finished.items()))
        rest = encode_json({"version": STATE_VERSION, "node": self.node,
                            "attempts": {i: a.persisted() for i, a in self.attempts.items()}, "lease_expires": lease})
        return b'{"finished":' + self._finished_json + b"," + rest[1:]

    def read(self) -> list[Attempt]:
        """What a previous agent process left: its tombstones and lease (taken), its attempts (returned,
        for the daemon to re-adopt or drop; unreadable ones are logged and dropped)."""
        state = read_json(self.path) or {}
        for attempt_id, end in state.get("finished") or []:
            self.finished[attempt_id] = end
        self._finished_json = None
        expires = state.get("lease_expires")
        if expires:
            self.lease_deadline = deadline_of(self.clock, float(expires))
        found = []
        for attempt_id, d in (state.get("attempts") or {}).items():
            try:
                found.append(Attempt.from_persisted(d))
            except (KeyError, TypeError, ValueError) as e:
                log.warning("state.json: attempt %s unreadable (%s); dropped", attempt_id, e)
        return found


def lock_work_dir(work_dir: Path) -> int:
    """One agent per work dir: two would both think they own every attempt. Returns the lock's fd,
    held until the process ends."""
    fd = os.open(work_dir / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"nodus-agent: another agent already runs on {work_dir}") from None
    return fd
