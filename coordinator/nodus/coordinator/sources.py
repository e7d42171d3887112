"""A Job's `source.git` resolved, at admission, to the commit every attempt checks out.

`git ls-remote` asks the repository which commit the ref names now (a branch, a tag, peeled to its
commit, or HEAD when no ref is given); a full 40-hex commit is taken as written. The answer goes into
`status.source.commit`, and the Assignment of every attempt, replacements included, carries that
commit, so a branch that moves after admission never changes what a Job runs. A ref the repository
does not have, or a repository that cannot be read, is refused at admission naming the field and
git's own words (credentials in a URL are never echoed).
"""
from __future__ import annotations

import asyncio
import os
import re
from typing import Any

import orjson

from .errors import NodusError
from .store.base import Store

FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")
LS_REMOTE_TIMEOUT = 20.0


class SourceRefused(Exception):
    """Why a source cannot be resolved: the spec field to change and what to say."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def repo_url(repo: str) -> str:
    """spec.source.git.repo as a URL git reads: an https:// or git:// URL as written, owner/name on GitHub."""
    return repo if repo.startswith(("https://", "git://")) else f"https://github.com/{repo}"


def _quiet(text: str) -> str:
    """git's last line, without credentials a URL may carry."""
    last = (text.strip().splitlines() or [""])[-1]
    return re.sub(r"://[^/@\s]+@", "://", last)


async def resolve(repo: str, ref: str = "", timeout: float = LS_REMOTE_TIMEOUT,
                  auth: dict[str, str] | None = None) -> str:
    """The commit `ref` names in `repo` now; `auth` is git's environment for a private repository
    (git_access.git_env)."""
    if FULL_COMMIT.match(ref):
        return ref
    url = repo_url(repo)
    try:
        proc = await asyncio.create_subprocess_exec(
            "git", "ls-remote", "--", url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", **(auth or {})})
    except OSError as e:
        raise SourceRefused("spec.source.git.repo", f"git is not available on the coordinator: {e.strerror or e}")
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SourceRefused("spec.source.git.repo", f"{_quiet(url)} did not answer git ls-remote in {timeout:g}s")
    if proc.returncode != 0:
        raise SourceRefused("spec.source.git.repo", f"git ls-remote {_quiet(url)} failed: "
                                                    f"{_quiet(err.decode(errors='replace'))}")
    refs: dict[str, str] = {}
    for line in out.decode(errors="replace").splitlines():
        commit, _, name = line.partition("\t")
        if FULL_COMMIT.match(commit):
            refs[name] = commit
    wanted = ref or "HEAD"
    for name in (f"refs/tags/{wanted}^{{}}", f"refs/tags/{wanted}", f"refs/heads/{wanted}", wanted):
        if name in refs:
            return refs[name]
    raise SourceRefused("spec.source.git.ref",
                        f"{wanted!r} is no branch or tag of {_quiet(url)} (a commit must be written in full, "
                        "40 hexadecimal digits)")


# -- uploaded sources (spec.source.blob) -------------------------------------------------------------
# `nodus source push DIR` uploads a tar.zst of DIR into the blob store; the project's record of it,
# `_sources/<project>/<sha256>`, is what admission checks (a blob another project pushed, or one never
# pushed, is refused naming spec.source.blob) and what holds the blob against collection.

def source_key(project: str, sha256: str) -> str:
    return f"_sources/{project}/{sha256}"


async def record_upload(store: Store, project: str, sha256: str, size: int, files: int, now: str) -> bool:
    """Records that `project` pushed the source `sha256`; False when it already had."""
    doc = {"sha256": f"sha256:{sha256}", "size": size, "files": files, "createTime": now}
    try:
        await store.create(source_key(project, sha256), orjson.dumps(doc))
    except NodusError as e:
        if e.reason != "AlreadyExists":
            raise
        return False
    return True


async def uploaded(store: Store, project: str, sha256: str) -> dict[str, Any] | None:
    """The project's record of the pushed source `sha256`, or None."""
    rec = await store.get(source_key(project, sha256))
    return None if rec is None else dict(orjson.loads(rec.value))
