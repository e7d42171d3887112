"""A uid (and the gid of the same number) per attempt, from a range the agent owns (ADR 0040).

The process runtime runs each attempt under its own uid so that the kernel's ordinary rules keep
attempts apart: another uid cannot open an attempt's 0700 directories and 0400 secret files, signal
its processes or ptrace them. The range (`--attempt-uids START:COUNT`, default 200000:65536) must be
the agent's alone: a passwd or group entry inside it, or the pods' user-namespace ids, is refused at
start.

The allocator records which attempt directory holds which uid in `<work>/uids.json` (temp file and
rename) before the uid owns anything, so a restarted agent gives a re-adopted attempt the same uid.
A uid is released when its attempt's directory is removed, and handed out again only after every
other uid of the range had its turn (round robin) and only when no process runs under it any more
(a program that left the attempt's cgroup with --cgroups false, say). A release reaches uids.json with
the next allocation's write, or `RELEASE_SAVE_DELAY` later when none comes (ADR 0102): a restarted agent
drops a record whose directory is gone, so the file may lag behind a release but never behind an allocation.
"""
from __future__ import annotations

import grp
import logging
import pwd
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .oci.bundle import ID_BASE, ID_RANGE, ID_SLOTS
from .settings import DEFAULT_ATTEMPT_UIDS as DEFAULT_RANGE
from .statefile import encode_json, read_json
from .swapfile import SwapFile

log = logging.getLogger("nodus.agent.uids")

# DEFAULT_RANGE lies above the usual 100000:65536 subuid block of the first host user, below the pods' ids.
OFF = "off"
"""`--attempt-uids off`: attempts run as the agent's own user (or --workload-user), as before ADR 0040."""
MAX_ID = (1 << 32) - 2
"""The last valid id ((uid_t)-1 is "no change" to setresuid)."""
RELEASE_SAVE_DELAY = 0.5
"""Seconds a release waits for an allocation to carry it to uids.json before it is written alone."""


class UidsExhausted(Exception):
    """Every uid of the range is held by an attempt or still runs a process."""


@dataclass(frozen=True, slots=True)
class UidRange:
    """START:COUNT: the uids (and gids) START … START+COUNT-1."""

    start: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "UidRange":
        """A ValueError names what is wrong and shows the form."""
        start, sep, count = str(text).strip().partition(":")
        if not sep or not start.isdigit() or not count.isdigit():
            raise ValueError(f"{text!r} is not START:COUNT (or {OFF}), for example {DEFAULT_RANGE}")
        rng = cls(int(start), int(count))
        if rng.start < 1 or rng.count < 1:
            raise ValueError(f"{text!r}: START and COUNT must be at least 1, for example {DEFAULT_RANGE}")
        if rng.last > MAX_ID:
            raise ValueError(f"{text!r}: the range ends at {rng.last}, past the last valid id {MAX_ID}")
        return rng

    @property
    def last(self) -> int:
        return self.start + self.count - 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.start}:{self.count}"

    def clashes(self, users: Iterable[tuple[str, int]] | None = None,
                groups: Iterable[tuple[str, int]] | None = None) -> list[str]:
        """What else on the host owns ids inside the range: passwd users, groups, the pods' user namespaces."""
        users = [(p.pw_name, p.pw_uid) for p in pwd.getpwall()] if users is None else users
        groups = [(g.gr_name, g.gr_gid) for g in grp.getgrall()] if groups is None else groups
        found = [f"user {name} (uid {uid})" for name, uid in users if uid in self]
        found += [f"group {name} (gid {gid})" for name, gid in groups if gid in self]
        pods_last = ID_BASE + ID_SLOTS * ID_RANGE - 1
        if self.start <= pods_last and ID_BASE <= self.last:
            found.append(f"the oci runtime's pod ids ({ID_BASE}-{pods_last})")
        return found

    def check(self) -> None:
        """Raises ValueError when the range is not the agent's alone (main.py turns it into a start error)."""
        found = self.clashes()
        if found:
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            raise ValueError(f"{self} overlaps {', '.join(found[:3])}{more}; give a range no passwd or group entry "
                             f"uses, such as {DEFAULT_RANGE}")


def blocked_ancestor(work_dir: Path) -> Path | None:
    """The first directory above `work_dir` that a uid other than its owner cannot pass through (no o+x):
    an attempt uid could not reach its own directory under it. None when every one lets it through."""
    for parent in work_dir.resolve().parents:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue  # made by the agent (0755)
        if not mode & stat.S_IXOTH:
            return parent
    return None


def uids_with_processes() -> set[int]:
    """Every real, effective and saved uid of a process on the host now."""
    import psutil  # here: main.py checks --attempt-uids before the daemon's heavy imports

    seen: set[int] = set()
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None:
            seen.update(uids)
    return seen


