"""The rules every archive member obeys, shared by the writer (refuse early) and the reader (refuse always).

A member name is a relative POSIX path with no `..` component; a symlink's target and a hardlink's
source, resolved lexically against the archive root, stay inside it. Whatever save writes, restore
accepts, so a checkpoint can never be taken that cannot be restored.
"""
from __future__ import annotations

import posixpath

from .errors import UnsafeArchive


def normalize_name(name: str) -> str:
    """The member's path relative to the target, or UnsafeArchive. `./a//b/` → `a/b`; `.` → ``."""
    if not name:
        raise UnsafeArchive(name, "empty member name")
    if "\x00" in name:
        raise UnsafeArchive(name, "NUL byte in member name")
    if name.startswith("/"):
        raise UnsafeArchive(name, "absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(name, "path contains '..'")
    return "/".join(parts)


def resolve_link(name: str, target: str) -> str | None:
    """Where a symlink at `name` pointing to `target` lands, relative to the root; None if outside."""
    if not target or target.startswith("/"):
        return None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".":
        return ""
    if resolved == ".." or resolved.startswith("../"):
        return None
    return resolved


def check_symlink(name: str, target: str) -> None:
    if not target:
        raise UnsafeArchive(name, "symlink with an empty target")
    if target.startswith("/"):
        raise UnsafeArchive(name, f"symlink to an absolute path ({target}) leaves the target")
    if resolve_link(name, target) is None:
        raise UnsafeArchive(name, f"symlink to {target} leaves the target")


def check_hardlink(name: str, target: str) -> str:
    """The normalized member a hardlink points at (it must be inside and already extracted)."""
    if not target or target.startswith("/"):
        raise UnsafeArchive(name, f"hardlink to an absolute path ({target}) leaves the target")
    parts = [p for p in target.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise UnsafeArchive(name, f"hardlink to {target} leaves the target")
    return "/".join(parts)


def under_symlink(name: str, symlinks: set[str]) -> str | None:
    """The first ancestor of `name` that is a symlink member, if any (writing through it is refused)."""
    if not symlinks:
        return None
    parts = name.split("/")
    for i in range(1, len(parts)):
        prefix = "/".join(parts[:i])
        if prefix in symlinks:
            return prefix
    return None
