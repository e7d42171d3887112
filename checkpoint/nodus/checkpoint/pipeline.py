"""A thread stage that reads ahead: a stream-decoded archive (`verify`, a store's stream) is
decompressed on its own thread while the caller parses it.

zstd releases the GIL, so the two overlap. The queue is bounded: memory stays at a few chunks
whatever the size. An error in the stage is raised in the caller's thread, at its next call;
`close` stops the stage early without leaving a thread blocked. (Saves and restores from a file
encode and decode frames on a pool instead: frames.py, ADR 0053.)
"""
from __future__ import annotations

import queue
import threading
from typing import Generic, Iterator, TypeVar

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
