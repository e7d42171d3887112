"""tar.zst archives of directories (outputs, volume revisions, code) for the agent: the checkpoint
library's archives (nodus.checkpoint), so every archive Nodus writes or reads has one format and one
set of refusals.

Packing hashes the compressed bytes as they are written, so an output's sha256 costs no second
read. Unpacking refuses absolute paths, `..`, links that leave the target and device files.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nodus.checkpoint import archive
from nodus.checkpoint.restore import restore

CHUNK = 1 << 20
MEDIA_TYPE = "application/zstd"


def pack_dir(src: Path, dest: Path, level: int = 3) -> tuple[str, int]:
    """Archives the tree under `src` into `dest` (tar, zstd); returns (sha256 hex, size) of `dest`."""
    plan = archive.scan(["."], root=src)
    with open(dest, "wb") as raw:
        info = archive.write(plan, raw, level=level)
        raw.flush()
        os.fsync(raw.fileno())
    return info.sha256, info.size


def unpack(path: Path, dest: Path) -> None:
    """Unpacks a tar.zst archive into `dest`, refusing anything that would land outside it."""
    restore(path, dest)


def sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
