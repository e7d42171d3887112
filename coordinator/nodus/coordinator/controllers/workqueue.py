"""A keyed work queue, as client-go's: each key is queued once however often it is added, a key is
never processed by two workers at once, and a key added while it is being processed runs again
after. Delayed adds (`add_after`) carry the time-based wake-ups a decision asks for.
"""
from __future__ import annotations

import asyncio
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._pending: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def add(self, key: K) -> None:
        if key in self._active:
            self._again.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

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
        key = await self._queue.get()
        self._pending.discard(key)
        self._active.add(key)
        return key

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