class AttemptUids:
    """Which attempt directory holds which uid of the range; safe to call from several threads."""

    def __init__(self, rng: UidRange, state_path: Path, attempts_dir: Path,
                 live: Callable[[], set[int]] = uids_with_processes,
                 release_save_delay: float = RELEASE_SAVE_DELAY) -> None:
        self.range = rng
        self.state_path = state_path
        self.file = SwapFile(state_path, 0o600, torn_ok=True)
        """Rewritten at every allocation: exchanged with its previous inode, not a new temp file (ADR 0112);
        torn by a host crash, it is rebuilt from the attempts' directories (__init__)."""
        self.attempts_dir = attempts_dir
        self.live = live
        """The uids that still run a process (the host's /proc, a scan of ~30 ms; tests pass their own)."""
        self._lock = threading.Lock()
        self.release_save_delay = release_save_delay
        self._released = False
        """A release no write has carried to the disk yet."""
        self._timer: threading.Timer | None = None
        """Writes `_released` when no allocation did by then; one per RELEASE_SAVE_DELAY at most, whatever the rate."""
        raw = read_json(state_path) or {}
        self.held: dict[str, int] = {str(k): int(v) for k, v in (raw.get("attempts") or {}).items()}
        """Attempt directory name -> its uid (the gid is the same number)."""
        self.next = int(raw.get("next") or rng.start)
        """Where the round robin goes on."""
        self.wrapped = bool(raw.get("wrapped")) or (bool(raw) and raw.get("range") != str(rng))
        """Whether uids at or past `next` were handed out before (the round robin went round, or the range
        changed): only then may a process still run under one, and only then is /proc scanned."""
        if self.next not in rng:
            self.next = rng.start
        changed = False
        for name in [n for n in self.held if not (attempts_dir / n).exists()]:
            del self.held[name]  # removed before its release reached the disk
            changed = True
        for d in attempts_dir.iterdir() if attempts_dir.is_dir() else ():
            # A host crash can lose the latest record (it is not fsynced: the attempts died with the host);
            # the directory's group still names the uid until the directory goes.
            gid = d.stat().st_gid
            if d.name not in self.held and gid in rng and gid not in self.held.values():
                self.held[d.name] = gid
                changed = True
        if changed:
            self._save()

    def uid_of(self, name: str) -> int | None:
        # Without the lock: one dict lookup is atomic, and allocate and release hold the lock while they
        # write uids.json, so a reader waited for their file writes (the agent's event loop among them,
        # through Checkpoints.restore_before_start; py-spy put 7 % of the agent's samples over 200 indexes here).
        return self.held.get(name)

    def allocate(self, name: str) -> int:
        """The uid of attempt directory `name`: the one it holds, else the next free one (recorded before it
        is returned). Raises UidsExhausted."""
        with self._lock:
            if name in self.held:
                return self.held[name]
            taken = set(self.held.values())
            rng = self.range
            live: set[int] | None = None
            for i in range(rng.count):
                uid = rng.start + (self.next - rng.start + i) % rng.count
                if uid in taken:
                    continue
                if self.wrapped or uid < self.next:  # handed out before: nothing of it may run any more
                    live = self.live() if live is None else live
                    if uid in live:
                        continue
                break
            else:
                raise UidsExhausted(f"all {rng.count} uids of --attempt-uids {rng} are held by attempts or still "
                                    f"run processes; widen the range")
            self.held[name] = uid
            if uid < rng.last:
                self.next = uid + 1
            else:
                self.next, self.wrapped = rng.start, True
            self._save()
            return uid

    def release(self, name: str) -> None:
        """Attempt directory `name` is gone: its uid may go to another attempt (once nothing of it runs)."""
        # Not written at once: the directory is gone, so a restarted agent drops the record anyway (__init__),
        # and on a busy node the next allocation, a few ms away, writes it (one rename per index saved).
        with self._lock:
            if self.held.pop(name, None) is None:
                return
            if self.release_save_delay <= 0:
                self._save()
                return
            self._released = True
            if self._timer is None:
                self._timer = threading.Timer(self.release_save_delay, self._save_releases)
                self._timer.daemon = True
                self._timer.start()

    def _save_releases(self) -> None:
        with self._lock:
            self._timer = None
            if self._released:
                self._save()

    def close(self) -> None:
        """Writes a release still pending (the agent stops)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._released:
                self._save()

    def _save(self) -> None:
        # Atomic, not fsynced: an agent killed keeps what the kernel has; a host crash ends the attempts,
        # and the directories' groups restore what it lost (__init__). Called with the lock held.
        self._released = False
        self.file.write(encode_json({"range": str(self.range), "next": self.next, "wrapped": self.wrapped,
                                     "attempts": self.held}), durable=False)
