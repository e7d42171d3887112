"""A pod's writable layers limited to the Job's disk floor (`resources.disk`).

Project quotas need a filesystem mounted with them (XFS `prjquota`, ext4 with the `project` feature),
which most hosts' root filesystems are not, so the limit is a filesystem of its own: an ext4 (no
journal: the layers die with the pod) in a sparse file the size of the floor, loop-mounted at the pod's
`containers/` directory, where every container's upper and work dirs live. A write past the floor
fails inside the container with ENOSPC; the host's disk is used only as the layers grow. A host without
loop devices or mkfs.ext4 runs pods without the limit: `available` says so once, at the agent's start.
The mount outlives the supervisor, as the layers do, so a re-adopted pod keeps it; `remove` undoes it,
from disk alone. See docs/adr/0020-oci-pods.md.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

IMAGE = "layers.ext4"
"""The sparse file beside `containers/` in the pod's directory."""
MKFS = ("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1")
MIN_BYTES = 8 << 20
"""The smallest ext4 mkfs makes without tuning; a smaller floor gets this much."""


class DiskLimitError(RuntimeError):
    """The pod's limited filesystem could not be made; the message says which step and why."""


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise DiskLimitError(f"{' '.join(argv[:2])}: {(done.stderr or done.stdout).strip()}")


def _mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4].encode().decode("unicode_escape") == target for line in f)


def mount(pod_dir: Path, size: int, owner: int) -> Path:
    """`pod_dir/containers` as a filesystem of `size` bytes (at least MIN_BYTES), its root owned by host
    uid `owner`; already mounted (a restarted supervisor) is kept as it is."""
    target = pod_dir / "containers"
    if target.is_dir() and _mounted(target):
        return target
    target.mkdir(parents=True, exist_ok=True)
    image = pod_dir / IMAGE
    with open(image, "wb") as f:
        f.truncate(max(size, MIN_BYTES))
    try:
        _run([*MKFS, str(image)])
        _run(["mount", "-o", "loop,nodev,nosuid", str(image), str(target)])
    except DiskLimitError:
        image.unlink(missing_ok=True)
        raise
    shutil.rmtree(target / "lost+found", ignore_errors=True)
    os.chown(target, owner, owner)
    target.chmod(0o700)
    return target


def remove(pod_dir: Path) -> None:
    """Unmounts the pod's limited filesystem (its layers unmounted first) and deletes its file; the loop
    device goes with the last unmount (mount's autoclear). Tolerates what is gone."""
    target = pod_dir / "containers"
    if target.is_dir() and _mounted(target):
        done = subprocess.run(["umount", str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(target)], capture_output=True)  # busy: detach it, it frees later
    (pod_dir / IMAGE).unlink(missing_ok=True)


def available() -> str | None:
    """None when this host can limit a pod's layers (mkfs.ext4 and a loop mount work), else why not."""
    if shutil.which(MKFS[0]) is None:
        return f"{MKFS[0]} is not on the PATH (Debian package e2fsprogs)"
    top = Path(tempfile.mkdtemp(prefix="nodus-disk-probe-"))
    try:
        mount(top, MIN_BYTES, os.getuid())
        return None
    except (DiskLimitError, OSError) as e:
        return str(e)
    finally:
        remove(top)
        shutil.rmtree(top, ignore_errors=True)
