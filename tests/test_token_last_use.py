"""A token's stored lastUseTime is written at most once a minute, a coordinator restart included: the
first use after a restart within the minute of the stored one writes nothing (the store's revision stays,
which `store copy`'s test reads), and a use a minute later writes it again."""
from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from nodus.coordinator.clock import ManualClock
from nodus.coordinator.identity import Identity, Role
from nodus.coordinator.store import SqliteStore


def test_a_restart_does_not_rewrite_a_recent_last_use(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock(1_000_000.0)
        store = await SqliteStore.open(tmp_path / "store.db")
        first = Identity(store, clock=clock.now)
        await first.ensure_project("default")
        secret, record = await first.create_token("default", Role.EDITOR, "someone")
        key = f"_identity/tokens/{record['id']}"

        async def use(identity: Identity) -> None:
            await identity.authenticate(f"Bearer {secret}")
            await asyncio.gather(*list(identity._writes))  # the last-use write runs beside the request

        await use(first)
        written = await store.get(key)
        assert written is not None and orjson.loads(written.value)["lastUseTime"]

        clock.advance(20)
        restarted = Identity(store, clock=clock.now)  # a new process on the same store
        await use(restarted)
        again = await store.get(key)
        assert again is not None and again.revision == written.revision, "within the minute: not written"

        clock.advance(45)
        await use(restarted)
        later = await store.get(key)
        assert later is not None and later.revision > written.revision, "a minute on: written again"
        await store.close()
    asyncio.run(go())
