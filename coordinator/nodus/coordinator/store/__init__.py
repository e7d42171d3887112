"""The store: one keyspace for every kind, with a store-wide revision (docs/adr/0002-store.md).

Only this package speaks SQL; everything above it uses `Store`.
"""
from __future__ import annotations

from nodus.coordinator.store.base import Event, EventType, ListResult, Record, Store, prefix_end
from nodus.coordinator.store.sqlite import SqliteStore

__all__ = ["Event", "EventType", "ListResult", "Record", "SqliteStore", "Store", "prefix_end"]
