"""Two small thread stages, so that reading, compressing and hashing/writing overlap.

zstd, sha256, file reads and writes all release the GIL, so a save runs as three stages (files read
ahead on one thread, compressed by zstd's workers, hashed and handed to the store on another) and a
restore decompresses on a thread while the caller writes files. Queues are bounded: memory stays at
a few chunks whatever the size. An error in a stage is raised in the caller's thread, at its next
call; `close` stops a stage early without leaving a thread blocked.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
_END = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetch(Generic[T]):
    """Runs an iterator on its own thread, `depth` items ahead of the consumer."""

    def __init__(self, source: Iterator[T], depth: int, name: str) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not _put(self._queue, item, self._stop):
                    return
            _put(self._queue, _END, self._stop)
        except BaseException as e:  # raised again in the consumer's thread
            _put(self._queue, _Failure(e), self._stop)

    def next(self) -> T | None:
        """The next item, or None at the end."""
        if self._done:
            return None
        item = self._queue.get()
        if item is _END:
            self._done = True
            return None
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop reading ahead; returns once the thread is gone (it never outlives its caller)."""
        self._stop.set()
        _drain(self._queue)
        self._thread.join()


class Drain(Generic[T]):
    """Hands items to `consume` on its own thread; `finish` waits for the last one."""

    def __init__(self, consume: Callable[[T], object], depth: int, name: str) -> None:
        self._consume = consume
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END or self._stop.is_set():
                return
            try:
                self._consume(item)  # type: ignore[arg-type]
            except BaseException as e:
                self._error = e
                self._stop.set()
                _drain(self._queue)
                return

    def put(self, item: T) -> None:
        if self._error is not None:
            raise self._error
        if not _put(self._queue, item, self._stop) and self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Wait until every item is consumed; raises the consumer's error, if any."""
        _put(self._queue, _END, self._stop)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Drop what is queued; returns once the consumer has left its current item, so the caller
        may abort what it was writing to without racing it."""
        self._stop.set()
        _drain(self._queue)
        _put(self._queue, _END, threading.Event())
        self._thread.join()


def _put(q: "queue.Queue[object]", item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _drain(q: "queue.Queue[object]") -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
