"""The volume service: a Volume's revisions, appended and looked up (api/volume.py says what they are).

The REST gateway receives the archive and streams it back; what a revision is, how one is appended
(compare-and-swap on the Volume's status, as the system caller) and which one a name means are here.
"""
from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path
from typing import Any

from .api.kinds import resolve
from .api.volume import find_revision, latest_ready
from .blobs import BlobRef
from .errors import NodusError
from .identity import SYSTEM, Caller, Role
from .resources import ResourceService, utc_now

_MAX_REVISION_RETRIES = 8


class VolumeService:
    def __init__(self, service: ResourceService) -> None:
        self.service = service
        self.info = resolve("volumes")

    def authorize_push(self, caller: Caller, project: str) -> None:
        """Pushing a revision needs the editor role in the project."""
        if not caller.can(project, Role.EDITOR):
            raise NodusError("Forbidden", f'volumes.nodus.dev is forbidden: User "{caller.subject}" cannot create '
                             f'resource "volumes/revisions" in API group "nodus.dev" in the namespace "{project}"',
                             kind="volumes", group="nodus.dev", fix=f"use a token with the editor role in project {project}")

    async def ensure(self, caller: Caller, project: str, name: str) -> bool:
        """Creates the Volume on its first push; True when this call created it."""
        info = self.info
        try:
            await self.service.get(caller, info, project, name)
            return False
        except NodusError as e:
            if e.reason != "NotFound":
                raise
        body = {"apiVersion": info.api_version, "kind": info.kind, "metadata": {"name": name}, "spec": {}}
        try:
            await self.service.create(caller, info, project, body)
            return True
        except NodusError as race:
            if race.reason != "AlreadyExists":  # a concurrent first push created it: fine
                raise
            return False

    async def append_revision(self, project: str, name: str, ref: BlobRef, files: int,
                              from_attempt: str = "") -> tuple[dict[str, Any], bool]:
        """Appends `ref` as the next revision (as the system caller, compare-and-swap); the same content
        as the latest revision adds none. `from_attempt` names the Attempt whose writable mount it is
        (volume_commits.py): a second call for the same attempt (a restart between the append and its
        record) answers the revision it added the first time."""
        info = self.info
        for _ in range(_MAX_REVISION_RETRIES):
            volume = await self.service.get(SYSTEM, info, project, name)
            status = dict(volume.get("status") or {})
            revisions = list(status.get("revisions") or [])
            if from_attempt:
                done = next((r for r in revisions if isinstance(r, dict) and r.get("fromAttempt") == from_attempt),
                            None)
                if done is not None:
                    return done, False
            latest = latest_ready(volume)
            if latest is not None and latest.get("sha256") == ref.sha256:
                return latest, False
            number = max((r.get("revision") or 0 for r in revisions if isinstance(r, dict)), default=0) + 1
            entry = {"revision": number, "sha256": ref.sha256, "size": ref.size, "files": files,
                     "createTime": utc_now(), "phase": "Ready"}
            if from_attempt:
                entry["fromAttempt"] = from_attempt
            volume["status"] = {**status, "revisions": revisions + [entry], "latestRevision": number}
            try:
                await self.service.replace(SYSTEM, info, project, name, volume, subresource="status")
                return entry, True
            except NodusError as e:
                if e.reason != "Conflict":
                    raise
        raise NodusError("Conflict", f'volume "{name}" kept changing while a revision was added',
                         name=name, kind="volumes", group="nodus.dev", fix="push again")

    async def revision(self, caller: Caller, project: str, name: str, text: str) -> dict[str, Any]:
        """The revision `text` names ("latest" or a number); NotFound when there is none."""
        volume = await self.service.get(caller, self.info, project, name)
        chosen = latest_ready(volume) if text == "latest" else (
            find_revision(volume, int(text)) if text.isdigit() else None)
        if chosen is None:
            latest = (volume.get("status") or {}).get("latestRevision")
            raise NodusError("NotFound", f'volume "{name}" has no revision {text}', name=name, kind="volumes",
                             group="nodus.dev", fix=f"the latest revision is {latest}" if latest else
                             f"push one with `nodus volume push {name} DIR`")
        return chosen


def inspect_archive(path: Path) -> int:
    """The number of regular files in a tar.zst archive; BadRequest for anything else, or for a member
    that would land outside the directory it is unpacked into."""
    import zstandard

    files = 0
    try:
        with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    name = member.name
                    if name.startswith("/") or ".." in name.split("/"):
                        raise NodusError("BadRequest", f"the archive member {name!r} leaves the volume",
                                         fix="archive the directory with relative paths (`nodus volume push`)")
                    if member.isdev():
                        raise NodusError("BadRequest", f"the archive member {name!r} is a device file",
                                         fix="leave device files out of the volume")
                    if member.issym() or member.islnk():
                        base = posixpath.dirname(name) if member.issym() else ""
                        target = posixpath.normpath(posixpath.join(base, member.linkname))
                        if member.linkname.startswith("/") or target.split("/")[0] == "..":
                            raise NodusError("BadRequest", f"the archive member {name!r} links outside the volume "
                                             f"({member.linkname})", fix="replace the link with the file it names")
                    if member.isfile():
                        files += 1
    except (zstandard.ZstdError, tarfile.TarError, EOFError) as e:
        raise NodusError("BadRequest", f"the body is not a tar.zst archive: {e}",
                         fix="send a tar archive compressed with zstd (`tar --zstd -cf - -C DIR .`), "
                             "or use `nodus volume push NAME DIR`") from None
    return files
