"""A token revoked through one replica is refused by another sharing its store as soon as the write
reaches it (its cache follows the store's tokens), not when its cache would have run out."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus.coordinator.errors import NodusError
from nodus.coordinator.identity import Identity, Role
from nodus.coordinator.store.sqlite import SqliteStore


def test_a_revocation_on_one_replica_empties_the_others_cache(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            frozen = 1_000_000.0  # the cache never runs out by time: only the store's write can end it
            here, there = Identity(store, clock=lambda: frozen), Identity(store, clock=lambda: frozen)
            await here.ensure_project("p")
            token, record = await there.create_token("p", Role.VIEWER)
            caller = await here.authenticate(f"Bearer {token}")
            assert caller.token_id == record["id"]
            await asyncio.sleep(0.05)  # `here` now follows the store
            await there.revoke_token(record["id"])
            for _ in range(200):
                try:
                    await here.authenticate(f"Bearer {token}")
                except NodusError as e:
                    assert e.reason == "Unauthorized" and e.message.startswith(f'token "{record["id"]}" was revoked')
                    return
                await asyncio.sleep(0.05)
            pytest.fail("the other replica still accepts the revoked token")
        finally:
            await store.close()
    asyncio.run(scenario())
