"""A scratch ext4 filesystem for file-heavy benches, made with mkfs.ext4's defaults on a loop device.

Why (bench/README.md, "Checkpoints"): this machine's root filesystem is ext4 without a journal, and on it a
file created within a minute or so of deleting a few hundred MB costs about 1 ms of kernel time (2,000
small 4 KiB files: 0.18 s on a fresh tree, 2.2-2.5 s right after a 360 MB tree was deleted, for any
program). A bench that deletes each step's output before the next step measures that artifact more than
the programs. An ext4 made with mkfs.ext4's defaults (a journal, as a Debian install makes it) shows none
of it; both sides of a bench then run on it alike.

The image is preallocated (fallocate), so the loop device's writes do not allocate blocks on the
filesystem below while a step is timed, and the loop device does direct I/O: without it every byte was
cached twice and written back twice, and the image file's writeback from one step ran on into the next
(a 1 GiB restore's CPU doubled in the round after the other side's restore).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def why_not() -> str:
    """Empty when a loop-mounted scratch ext4 can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root (mounting a loop device needs root)"
    for tool in ("mkfs.ext4", "mount", "umount", "fallocate", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install -y e2fsprogs mount util-linux)"
    return ""


class ScratchExt4:
    """`with ScratchExt4(image, mountpoint, size_bytes) as root:` mounts (making the image once) and unmounts.

    An image that exists already is mounted as it is, so `--keep` reuses the data sets generated in it."""

    def __init__(self, image: Path, mountpoint: Path, size_bytes: int) -> None:
        self.image = image
        self.mountpoint = mountpoint
        self.size_bytes = size_bytes
        self.device = ""

    def __enter__(self) -> Path:
        if not self.image.exists() or self.image.stat().st_size < self.size_bytes:
            self.image.unlink(missing_ok=True)
            self.image.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["fallocate", "-l", str(self.size_bytes), str(self.image)], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        # direct I/O: the loop device writes straight to the image, so the bench's bytes are cached and
        # written back once (the scratch filesystem's), not a second time as the image file's dirty pages
        self.device = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(self.image)],
                                     check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", self.device, str(self.mountpoint)], check=True)
        return self.mountpoint

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", str(self.mountpoint)], check=False)
        subprocess.run(["losetup", "--detach", self.device], check=False)


def describe(path: Path) -> str:
    """`findmnt`'s source, type and options of the filesystem holding path, for the report's header."""
    out = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "--target", str(path)],
                         capture_output=True, text=True)
    return " ".join(out.stdout.split()) if out.returncode == 0 else "unknown"
