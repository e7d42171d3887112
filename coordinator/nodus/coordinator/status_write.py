"""A controller's status write of an object it holds as stored: the Job controller's and the money
controller's write of a Job's status, the hottest write of the coordinator (two or three per Job).

The controller reads the object from its cache, which holds exactly what the store holds at the
object's `metadata.resourceVersion`, and decides a new status. A status PUT through the resource
service would read that object again (a store read on a reader thread), decode it, copy it three times
and compare; here what differs from the stored status is admitted as a status PUT's is (shape and
unknown fields: the rest was admitted when it was written), and the write is compare-and-swap on that
version in the store itself, so a Job that changed meanwhile still answers Conflict and a deleted one
NotFound (ADR 0060).
"""
from __future__ import annotations

from typing import Any, Callable

import orjson

from .api.admission import admit_status
from .api.kinds import KindInfo
from .errors import NodusError
from .store.base import Store


def admitted_status(info: KindInfo, stored: Any, status: Any) -> Any:
    """`status` admitted as a controller's status write over `stored` admits it: only what differs from `stored` is
    checked (the rest was admitted when it was written: a Job's status carries its ~2 KB estimate, which no
    controller changes)."""
    if isinstance(status, dict) and isinstance(stored, dict):
        changed = {k: v for k, v in status.items() if k not in stored or stored[k] != v}
        admitted = admit_status(info, {"status": changed}).object.get("status") or {}
        return {k: admitted[k] if k in changed else v for k, v in status.items() if k not in changed or k in admitted}
    return admit_status(info, {"status": status}).object.get("status")


async def write_status(store: Store, info: KindInfo, project: str, obj: dict[str, Any], status: Any,
                       conflict: Callable[[KindInfo, str], NodusError],
                       not_found: Callable[[KindInfo, str], NodusError]) -> dict[str, Any]:
    """Writes `status` over `obj`, the object as stored at its resourceVersion; returns the object as
    written (new containers for the object and its metadata: `obj` and what it shares with a cache are
    not changed), or `obj` itself when the admitted status is the one stored (nothing is written, as a
    status PUT that changes nothing). `conflict` and `not_found` build the errors the resource service
    answers for them."""
    name = obj["metadata"]["name"]
    written = status_document(info, obj, status)
    if written is None:
        return obj
    result, version = written
    try:
        rec = await store.update(f"{info.plural}/{project}/{name}", orjson.dumps(result), version)
    except NodusError as e:
        if e.reason == "Conflict":
            raise conflict(info, name) from None
        if e.reason == "NotFound":
            raise not_found(info, name) from None
        raise
    result["metadata"] = {**result["metadata"], "resourceVersion": str(rec.revision)}
    return result


def status_document(info: KindInfo, obj: dict[str, Any], status: Any) -> tuple[dict[str, Any], int] | None:
    """What `write_status` writes: the object with `status` admitted over it, without a resourceVersion (new
    containers for the object and its metadata), and the revision it was decided from; None when the admitted
    status is the one stored (nothing to write). Also a group write's Job (ADR 0127)."""
    name, version = obj["metadata"]["name"], obj["metadata"].get("resourceVersion")
    if not isinstance(version, str) or not version.isdigit():
        raise NodusError("Invalid", f'{info.kind} "{name}": a status write needs the metadata.resourceVersion '
                         f"it was decided from, not {version!r}", fix="pass the object as the cache holds it")
    stored = obj.get("status")
    status = admitted_status(info, stored, status)
    if status == stored:
        return None
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    result = {**obj, "metadata": meta, "status": status}
    if status is None:
        del result["status"]
    return result, int(version)
