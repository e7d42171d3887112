"""Small JSON files written so that a crash leaves either the old or the new content, never half.

Temp file in the same directory, fsync, rename over the target, fsync the directory: the pattern
dstack's shim uses for its state, and what both the agent (state.json) and every attempt's
supervisor (status.json) rely on to be re-read after a kill -9.

`StateWriter` does the same for a file rewritten on every change from an event loop (the agent's
state.json): off the loop, on one thread of its own, and coalesced (ADR 0036).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .swapfile import SwapFile, fill, fsync_dir

log = logging.getLogger("nodus.agent")


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _encoded(snapshot: Any) -> bytes:
    """A snapshot as the file holds it: bytes as they are (a snapshot that encodes itself), else JSON."""
    return snapshot if isinstance(snapshot, bytes) else encode_json(snapshot)


def write_json(path: Path, value: Any, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replaces `path` with `value` as JSON."""
    write_bytes(path, encode_json(value), mode, durable)


def write_bytes(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replaces `path` with `data`; `durable` fsyncs the file before the rename and the
    directory after it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fill(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode), data, durable)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def read_json(path: Path) -> Any | None:
    """The file's JSON, or None when it does not exist or is unreadable (a torn write never is)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


class StateWriter:
    """Keeps one JSON file up to date with `snapshot()` without blocking the event loop.

    `changed` returns at once: the latest state wins, so the changes made while a write is in
    flight become one more write, and the changes of one loop turn one write. The snapshot is taken
    (and encoded) on the loop, where the state changes, so each write is a consistent state and the
    file never goes back to an older one; the temp file, fsync, rename and directory fsync run on
    the writer's own thread, where no other blocking call queues in front of them. `flush` returns
    once a durable write holding every change made before it is on disk: what must not be lost in
    a crash before the caller acts. Without a running loop (a tool, a test) `changed` writes at once.
    """

    def __init__(self, path: Path, snapshot: Callable[[], Any], mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self.file = SwapFile(path, mode)
        """Each write exchanged with the file's previous inode, not a new temp file (ADR 0112)."""
        self._snapshot = snapshot
        self._changes = 0
        """Changes asked for so far, each numbered: what a write or a flush waits for."""
        self._durable_asked = 0
        """The latest change that asked to be fsynced."""
        self._written = 0
        """The latest change the file holds (maybe only in the page cache)."""
        self._synced = 0
        """The latest change the file holds durably."""
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.writes = 0
        """Files written (a temp file exchanged with the target) since this writer began."""

    def changed(self, durable: bool = True) -> None:
        """The state changed: write it soon; `durable=False` where a crash losing it is harmless."""
        self._changes += 1
        if durable:
            self._durable_asked = self._changes
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(durable=self._durable_asked > self._synced)
            return
        self._start(loop)

    async def flush(self) -> None:
        """Returns once every change made before the call is fsynced; raises OSError when the write
        failed (the next change or flush tries again)."""
        done = self._waiter()
        if done is not None:
            await done

    def after_flush(self, then: Callable[[], None]) -> None:
        """Calls `then` once every change made so far is fsynced: at once when it already is, on the
        loop otherwise, and after a failed write too (logged by the writer); not if the loop ends first."""
        done = self._waiter()
        if done is None:
            then()
            return

        def call(f: asyncio.Future[None]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved: the writer logged it
                then()

        done.add_done_callback(call)

    def _waiter(self) -> asyncio.Future[None] | None:
        """What completes once every change so far is fsynced; None when that is already so."""
        target = self._changes
        if self._synced >= target:
            return None
        self._durable_asked = max(self._durable_asked, target)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiters.append((target, done))
        self._start(loop)
        return done

    async def close(self) -> None:
        """Flushes and ends the writer's thread (a later change starts another)."""
        try:
            await self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"write:{self.path.name}")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._written < self._changes or self._synced < self._durable_asked:
                change, durable = self._changes, self._durable_asked > self._synced
                data = _encoded(self._snapshot())
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write:{self.path.name}")
                await loop.run_in_executor(self._pool, self.file.write, data, durable)
                self._done(change, durable)
        except asyncio.CancelledError:  # the loop ends: nobody is left to wait
            self._wake(cancel=True)
            raise
        except Exception as e:  # noqa: BLE001 - the waiters hear of it; the next change tries again
            log.error("%s could not be written: %s", self.path, e)
            self._wake(e if isinstance(e, OSError) else OSError(f"{self.path} could not be written: {e}"))

    def _write(self, durable: bool) -> None:
        change = self._changes
        self.file.write(_encoded(self._snapshot()), durable)
        self._done(change, durable)

    def _done(self, change: int, durable: bool) -> None:
        self.writes += 1
        self._written = change
        if durable:
            self._synced = change
        self._wake()

    def _wake(self, error: OSError | None = None, cancel: bool = False) -> None:
        waiting = []
        for target, done in self._waiters:
            if done.done():
                continue
            if cancel:
                done.cancel()
            elif error is not None:
                done.set_exception(error)
            elif target <= self._synced:
                done.set_result(None)
            else:
                waiting.append((target, done))
        self._waiters = waiting
