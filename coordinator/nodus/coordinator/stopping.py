"""Ending tasks for good when the coordinator stops or a leader abdicates.

A cancellation can be lost: on Python 3.11 `asyncio.wait_for` returns the result of an inner future
that finished in the same loop iteration as the cancel, and libraries wait with it (psycopg_pool's
`getconn` does). A task that lost its cancel runs on, and a stop that waited for it once never ended
(a SIGTERM'd coordinator on PostgreSQL kept following its store). So a stop cancels again until the
task has ended.
"""
from __future__ import annotations

import asyncio
from typing import Any, Iterable

RECANCEL_SECONDS = 0.5
"""How long a stop waits for a cancelled task before it cancels it again."""


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], every: float = RECANCEL_SECONDS) -> None:
    """Cancels `tasks` and returns once every one has ended, cancelling again any still running after
    `every` seconds; their results and exceptions are consumed (a stop reports nothing of them)."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every)
    await asyncio.gather(*tasks, return_exceptions=True)
