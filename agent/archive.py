"""tar.zst archives of directories (outputs, volume revisions, code), streamed in both directions.

Packing hashes the compressed bytes as they are written, so an output's sha256 costs no second
read. Unpacking uses tarfile's `data` filter: no absolute paths, no `..`, no links that leave the
target, no device files.
"""
from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
MEDIA_TYPE = "application/zstd"


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def pack_dir(src: Path, dest: Path, level: int = 3) -> tuple[str, int]:
    """Archives the tree under `src` into `dest` (tar, zstd); returns (sha256 hex, size) of `dest`."""
    import zstandard

    with open(dest, "wb") as raw:
        hashing = _HashingWriter(raw)
        with zstandard.ZstdCompressor(level=level).stream_writer(hashing, closefd=False) as zw:  # type: ignore[arg-type]
            with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for dirpath, dirnames, filenames in os.walk(src):
                    dirnames.sort()
                    base = Path(dirpath)
                    for name in sorted(dirnames) + sorted(filenames):
                        path = base / name
                        tar.add(path, arcname=str(path.relative_to(src)), recursive=False)
        raw.flush()
        os.fsync(raw.fileno())
    return hashing.digest.hexdigest(), hashing.size


class UnsafeArchive(tarfile.TarError):
    """A member would land outside the target or is not a plain file, directory or link."""


def unpack(archive: Path, dest: Path) -> None:
    """Unpacks a tar.zst archive into `dest`, refusing anything that would land outside it."""
    import zstandard

    dest.mkdir(parents=True, exist_ok=True)
    with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr:
        with tarfile.open(fileobj=zr, mode="r|") as tar:
            for member in tar:
                name = member.name
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UnsafeArchive(f"archive member {name!r} would land outside the target")
                tar.extract(member, dest, filter="data")  # links leaving the target, devices: refused


def sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


