"""A writable volume mount becomes the Volume's next revision when its index succeeds (issue 16 item 3).

A mount with `readOnly: false` starts from the revision admission pinned (the latest Ready one then);
the agent hands what the program left there back as an output named `nodus.volume.<volume>`
(controllers/assignment.py: VOLUME_OUTPUT), uploaded and verified like every output, and only when the
attempt Succeeded. This executor appends it to the Volume (`VolumeService.append_revision`, a
compare-and-swap on its status): of two writers, the later commit gets the next revision and both
are kept; content equal to the latest revision adds none. The attempt records what it committed in
`status.volumeCommits` ([{volume, revision}]); the revision records its attempt (`fromAttempt`), so a
coordinator restarted between the two appends nothing twice. A failed, lost or cancelled attempt
commits nothing: its replacement starts again from the pinned revision.

Level-triggered on the cache's Attempt events, with a periodic resync.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from .blobs import BlobRef, Blobs
from .controllers.assignment import VOLUME_OUTPUT
from .controllers.attempts import AttemptPhase, phase_of
from .controllers.cache import ATTEMPTS, Cache
from .controllers.objects import Objects
from .controllers.workqueue import WorkQueue, run_workers
from .errors import NodusError
from .volumes import VolumeService, inspect_archive

log = logging.getLogger("nodus.volume_commits")

RESYNC_SECONDS = 60.0


def pending_commits(attempt: dict[str, Any]) -> list[dict[str, Any]]:
    """The writable-volume outputs of a Succeeded attempt not yet committed (pure)."""
    if phase_of(attempt) is not AttemptPhase.SUCCEEDED:
        return []
    status = attempt.get("status") or {}
    done = {str(c.get("volume")) for c in status.get("volumeCommits") or [] if isinstance(c, dict)}
    return [o for o in status.get("outputs") or [] if isinstance(o, dict)
            and str(o.get("name", "")).startswith(VOLUME_OUTPUT)
            and str(o["name"])[len(VOLUME_OUTPUT):] not in done]


class VolumeCommits:
    def __init__(self, cache: Cache, objects: Objects, volumes: VolumeService, blobs: Blobs) -> None:
        self.cache, self.objects, self.volumes, self.blobs = cache, objects, volumes, blobs
        self.queue: WorkQueue[str] = WorkQueue()
        cache.listen(ATTEMPTS, self._on_attempt)

    def _on_attempt(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and pending_commits(new):
            self.queue.add(key)

    def resync(self) -> None:
        for key, attempt in self.cache.under(ATTEMPTS):
            if pending_commits(attempt):
                self.queue.add(key)

    async def run(self) -> None:
        await self.cache.synced.wait()
        await run_workers(self.queue, self.reconcile, workers=1, resync=self.resync,
                          resync_seconds=RESYNC_SECONDS, log=log, name="volume-commits")

    async def reconcile(self, key: str) -> None:
        attempt = self.cache.get(key)
        if attempt is None:
            return
        project, name = attempt["metadata"].get("namespace", ""), attempt["metadata"]["name"]
        for output in pending_commits(attempt):
            volume = str(output["name"])[len(VOLUME_OUTPUT):]
            digest = str(output.get("sha256", "")).removeprefix("sha256:")
            ref = BlobRef(digest, int(output.get("size") or 0))
            async with self.blobs.local_copy(digest) as path:
                files = await asyncio.to_thread(inspect_archive, path)
            try:
                revision, added = await self.volumes.append_revision(project, volume, ref, files,
                                                                     from_attempt=name)
            except NodusError as e:
                if e.reason != "NotFound":
                    raise
                revision, added = {"revision": 0}, False  # recorded below with why: nothing to append to
            message = "" if revision["revision"] else f'Volume "{volume}" was deleted while the attempt ran; ' \
                "what it wrote to the mount is not kept"
            if message:
                log.warning("attempt %s/%s: %s", project, name, message)
            if added:
                log.info("attempt %s/%s committed volume %s revision %s", project, name, volume, revision["revision"])

            def mutate(obj: dict[str, Any], volume: str = volume, number: int = int(revision["revision"]),
                       message: str = message) -> dict[str, Any] | None:
                status = obj.setdefault("status", {})
                commits = [c for c in status.get("volumeCommits") or [] if c.get("volume") != volume]
                entry: dict[str, Any] = {"volume": volume, "revision": number}
                if message:
                    entry["message"] = message
                status["volumeCommits"] = commits + [entry]
                return obj
            await self.objects.mutate(key, mutate)
