"""The one core-group (`/api/v1`) kind the coordinator serves: Events, read-only, written by the
controllers (controllers/events.py), so `kubectl describe job.nodus.dev NAME` and `kubectl get events`
show a Job's story. Only Events: `secrets` and every other name still resolve to nodus.dev kinds."""
from __future__ import annotations

from typing import Any

from ..errors import NodusError
from .kinds import Column, KindInfo


def _get(obj: dict[str, Any], *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _object(obj: dict[str, Any]) -> str:
    return f"{str(_get(obj, 'involvedObject', 'kind') or '').lower()}/{_get(obj, 'involvedObject', 'name') or ''}"


EVENT = KindInfo(
    "Event", "events", "event", "", "v1", ("ev",), (), True, False, (
        Column("Last Seen", "date", "Last Seen is when it last happened.", 0, lambda o: o.get("lastTimestamp")),
        Column("Type", "string", "Type is Normal or Warning.", 0, lambda o: o.get("type")),
        Column("Reason", "string", "Reason is what happened, in one word.", 0, lambda o: o.get("reason")),
        Column("Object", "string", "Object is what it happened to.", 0, _object),
        Column("Message", "string", "Message says what happened.", 0, lambda o: o.get("message")),
        Column("Count", "integer", "Count is how many times.", 1, lambda o: o.get("count")),
    ), read_only=True,
    fields=("involvedObject.kind", "involvedObject.name", "involvedObject.namespace", "involvedObject.uid",
            "involvedObject.apiVersion", "reason", "type"))

CORE_KINDS: tuple[KindInfo, ...] = (EVENT,)


def resolve_core(plural: str) -> KindInfo:
    for info in CORE_KINDS:
        if plural == info.plural:
            return info
    raise NodusError("NotFound", f'the server doesn\'t have a resource type "{plural}" in the core group',
                     fix="the core group serves only events; use the nodus.dev kinds (kubectl api-resources)")
