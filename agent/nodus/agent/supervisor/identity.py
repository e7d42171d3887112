"""What a step of the process runtime starts with: the attempt's cgroup, an OOM score of 0 and the
attempt's user. The supervisor takes them on itself for the instant it starts the step, so the step
inherits them and `subprocess` starts it with vfork, with no Python between the fork and the exec
(ADR 0072). A `preexec_fn` that joined the cgroup and changed the user in the child forbade vfork:
every step paid for a copy of the supervisor's page tables and for Python running in the copy.

The way back is kept open: the supervisor's saved uid stays its own (root) while its real and
effective ids are the attempt's, and it leaves the attempt's cgroup for its own right after the
exec. `exec` makes the step's saved uid its effective one, so the step keeps no way back.
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..cgroups import DEFAULT_FS, Cgroup, own_paths

PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
"""prctl(2): <linux/prctl.h>."""
_LIBC = ctypes.CDLL(None, use_errno=True)
"""Loaded before any fork: a child between fork and exec must not dlopen."""
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def clear_ambient() -> None:
    """Empties the ambient capability set: under `SecureBits=keep-caps` it is what would survive an exec
    as another user."""
    if _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the ambient capabilities could not be cleared")


def own_cgroup(like: Cgroup, fs: Path = DEFAULT_FS) -> Cgroup:
    """The calling process's own cgroup directories, for each controller that `like` has."""
    found = own_paths(like.version, fs)
    missing = set(like.paths) - set(found)
    if missing:
        raise OSError(f"this process is in no cgroup of {', '.join(sorted(missing))}")
    return Cgroup(like.version, {c: found[c] for c in like.paths})


def _write(path: str, value: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


@dataclass(slots=True)
class AttemptIdentity:
    """The attempt's cgroup and user, and the supervisor's own to come back to."""

    cgroup: Cgroup
    origin: Cgroup
    """The supervisor's own cgroup directories (one per controller of `cgroup`)."""
    user: dict[str, Any] | None
    """{"uid", "gid", "groups"}, or None: steps run as the supervisor's user."""
    oom_score_adj: bytes
    """The supervisor's own (the unit's OOMScoreAdjust); a step gets 0."""
    ids: tuple[tuple[int, int, int], tuple[int, int, int], list[int], int]
    """The supervisor's (real, effective, saved) uids and gids, its groups and its dumpable flag."""

    @classmethod
    def of(cls, cgroup: Cgroup, user: dict[str, Any] | None) -> AttemptIdentity | None:
        """None where the supervisor could not come back from wearing it (steps then join in the child)."""
        if threading.active_count() != 1:
            return None  # setresuid changes every thread: only a single-threaded supervisor may wear it
        try:
            origin = own_cgroup(cgroup) if cgroup.usable else Cgroup(cgroup.version)
            origin.attach()  # where it is now: proves that the way back is open
            with open(OOM_SCORE_ADJ, "rb") as f:
                score = f.read().strip()
            _write(OOM_SCORE_ADJ, score)  # proves it may be set back (lowering needs CAP_SYS_RESOURCE or the min)
        except OSError:
            return None
        uids, gids = os.getresuid(), os.getresgid()
        if user is not None and uids[2] != 0:
            return None  # no saved root uid to come back with
        return cls(cgroup, origin, user, score, (uids, gids, os.getgroups(), _LIBC.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)))

    @contextmanager
    def worn(self) -> Iterator[None]:
        """The supervisor in the attempt's cgroup, with OOM score 0, as the attempt's user; itself again after."""
        if self.cgroup.usable:
            try:
                self.cgroup.attach()
            except OSError:
                pass  # run without rather than fail, as a step that joins in its child does
        try:
            if self.oom_score_adj != b"0":
                _write(OOM_SCORE_ADJ, b"0")  # the supervisor is protected from the OOM killer; its steps are not
            try:
                if self.user is None:
                    yield
                    return
                uid, gid = int(self.user["uid"]), int(self.user["gid"])
                clear_ambient()
                try:
                    os.setgroups(list(self.user.get("groups") or []))
                    os.setresgid(gid, gid, -1)
                    os.setresuid(uid, uid, -1)  # the saved uid stays root's: the way back
                    yield
                finally:
                    self._come_back()
            finally:
                if self.oom_score_adj != b"0":
                    _write(OOM_SCORE_ADJ, self.oom_score_adj)
        finally:
            if self.cgroup.usable:
                self.origin.attach()  # an OSError here ends the supervisor (LOST): it must not stay inside

    def _come_back(self) -> None:
        uids, gids, groups, dumpable = self.ids
        os.setresuid(*uids)
        os.setresgid(*gids)
        os.setgroups(groups)
        _LIBC.prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0)  # an id change made the supervisor undumpable
