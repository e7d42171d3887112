"""A keyed work queue, as client-go's: each key is queued once however often it is added, a key is
never processed by two workers at once, and a key added while it is being processed runs again
after. Delayed adds (`add_after`) carry the time-based wake-ups a decision asks for. An `urgent` add
goes before every key queued the ordinary way (the Job controller's new Jobs, ADR 0075). `run_workers`
is the loop every controller runs over its queue.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from ..stopping import cancel_and_wait

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[None] = asyncio.Queue()
        """One token per queued key: a worker takes a token, then the key (urgent ones first)."""
        self._keys: collections.deque[K] = collections.deque()
        self._urgent: collections.deque[K] = collections.deque()
        self._pending: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K, urgent: bool = False) -> None:
        if key in self._active:
            self._again.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            (self._urgent if urgent else self._keys).append(key)
            self._queue.put_nowait(None)

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` after `delay` seconds; an earlier timer for the key wins over a later one."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        await self._queue.get()
        key = self._urgent.popleft() if self._urgent else self._keys.popleft()
        self._pending.discard(key)
        self._active.add(key)
        return key

    def claim(self, key: K) -> bool:
        """Takes `key` as a worker would, outside the workers (a caller doing the key's work itself: ADR 0127):
        False, and nothing taken, when the key is queued or being processed; else it is held until `done`, a
        worker does not take it meanwhile, and an `add` meanwhile runs it again after."""
        if key in self._active or key in self._pending:
            return False
        self._active.add(key)
        return True

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._pending)


async def run_workers(queue: WorkQueue[K], reconcile: Callable[[K], Awaitable[None]], *, workers: int,
                      resync: Callable[[], None], resync_seconds: float, log: logging.Logger, name: str) -> None:
    """A controller's loop: `workers` tasks take keys and reconcile them (a key that fails is retried
    after a backoff that doubles, up to a minute; one key never stops the others), while `resync`
    queues everything every `resync_seconds`, so a missed trigger is only ever late. Runs until
    cancelled, then stops its workers."""
    failures: dict[K, int] = {}

    async def worker() -> None:
        while True:
            # A queued key is taken without suspending (asyncio.Queue.get with tokens ready), and a reconcile
            # may not suspend either (a store read answered from memory): without this yield a key that
            # queues itself again (a TTL delete that meets NotFound until the cache sees the delete) spins
            # here and starves the loop, the cache's watch that would end the spin included.
            await asyncio.sleep(0)
            key = await queue.get()
            try:
                await reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - log, retry later
                n = failures[key] = failures.get(key, 0) + 1
                log.exception("reconciling %s failed (%d in a row); retrying", key, n)
                queue.add_after(key, min(60.0, 0.5 * 2 ** n))
            else:
                failures.pop(key, None)
            finally:
                queue.done(key)

    tasks = [asyncio.create_task(worker(), name=f"{name}-{i}") for i in range(workers)]
    try:
        while True:
            resync()
            await asyncio.sleep(resync_seconds)
    finally:
        queue.close()
        await cancel_and_wait(tasks)
