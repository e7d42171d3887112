"""A stop ends tasks that lose a cancellation (coordinator/stopping.py): on Python 3.11 a cancel can be
swallowed inside a library (asyncio.wait_for returning an inner result that finished in the same
iteration; psycopg_pool waits with it), and the coordinator's stop used to wait forever for such a task
(the cache's store follower on PostgreSQL under load: SIGTERM never ended the process)."""
from __future__ import annotations

import asyncio

from nodus.coordinator.stopping import cancel_and_wait


def test_a_task_that_swallows_its_first_cancel_is_cancelled_again_and_ends() -> None:
    async def main() -> None:
        swallowed = asyncio.Event()

        async def follower() -> None:  # a loop whose first cancel is lost, as in the store follower
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if swallowed.is_set():
                        raise
                    swallowed.set()
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]

        plain = asyncio.create_task(asyncio.sleep(3600))
        stubborn = asyncio.create_task(follower())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait([plain, stubborn], every=0.05), 5)
        assert swallowed.is_set() and stubborn.cancelled() and plain.cancelled()

    asyncio.run(main())


def test_ended_tasks_and_failures_are_consumed_without_raising() -> None:
    async def main() -> None:
        async def fails() -> None:
            raise RuntimeError("boom")

        failed = asyncio.create_task(fails())
        done = asyncio.create_task(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        await cancel_and_wait([failed, done])
        assert isinstance(failed.exception(), RuntimeError) and done.done()

    asyncio.run(main())
