"""The mounts a pod is made of, through the syscalls rather than mount(8): the namespace files' bind
mounts, each container's writable layer (overlayfs) and the idmapped, read-only view of the image tree under
it (docs/adr/0020-oci-pods.md). No program is started on a container's way to running.
"""
from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path


class MountError(Exception):
    """A mount the pod needs failed (the message says which and why)."""


MS_BIND = 0x1000
MNT_DETACH = 0x2


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> int:
    """mount(2) itself, not mount(8): no program to start on a pod's way to running (0, else the errno)."""
    done = libc().mount(source.encode(), str(target).encode(), fstype.encode() if fstype else None,
                         ctypes.c_ulong(flags), data.encode() if data else None)
    return 0 if done == 0 else ctypes.get_errno()


def bind(source: str, target: Path) -> None:
    err = _mount(source, target, None, MS_BIND, None)
    if err:
        raise MountError(f"mount --bind {source} {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    c = libc()
    if c.umount2(str(target).encode(), 0) != 0:
        c.umount2(str(target).encode(), MNT_DETACH)


def mount_layer(image_rootfs: Path, directory: Path, owner: int, userns: str | None = None) -> Path:
    """The container's root: the image's read-only tree with the container's writable layer over it
    (overlayfs; upper and work dirs in `directory`, owned by the pod's root so its writes land).

    With `userns` the image tree is seen through an idmapped mount of the pod's id map, so the image's
    root-owned files are the pod root's (and a uid-1000 tree is the pod's uid 1000); without, or where
    the kernel refuses idmapped mounts, they show as nobody and only read.
    """
    merged = directory / "rootfs"
    if os.path.ismount(merged):
        return merged
    for name in ("upper", "work", "rootfs"):
        (directory / name).mkdir(parents=True, exist_ok=True)
    for name in ("upper", "work"):
        os.chown(directory / name, owner, owner)
    lower = image_rootfs
    if userns is not None and idmapped_view(image_rootfs, directory / "lower", userns):
        lower = directory / "lower"
    options = f"lowerdir={lower},upperdir={directory / 'upper'},workdir={directory / 'work'}"
    err = _mount("overlay", merged, "overlay", 0, options)
    if err:
        raise MountError(f"could not mount the writable layer over {image_rootfs}: {os.strerror(err)}")
    return merged


def unmount_layer(directory: Path) -> None:
    for name in ("rootfs", "lower"):
        if _mounted(directory / name):
            unmount(directory / name)
    shutil.rmtree(directory, ignore_errors=True)


def _mounted(path: Path) -> bool:
    """Whether something is mounted at `path` (os.path.ismount misses a bind mount within one filesystem)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            points = (line.split()[4] for line in f)
            return any(p.encode().decode("unicode_escape") == target for p in points)
    except OSError:
        return os.path.ismount(path)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and aarch64 share these numbers
OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x100000
MOVE_MOUNT_F_EMPTY_PATH = 0x4


def idmapped_view(source: Path, target: Path, userns: str) -> bool:
    """A read-only copy of the mount of `source` at `target` whose ids go through `userns`'s map;
    False where the kernel or the filesystem cannot (Linux < 5.12, some filesystems)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    tree = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, str(source).encode(), OPEN_TREE_CLONE | os.O_CLOEXEC)
    if tree < 0:
        return False
    ns = os.open(userns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, ns)
        if libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            return False
        target.mkdir(parents=True, exist_ok=True)
        return bool(libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, str(target).encode(), MOVE_MOUNT_F_EMPTY_PATH) == 0)
    finally:
        os.close(ns)
        os.close(tree)
