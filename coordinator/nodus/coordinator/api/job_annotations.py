"""The annotations a Job's controller acts on, checked at admission like its fields.

`nodus.dev/checkpoint-requested-at` (`nodus checkpoint now JOB`) must be an RFC 3339 time, and only
a Job that keeps its state through checkpoints (spec.recovery.continuity Checkpointed, the default)
can be asked for one: anything else would wait for a checkpoint that never comes.
"""
from __future__ import annotations

from typing import Any

from .. import errors
from ..errors import Cause
from . import units

CHECKPOINT_REQUESTED = "nodus.dev/checkpoint-requested-at"


def causes(metadata: dict[str, Any], body: dict[str, Any]) -> list[Cause]:
    value = (metadata.get("annotations") or {}).get(CHECKPOINT_REQUESTED)
    if value is None:
        return []
    path = f"metadata.annotations[{CHECKPOINT_REQUESTED}]"
    try:
        units.parse_time(value)
    except ValueError:
        return [errors.invalid_value(path, value, units.TIME_HINT + " (`nodus checkpoint now JOB` writes one)")]
    continuity = ((body.get("spec") or {}).get("recovery") or {}).get("continuity") or "Checkpointed"
    if continuity != "Checkpointed":
        return [errors.forbidden(path, f"spec.recovery.continuity is {continuity}: this Job keeps no checkpoints "
                                       "to take one of")]
    return []
