"""meta.k8s.io/v1 Tables, so `kubectl get` prints useful columns."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..api.kinds import KindInfo


def human_duration(seconds: float) -> str:
    """Kubernetes' HumanDuration: the AGE column's wording."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    if y < 8:
        return f"{y}y{d % 365}d" if d % 365 else f"{y}y"
    return f"{y}y"


def _age(timestamp: Any, now: datetime) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((now - then).total_seconds())


def column_definitions(info: KindInfo) -> list[dict[str, Any]]:
    cols = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
             "description": "Name must be unique within a project."}]
    cols += [{"name": c.name, "type": c.type, "format": "", "priority": c.priority, "description": c.description}
             for c in info.columns]
    return cols


def row(info: KindInfo, obj: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(timezone.utc)
    cells: list[Any] = [obj.get("metadata", {}).get("name", "")]
    for c in info.columns:
        try:
            value = c.cell(obj)
        except (KeyError, TypeError, IndexError, AttributeError):
            value = None
        if c.type == "date":
            value = _age(value, now)
        cells.append("<none>" if value is None or value == "" else value)
    meta = obj.get("metadata", {})
    return {"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                       "metadata": meta}}


def table(info: KindInfo, objs: list[dict[str, Any]], list_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": column_definitions(info), "rows": [row(info, o, now) for o in objs]}


def wants_table(accept: str) -> bool:
    """True when the client's first acceptable form is a Table (kubectl get asks so)."""
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip()
                  for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
        if part.strip().startswith(("application/json", "*/*")):
            return False
    return False
