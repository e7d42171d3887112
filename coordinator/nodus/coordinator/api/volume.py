"""Volume (nodus.dev/v1): a named dataset with immutable, numbered revisions.

A revision is one tar.zst archive in the blob store. Customers upload one with
`POST …/volumes/NAME/revisions` (`nodus volume push NAME DIR`); the coordinator stores the blob, then
appends `{revision, sha256, size, files, createTime, phase}` to `status.revisions` and moves
`status.latestRevision`, through the status subresource as the system caller. The spec holds only a
description. Jobs name a Volume in `spec.inputs[].volume` or `spec.volumes[]`; Job admission pins the
revision (see `resolve_volumes` in job.py).
"""
from __future__ import annotations

from typing import Any

from ..errors import Cause
from .limits import AdmissionLimits
from .schema import Int, KindSchema, List, Obj, Str

PHASES = ("Ready",)
"""Ready: the archive is stored and may be mounted. (Uploads are stored before a revision exists, so
there is no Uploading phase yet; a multipart upload would add one.)"""

VOLUME_SPEC = Obj(description="VolumeSpec describes the dataset.", fields={
    "description": Str(description="Description says what the dataset holds.", max_length=1024),
})

REVISION = Obj(description="VolumeRevision is one immutable version of the content.", fields={
    "revision": Int(description="Revision numbers the versions from 1."),
    "sha256": Str(description="SHA256 is the digest of the tar.zst archive."),
    "size": Int(description="Size is the archive's size in bytes."),
    "files": Int(description="Files is the number of regular files in the archive."),
    "createTime": Str(description="CreateTime is when the revision was stored (RFC 3339)."),
    "phase": Str(description="Phase is Ready once the archive is stored.", enum=PHASES),
    "fromAttempt": Str(description="FromAttempt names the Attempt whose writable mount (readOnly: false) committed "
                                   "this revision when its index succeeded; unset for a push."),
})

VOLUME_STATUS = Obj(description="VolumeStatus lists the stored revisions.", fields={
    "latestRevision": Int(description="LatestRevision is the newest Ready revision; Jobs that name no revision pin "
                                      "it at admission."),
    "revisions": List(description="Revisions are the stored revisions, oldest first. They never change.",
                      items=REVISION),
})


def _no_rules(body: dict[str, Any], limits: AdmissionLimits) -> list[Cause]:
    return []


def latest_ready(volume: dict[str, Any]) -> dict[str, Any] | None:
    """The newest Ready revision of a stored Volume, or None."""
    revisions = [r for r in (volume.get("status") or {}).get("revisions") or []
                 if isinstance(r, dict) and r.get("phase", "Ready") == "Ready"]
    return max(revisions, key=lambda r: r.get("revision", 0), default=None)


def find_revision(volume: dict[str, Any], revision: int) -> dict[str, Any] | None:
    for r in (volume.get("status") or {}).get("revisions") or []:
        if isinstance(r, dict) and r.get("revision") == revision:
            return r
    return None


VOLUME = KindSchema(
    kind="Volume",
    description="Volume is a named dataset with immutable revisions. Jobs mount a revision read-only or use it as "
                "an input; `nodus volume push NAME DIR` uploads a new revision.",
    body=Obj(fields={"spec": VOLUME_SPEC}),
    status=VOLUME_STATUS,
    rules=_no_rules,
    mutable=("spec",),
)

__all__ = ["VOLUME", "VOLUME_STATUS", "PHASES", "latest_ready", "find_revision"]
