"""Small asyncio helpers the agent's loops share."""
from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Waits for `event` up to `timeout` seconds; True when it was set.

    Not asyncio.wait_for: on Python 3.11 that can swallow a cancellation racing with the event
    (gh-86296), and a task that ignores its cancel hangs the agent's stop.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False
