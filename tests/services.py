"""The coordinator's ResourceService on a real store, in process, for tests of what it does without the
daemons around it (a controller's status write, its batched creates)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

from nodus.coordinator.identity import Identity
from nodus.coordinator.resources import ResourceService
from nodus.coordinator.store import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key


@contextlib.asynccontextmanager
async def resource_service(root: Path, project: str = "p") -> AsyncIterator[tuple[SqliteStore, ResourceService]]:
    """A SQLite store under `root`, its Identity with `project`, and the ResourceService over them; the
    store is closed on the way out."""
    store = await SqliteStore.open(root / "store.db")
    try:
        identity = Identity(store)
        await identity.ensure_project(project, "test")
        yield store, ResourceService(store, identity, Vault(store, load_or_create_key(root / "secret.key")))
    finally:
        await store.close()
