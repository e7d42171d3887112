"""A connected node's liveness (ADR 0049): the heartbeats its stream hears, kept in memory on the
replica holding the stream, and when that replica writes the node's lease to the store.

A heartbeat no longer waits for a durable write: it is recorded here at once, and the lease controller
of this replica asks `alive` before it expires a lease, so a slow store or a busy loop cannot make a
connected, heartbeating node look lost. The stored lease (`_leases/<name>`) is what the other replicas
(and a leader elected after this one) see: it is written when `persist_due` says so, that is when the
stored lease has less than half its duration left, when the GPUs' health changed, or when it was
marked expired (a revived node), so it stays at least half a lease ahead of the clock while the node
beats and a write has that half lease to land. Pure: no I/O, no clock of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..clock import parse, rfc3339

PERSIST_FRACTION = 0.5
"""The stored lease is rewritten once less than this fraction of the lease duration is left on it."""


@dataclass
class Beat:
    """The newest heartbeat a stream on this replica heard from one session of a node."""

    session_id: str
    epoch: int
    time: float
    disk_free_bytes: int = 0
    gpu_unhealthy: dict[str, str] = field(default_factory=dict)


def alive(beat: Beat | None, node: dict[str, Any] | None, duration: float, now: float) -> bool:
    """The node's current session beat on this replica within the lease duration."""
    if beat is None or node is None:
        return False
    current = node.get("sessionId") == beat.session_id and int(node.get("epoch", 0)) == beat.epoch
    return current and now < beat.time + duration


def persist_due(stored: dict[str, Any] | None, beat: Beat, duration: float) -> bool:
    """Whether the stored lease must be rewritten for this beat (see the module's docstring)."""
    if not stored or stored.get("expired") or stored.get("sessionId") != beat.session_id:
        return True
    if beat.gpu_unhealthy and stored.get("gpuUnhealthy") != beat.gpu_unhealthy:
        return True
    expire = parse(stored.get("expireTime")) or 0.0
    return expire - beat.time < duration * PERSIST_FRACTION


def expiry(stored: dict[str, Any] | None, beat: Beat | None, node: dict[str, Any] | None, duration: float,
           now: float) -> float | None:
    """`overlay(...)`'s expireTime as Unix seconds (None: no lease), without building the lease: what each
    heartbeat's LeaseRenewal says."""
    held = parse(stored.get("expireTime")) if stored else None
    if not alive(beat, node, duration, now) or beat is None:
        return held
    expire = round(beat.time + duration, 3)  # as overlay's expireTime, written to the millisecond, reads back
    return held if held is not None and not (stored or {}).get("expired") and held >= expire else expire


def overlay(stored: dict[str, Any] | None, beat: Beat | None, node: dict[str, Any] | None, duration: float,
            now: float) -> dict[str, Any] | None:
    """The lease as this replica knows it: the stored one, renewed by a newer beat heard here."""
    if not alive(beat, node, duration, now) or beat is None:
        return stored
    expire = beat.time + duration
    if stored and not stored.get("expired") and (parse(stored.get("expireTime")) or 0.0) >= expire:
        return stored
    lease = dict(stored or {"node": (node or {}).get("name", "")})
    lease.update(epoch=beat.epoch, sessionId=beat.session_id, renewTime=rfc3339(beat.time),
                 expireTime=rfc3339(expire), expired=False)
    if beat.disk_free_bytes:
        lease["diskFreeBytes"] = beat.disk_free_bytes
    if beat.gpu_unhealthy:
        lease["gpuUnhealthy"] = beat.gpu_unhealthy
    return lease
