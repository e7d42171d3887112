"""The Job spec's aliases and shorthands, folded into their stored form before decoding (`H100:1`,
resources.nodes, activeDeadlineSeconds, secret names), and the defaults that depend on other fields.
Sweep, TrainingJob and TrainingRuntime fold their specs with the same functions."""
from __future__ import annotations

import re
from typing import Any

from .. import errors
from ..errors import Cause
from . import units
from .schema import get

_GPU_SHORTHAND = re.compile(r"^([A-Za-z0-9._-]+)(?::([0-9]+))?$")


def fold_gpu(value: Any, path: str) -> tuple[Any, list[Cause]]:
    """`"H100:1"` → `{"type": ["H100"], "count": 1}`, the shorthand the spec pages use; others unchanged."""
    if not isinstance(value, str):
        return value, []
    m = _GPU_SHORTHAND.match(value)
    if m is None:
        return value, [errors.invalid_value(path, value, 'must be an object or the shorthand "TYPE:COUNT" such as "H100:1"')]
    return {"type": [m.group(1)]} | ({"count": int(m.group(2))} if m.group(2) else {}), []


def fold_resources(spec: dict[str, Any], at: str, *, has_distributed: bool = True) -> list[Cause]:
    """resources.nodes > 1 becomes distributed.nodes; resources.nodes = 1 is dropped."""
    resources = spec.get("resources")
    if not isinstance(resources, dict):
        return []
    causes: list[Cause] = []
    if "gpu" in resources:
        resources["gpu"], causes = fold_gpu(resources["gpu"], f"{at}.resources.gpu")
    nodes = resources.get("nodes")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        return causes  # decoding reports the type or range
    if nodes == 1:
        del resources["nodes"]
        return causes
    if not has_distributed:
        return causes
    dist = spec.get("distributed")
    if dist is None:
        spec["distributed"] = {"nodes": nodes}
    elif isinstance(dist, dict):
        if dist.get("totalGPUs") is not None:
            return causes + [errors.invalid_value(f"{at}.resources.nodes", nodes,
                                                  f"conflicts with {at}.distributed.totalGPUs (exactly one of nodes and totalGPUs)")]
        if dist.get("nodes") is not None and dist["nodes"] != nodes:
            return causes + [errors.invalid_value(f"{at}.resources.nodes", nodes,
                                                  f"conflicts with {at}.distributed.nodes ({dist['nodes']})")]
        dist["nodes"] = nodes
    else:
        return causes
    del resources["nodes"]
    return causes


def fold_spec(spec: Any, at: str = "spec") -> list[Cause]:
    """The Job's aliases, folded into their stored form before decoding."""
    if not isinstance(spec, dict):
        return []
    causes: list[Cause] = []
    ads = spec.get("activeDeadlineSeconds")
    if isinstance(ads, int) and not isinstance(ads, bool) and ads >= 1:
        folded = units.format_duration(ads * units.NS_PER_SECOND)
        timeout = spec.get("timeout")
        if timeout is None:
            spec["timeout"] = folded
            del spec["activeDeadlineSeconds"]
        else:
            try:
                same = units.parse_duration_ns(timeout) == ads * units.NS_PER_SECOND
            except ValueError:
                same = True  # timeout's own error is reported by decoding
            if same:
                del spec["activeDeadlineSeconds"]
            else:
                causes.append(errors.invalid_value(f"{at}.activeDeadlineSeconds", ads,
                                                   f"conflicts with {at}.timeout ({errors.render_value(timeout)})"))
    causes += fold_resources(spec, at)
    secrets = spec.get("secrets")
    if isinstance(secrets, list):
        spec["secrets"] = [{"name": s} if isinstance(s, str) else s for s in secrets]
    return causes


def complete_spec(spec: dict[str, Any]) -> None:
    """Defaults that depend on other fields: the checkpoint format is Dcp for a distributed Job."""
    checkpoint = get(spec, "recovery.checkpoint")
    if isinstance(checkpoint, dict) and "format" not in checkpoint:
        checkpoint["format"] = "Dcp" if "distributed" in spec else "Snapshot"


def effective_image(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """The image the Job's attempts run: spec.image, or for spec.imageRef (an image of the project's own
    list, `nodus image push`) the operator registry's reference admission resolved it to (status.image)."""
    if spec.get("image"):
        return str(spec["image"])
    if spec.get("imageRef"):
        return str((status.get("image") or {}).get("reference") or "")
    return ""
