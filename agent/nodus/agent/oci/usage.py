"""What the image cache occupies, and which images go first when it must shrink (pure but for the walk)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator, Mapping


@dataclass(frozen=True, slots=True)
class Footprint:
    """One cached image as collection sees it."""

    digest: str
    blobs: frozenset[str]
    """The manifest, config and layer digests it needs (shared with other images where they match)."""
    rootfs_bytes: int
    """Its unpacked tree on disk."""
    last_used: float
    """Unix seconds of the last pull that asked for it."""


def evictions(images: Collection[Footprint], protected: Collection[str], excess: int,
              blob_bytes: Mapping[str, int]) -> Iterator[Footprint]:
    """Least recently used first, skipping `protected` digests, until what they alone hold covers
    `excess` bytes: each one's tree, and a blob once the last image needing it goes."""
    if excess <= 0:
        return
    kept = {f.digest: f for f in images}
    for victim in sorted((f for f in images if f.digest not in protected), key=lambda f: (f.last_used, f.digest)):
        del kept[victim.digest]
        still_needed: set[str] = set().union(*(f.blobs for f in kept.values()))
        excess -= victim.rootfs_bytes + sum(blob_bytes.get(b, 0) for b in victim.blobs - still_needed)
        yield victim
        if excess <= 0:
            return


def disk_usage(path: Path) -> int:
    """Bytes a tree occupies (allocated blocks, each hard-linked inode once, symlinks not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total
