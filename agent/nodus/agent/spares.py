"""Spare attempt directories: an ended attempt's tree, emptied to its bare directories, for the next
attempt (ADR 0095).

An attempt's directories cost the agent about 3 ms of CPU per index on an ext4 work dir (a mkdir is
~0.22 ms of CPU there, eight of them per attempt, and their rmdirs at forget): a quarter of what the agent
spends on a trivial index. A spare is renamed into place instead. What it held is gone first: every file
and every directory that is not part of the bare tree, whoever made them, and the bare directories are
the agent's own again, with the modes `AttemptLayout.make` gives them, before the spare is kept. So the
next attempt finds what `make` would have made; `own` then gives it to that attempt's user.

The pool lives beside `attempts/` (nothing that scans attempts/ sees it) and is emptied when the agent
starts: a spare an agent killed mid-way left is in no known state.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

KEEP = 32
"""Spares kept at most: more than a node's attempts in flight at once (bench/startup.py runs 16)."""
BARE = ("state", "inputs", "outputs", "run", "logs", "run/ready", "run/tmp", "run/checkpoint")
"""The directories a spare keeps (AttemptLayout.make's, and the checkpoint handshake's), parents first."""
GONE = frozenset({"volumes"})
"""Top-level entries of an attempt that go whole."""


def _forget_attributes(path: Path) -> None:
    """Removes what the ended attempt's user could leave on a directory it owned beyond its mode: POSIX ACLs
    (a named-user or default entry would let that uid, or whoever gets it next, into the next attempt's
    files) and user xattrs. security.* (labels the host sets) stay; trusted.* needs a privilege to set."""
    for name in os.listxattr(path, follow_symlinks=False):
        if not name.startswith("security."):
            os.removexattr(path, name, follow_symlinks=False)


def _default_mode() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return 0o777 & ~old


class SpareDirs:
    def __init__(self, root: Path, keep: int = KEEP) -> None:
        self.root = root
        self.keep = keep
        self._lock = threading.Lock()
        self._free: list[Path] = []
        self._made = 0
        self._mode = _default_mode()
        """What a mkdir gives a directory here (AttemptLayout.make's modes)."""
        self._owner = (os.geteuid(), os.getegid())
        shutil.rmtree(root, ignore_errors=True)  # a killed agent's spares are in no known state

    def __len__(self) -> int:
        return len(self._free)

    def take(self, root: Path) -> bool:
        """Renames a spare to `root` (which does not exist); False when none is kept."""
        with self._lock:
            if not self._free:
                return False
            spare = self._free.pop()
        try:
            os.rename(spare, root)
        except OSError:
            shutil.rmtree(spare, ignore_errors=True)
            return False
        return True

    def give(self, root: Path) -> bool:
        """Empties an ended attempt's tree `root` to its bare directories and keeps it as a spare. False
        (the caller removes what is left) when the pool is full, or the tree holds a top-level entry an
        attempt's layout does not have, or something of it could not be removed."""
        with self._lock:
            if len(self._free) >= self.keep:
                return False
            self._made += 1
            spare = self.root / str(self._made)
        try:
            top = set(os.listdir(root))
            if not top <= {*BARE, *GONE}:
                return False
            bare = {root / d for d in BARE}
            if any(path.is_symlink() or not path.is_dir() for path in bare):
                return False
            for path in (root, *bare):
                # The agent's first, so nothing of the ended attempt's user can add an entry behind the scan.
                os.chown(path, *self._owner, follow_symlinks=False)
                _forget_attributes(path)
                os.chmod(path, 0o700 if path == root / "run" else self._mode)
            for name in top & GONE:
                shutil.rmtree(root / name)
            for d in BARE:
                with os.scandir(root / d) as entries:
                    for entry in entries:
                        if Path(entry.path) in bare:
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path)
                        else:
                            os.unlink(entry.path)
            self.root.mkdir(exist_ok=True)
            os.rename(root, spare)
        except OSError:
            return False
        with self._lock:
            self._free.append(spare)
        return True
