"""Objects.upsert starts from the cache when it holds the key (ADR 0091): no store read when the cache is
current, and a stale cached copy (another replica wrote since) costs a retry from the store, never a lost
write."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from nodus.coordinator.controllers.cache import LEASES, Cache
from nodus.coordinator.controllers.objects import Objects
from nodus.coordinator.store import SqliteStore

KEY = LEASES + "n1"


class CountingStore(SqliteStore):
    gets = 0

    async def get(self, key: str) -> Any:
        CountingStore.gets += 1
        return await super().get(key)


async def _scenario(path: Path) -> None:
    store = await CountingStore.open(path / "store.db")
    cache = Cache(store)
    await cache.start()
    objects = Objects(store, cache)
    try:
        def bump(old: dict[str, Any] | None) -> dict[str, Any]:
            return {"beats": (old or {}).get("beats", 0) + 1}

        await objects.upsert(KEY, bump)  # absent: created
        CountingStore.gets = 0
        stored = await objects.upsert(KEY, bump)
        assert stored["beats"] == 2 and CountingStore.gets == 0  # from the cache: no store read

        # Another replica writes and this cache's watch lags (here: it stopped following).
        await cache.stop()
        rec = await store.get(KEY)
        assert rec is not None
        await store.update(KEY, orjson.dumps({"beats": 10}), rec.revision)
        assert (cache.get(KEY) or {}).get("beats") == 2  # still stale here
        CountingStore.gets = 0
        stored = await objects.upsert(KEY, bump)
        assert stored["beats"] == 11, stored  # the stale try conflicted; the retry read the store
        assert CountingStore.gets == 1
        rec = await store.get(KEY)
        assert rec is not None and orjson.loads(rec.value) == {"beats": 11}
    finally:
        await cache.stop()
        await store.close()


def test_upsert_reads_the_cache_first_and_retries_a_stale_copy_from_the_store(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
