"""Threads that run tasks in the order given, for a restore's decoders and writer lanes.

What concurrent.futures' ThreadPoolExecutor does here, minus its import (it imports logging: ~5 ms of
every `nodus checkpoint restore`'s start, ADR 0081) and minus a Future, a condition variable and
its callbacks per task: a task is done when its lock is released.
"""
from __future__ import annotations

import threading
from queue import SimpleQueue
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Cancelled(Exception):
    """The pool stopped before this task ran."""


class Task(Generic[T]):
    """One submitted call: `result()` waits for it and returns its value or raises its error."""

    __slots__ = ("_lock", "_value", "_error")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released by the thread that runs it
        self._value: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return not self._lock.locked()

    def result(self) -> T:
        with self._lock:
            pass
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Pool:
    """`threads` threads taking tasks from one queue, first in, first out (one thread: a lane, whose
    tasks run one after the other). Threads start with the pool; `close` stops them."""

    def __init__(self, threads: int, name: str) -> None:
        self._queue: SimpleQueue[tuple[Task[Any], Callable[..., Any], tuple[Any, ...]] | None] = SimpleQueue()
        self._cancelled = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Task[T]:
        task: Task[T] = Task()
        self._queue.put((task, fn, args))
        return task

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            task, fn, args = item
            try:
                if self._cancelled:
                    raise Cancelled()
                task._value = fn(*args)
            except BaseException as e:  # raised again by result(), in the caller's thread
                task._error = e
            finally:
                task._lock.release()

    def cancel(self) -> None:
        """Tasks that have not started will not run (their result() raises Cancelled)."""
        self._cancelled = True

    def close(self, cancel: bool = False) -> None:
        """Run what was submitted (or, with `cancel`, only what has started) and stop every thread."""
        if cancel:
            self.cancel()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
