"""The coordinator's checkpoint service: commits from agents, fenced, and what an assignment restores.

Archives live in the embedded blob store (`blob://sha256/<hex>`: every node reads the same
checkpoints) or in a customer's bucket; the commit record (the manifest's fields: seq, time, size,
sha256, paths, attempt, epoch, format, pause, reason) is written on the Attempt that took it, in the
same compare-and-swap that checks the fence, so a commit from a superseded attempt or an older epoch
can never become the latest (controllers/checkpoints.py says what is refused). The Job controller
derives `status.checkpoint` and `status.storage` from there.

One module per responsibility: `commit` (commit and fencing), `locations` (where checkpoints go and
the store credentials), `restore` (an assignment's policy and restore point, the Suspend), `reclaim`
(preemption notices), `cadence` (periodic requests), `retention` (deleting what is due). The names
callers use are gathered here, with `rules`, the pure decisions (controllers/checkpoints.py).
"""
from __future__ import annotations

from ..controllers import checkpoints as rules
from .cadence import CADENCE_TICK, Mtbi, due_requests
from .commit import FORMATS, REASONS, commit, commit_of, suspend_failed
from .locations import BLOB_URI, Read, checkpoint_store, connection_fields, connection_of, reader
from .reclaim import reclaim
from .restore import prepare, suspend_message
from .retention import RETENTION_TICK, Blobs, Retention, delete_s3

__all__ = ["BLOB_URI", "CADENCE_TICK", "FORMATS", "REASONS", "RETENTION_TICK", "Blobs", "Mtbi", "Read", "Retention",
           "checkpoint_store", "commit", "commit_of", "connection_fields", "connection_of", "delete_s3",
           "due_requests", "prepare", "reader", "reclaim", "rules", "suspend_failed", "suspend_message"]
