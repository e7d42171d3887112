"""When each replica started and began to serve agents, so that the leader gives the nodes of a replica
that restarts the grace a restarted coordinator gives its own (docs/adr/0098-a-replicas-restart-holds-the-leases.md).

A node's agent reconnects to the replica it knows. While that replica restarts, nothing can renew the
node's lease, and the leader, which did not restart, gave no grace of its own: with three replicas
restarted one after another (`bench/fleet.py --postgres --replicas 3`), the leader expired the leases of
the last replica's nodes, and Lost their running attempts, seconds before or after that replica served
them again, while their agents were connected to it and beating. So every replica records under
`_replicas/<holder>` when it started (`startTime`) and when its gRPC server began to accept reconnects
(`servingTime`), and the lease controller reads those records from the store (not a cache: a watch lags)
before it expires anything. While a replica is starting no lease runs out, for at most `STARTING_LEASES`
lease durations (a replica that died while starting must not hold them for ever); from a replica's
serving time every lease holds one duration more, as ADR 0088's grace. Pure, apart from `announce` and
`read`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import orjson

from ..clock import parse, rfc3339
from ..errors import NodusError
from ..store.base import Store

log = logging.getLogger("nodus.controllers.replicas")

REPLICAS = "_replicas/"
STARTING_LEASES = 4
"""A replica that announced its start and never served holds the leases this many lease durations at most."""


@dataclass(frozen=True, slots=True)
class ReplicaGrace:
    """What the replicas' records say about expiring a lease at one instant."""

    hold: bool
    """A replica is starting: its agents cannot reconnect yet, so no lease runs out."""
    since: float | None
    """The newest serving time whose grace still runs: leases hold until it + the lease duration."""
    stale: tuple[str, ...]
    """Records whose grace is over, for the leader to delete."""


def grace(records: Iterable[tuple[str, dict[str, Any]]], duration: float, now: float) -> ReplicaGrace:
    hold, since, stale = False, None, []
    for key, doc in records:
        started, serving = parse(doc.get("startTime")), parse(doc.get("servingTime"))
        if serving is not None:
            if now < serving + duration:
                since = serving if since is None else max(since, serving)
                continue
        elif started is not None and now < started + STARTING_LEASES * duration:
            hold = True
            continue
        stale.append(key)
    return ReplicaGrace(hold, since, tuple(stale))


async def announce(store: Store, holder: str, start: float, serving: float | None = None) -> None:
    """Writes this replica's record (a replica's own key: no other writer, so no compare-and-swap)."""
    doc = {"holder": holder, "startTime": rfc3339(start)}
    if serving is not None:
        doc["servingTime"] = rfc3339(serving)
    key, value = REPLICAS + holder, orjson.dumps(doc)
    try:
        await store.update(key, value, None)
    except NodusError as e:
        if e.reason != "NotFound":
            raise
        await store.create(key, value)


async def read(store: Store) -> list[tuple[str, dict[str, Any]]]:
    """Every replica's record, from the store itself."""
    found = await store.list(REPLICAS)
    return [(rec.key, dict(orjson.loads(rec.value))) for rec in found.records]


async def withdraw(store: Store, key: str) -> None:
    """Deletes a record (a stopping replica's own, or one whose grace is over); gone already is fine."""
    try:
        await store.delete(key)
    except NodusError as e:
        if e.reason != "NotFound":
            log.warning("could not delete %s: %s", key, e)
