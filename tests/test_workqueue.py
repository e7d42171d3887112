"""The controllers' keyed work queue (controllers/workqueue.py): a key is queued once however often it is
added, keys come out in order, and an urgent add (a new Job, ADR 0075) comes out before every key queued
the ordinary way; a key added while a worker has it runs again after."""
from __future__ import annotations

import asyncio

from nodus.coordinator.controllers.workqueue import WorkQueue


async def _order() -> list[str]:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "c"):
        q.add(key)
    q.add("new-1", urgent=True)
    q.add("b", urgent=True)  # already queued: it keeps its place, once
    q.add("new-2", urgent=True)
    assert len(q) == 5
    out = []
    for _ in range(5):
        key = await q.get()
        out.append(key)
        q.done(key)
    assert len(q) == 0
    return out


def test_urgent_keys_come_first_and_every_key_once() -> None:
    assert asyncio.run(_order()) == ["new-1", "new-2", "a", "b", "c"]


async def _again() -> list[str]:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a", urgent=True)  # changed while being reconciled: once more, after
    q.add("b")
    q.done(key)
    return [await q.get(), await q.get()]


def test_a_key_added_while_active_runs_again_after() -> None:
    assert asyncio.run(_again()) == ["b", "a"]
