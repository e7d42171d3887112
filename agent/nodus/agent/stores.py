"""The S3 checkpoint stores of the agent's attempts, with their credentials, in memory only.

An attempt's store is its Job's S3 Connection plus `INDEX/ATTEMPT-ID/` (ADR 0014). Its credentials
never reach the attempt's files; the attempt's run/ records just the URI, so an agent that restarted
knows the checkpoint must go to S3 and refuses it with a reason rather than put it elsewhere. One
object per agent (recovery.Checkpoints owns it), not a module global: two agents in one process
(tests) keep their keys apart, and a forgotten attempt's keys go with it.
"""
from __future__ import annotations

from typing import Container

from nodus.v1 import agent_pb2

from .checkpointing import S3_URI, CheckpointFailed
from .layout import AttemptLayout

STORE_FILE = "checkpoint-store"
"""In the attempt's run/: the store's URI (no credentials), so a restarted agent knows where checkpoints go."""


class CheckpointStores:
    def __init__(self) -> None:
        self._stores: dict[str, agent_pb2.Location] = {}
        """Attempt id → its S3 store with credentials (attempt ids are unique)."""

    def remember(self, attempt_id: str, index: int, store: agent_pb2.Location, layout: AttemptLayout) -> None:
        """The attempt's own S3 store (the Job's location plus INDEX/ATTEMPT-ID/) with these credentials;
        a blob store needs nothing kept."""
        if not store.uri.startswith(S3_URI):
            return
        own = agent_pb2.Location(uri=f"{store.uri.rstrip('/')}/{index}/{attempt_id}/", credentials=store.credentials)
        before = self._stores.get(attempt_id)
        self._stores[attempt_id] = own
        if before is None or before.uri != own.uri:  # the record for an agent restart: written once
            layout.run.mkdir(parents=True, exist_ok=True)
            (layout.run / STORE_FILE).write_text(own.uri + "\n")

    def keep_only(self, attempt_ids: Container[str]) -> None:
        """Forgets the stores of attempts the agent no longer has."""
        for gone in [i for i in self._stores if i not in attempt_ids]:
            del self._stores[gone]

    def of(self, attempt_id: str, layout: AttemptLayout) -> agent_pb2.Location | None:
        """The attempt's S3 store, or None for the blob store. Raises CheckpointFailed when it should be
        S3 but the credentials are gone (they live in memory: this agent restarted since the assignment)."""
        found = self._stores.get(attempt_id)
        if found is not None:
            return found
        try:
            uri = (layout.run / STORE_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        raise CheckpointFailed(f"the attempt's checkpoint store is {uri}, and this agent restarted since the attempt "
                               "started, so it no longer holds the store's credentials (they are kept in memory "
                               "only); the next assignment or checkpoint request of the attempt brings them again")
