"""Node-scoped access (the Kubernetes Node authorizer's rule, docs/adr/0045): a node reaches only the blobs,
logs and checkpoints of the attempts placed on it, and only while they run.

Every BlobService call names its attempt. The attempt must be placed on the calling node (the node its
certificate names) and not have ended; a write (an output or checkpoint upload, a log chunk) is allowed for
`grace` seconds after the attempt's finishTime, for the log's last chunk and eof that the agent ships after
it reports the end. A read must be of a blob the attempt's Assignment names: an input (a blob URL, a
pinned volume revision, another Job's committed output), a volume mount's revision, its source blob, a
checkpoint of its index's lineage (what it restores; Dcp parts included), or one of its own outputs.
Anything else is NodeScope (PERMISSION_DENIED), naming the attempt, the blob and why.

The rule reads the watch-fed cache the agents' streams read, so it agrees with what the node was assigned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .clock import Clock, parse
from .controllers import checkpoints as rules
from .controllers.attempts import phase_of
from .controllers.cache import Cache
from .errors import NodusError

GRACE_SECONDS = 120.0
"""How long after its finishTime an ended attempt's node may still write its log and uploads."""

_BLOB_URI = "blob://sha256/"


@dataclass(frozen=True, slots=True)
class Access:
    """What a call does: a read of `digest` (Get, Stat), or a write (Put, AppendLog: `digest` empty)."""

    verb: str
    digest: str = ""

    @property
    def writes(self) -> bool:
        return not self.digest


def _denied(message: str, attempt_id: str) -> NodusError:
    return NodusError("NodeScope", message, name=attempt_id, kind="attempts")


class NodeScope:
    def __init__(self, cache: Cache, clock: Clock, grace: float = GRACE_SECONDS) -> None:
        self.cache, self.clock, self.grace = cache, clock, grace

    def check(self, node: str, attempt_id: str, access: Access) -> dict[str, Any]:
        """The attempt, when `node` may do `access` for it; NodeScope otherwise."""
        if not attempt_id:
            raise _denied(f"{access.verb} names no attempt: node {node} reaches only the blobs of its attempts",
                          attempt_id) from None
        attempt = self.cache.attempt_by_id(attempt_id)
        if attempt is None or (attempt.get("spec") or {}).get("node") != node:
            # Whether it exists elsewhere is not this node's business.
            raise _denied(f"attempt {attempt_id} is not placed on node {node}", attempt_id)
        if phase_of(attempt).terminal:
            finished = parse((attempt.get("status") or {}).get("finishTime"))
            within = finished is not None and self.clock.now() - finished <= self.grace
            if not (access.writes and within):
                phase = (attempt.get("status") or {}).get("phase", "")
                raise _denied(f"attempt {attempt_id} has ended ({phase}): node {node} may no longer "
                              f"{'write its logs and uploads' if access.writes else 'read its blobs'}", attempt_id)
        if not access.writes and access.digest not in set(self.readable(attempt)):
            raise _denied(f"blob {access.digest} is not one attempt {attempt_id} reads (its inputs, volumes, "
                          "source, checkpoint lineage and outputs)", attempt_id)
        return attempt

    def readable(self, attempt: dict[str, Any]) -> Iterator[str]:
        """Every blob digest the attempt's Assignment names, and its own outputs."""
        project, spec = attempt["metadata"]["namespace"], attempt.get("spec") or {}
        for out in (attempt.get("status") or {}).get("outputs") or []:
            yield str(out.get("sha256") or "")
        job = self.cache.job(project, spec.get("job", ""))
        if job is None or (job.get("metadata") or {}).get("uid") != spec.get("jobUID"):
            return
        job_spec, status = job.get("spec") or {}, job.get("status") or {}
        for pinned in status.get("inputs") or []:
            if isinstance(pinned, dict) and pinned.get("sha256"):
                yield str(pinned["sha256"])  # a volume input's revision
        for item in job_spec.get("inputs") or []:
            url = str((item.get("url") or {}).get("url") or "").strip().lower()
            if url.startswith(_BLOB_URI):
                yield url[len(_BLOB_URI):]
            ref = item.get("output")
            if ref:
                producer = self.cache.job(project, ref.get("job", "")) or {}
                for out in (producer.get("status") or {}).get("outputs") or []:
                    if out.get("name") == ref.get("name") and int(out.get("index") or 0) == int(ref.get("index") or 0):
                        yield str(out.get("sha256") or "")
        for volume in status.get("volumes") or []:
            yield str(volume.get("sha256") or "")
        source = (job_spec.get("source") or {}).get("blob")
        if source:
            yield str(source).removeprefix("sha256:")
        lineage = rules.index_attempts(
            self.cache.attempts_of_index(project, spec.get("job", ""), int(spec.get("index", 0))),
            spec.get("jobUID", ""), int(spec.get("index", 0)))
        for record in rules.committed(lineage):
            yield str(record.get("sha256") or "")
            for part in record.get("parts") or []:
                yield str(part.get("sha256") or "")
