"""The Nodus SDK inside images: `from nodus import progress` (and handshake, hf, config) works in a
container as it does in the process runtime, without the image installing anything.

The agent copies the SDK's modules, the ones this agent speaks the protocol of (the progress file's
lines, the checkpoint handshake), into a read-only tree under its work dir named by their content hash
(`sdk/<hash>/nodus/…`), so an agent upgrade makes a new tree and an attempt that is running keeps the
one it was started with. Each container mounts the tree read-only at /nodus/sdk, and /nodus/sdk is
appended to the container's PYTHONPATH: the Job's PYTHONPATH, else the image's, keeps its entries in
front (docs/adr/0020-oci-pods.md). The modules use only the standard library (config also PyYAML, the
HF callback transformers: imported only where a program imports those).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

MODULES = ("config", "handshake", "hf", "progress")
"""The SDK's modules (sdk/nodus/*.py); tests/test_oci_sdk.py holds this to the source tree."""

MOUNT = "/nodus/sdk"
"""Where a container sees the tree: /nodus/sdk/nodus/progress.py."""


def sources() -> dict[str, bytes]:
    """File name -> text of each SDK module, as this agent's installation holds them."""
    found = {}
    for name in MODULES:
        spec = importlib.util.find_spec(f"nodus.{name}")
        if spec is None or spec.origin is None:
            raise RuntimeError(f"the Nodus SDK module nodus.{name} is not installed beside the agent; reinstall nodus")
        found[f"{name}.py"] = Path(spec.origin).read_bytes()
    return found


def install(root: Path, files: Mapping[str, bytes] | None = None) -> Path:
    """The read-only SDK tree under `root` for `files` (default: this installation's), made once per
    content: returns the directory to mount at MOUNT. Safe when two agents' threads race to make it."""
    files = sources() if files is None else files
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    tree = root / digest.hexdigest()[:16]
    if (tree / "nodus").is_dir():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the pods' uids pass through it to bind the tree
    staging = Path(tempfile.mkdtemp(prefix=".sdk-", dir=root))
    try:
        (staging / "nodus").mkdir()
        for name, text in files.items():
            (staging / "nodus" / name).write_bytes(text)
            (staging / "nodus" / name).chmod(0o444)
        for d in (staging / "nodus", staging):
            d.chmod(0o555)
        os.rename(staging, tree)
    except OSError:
        if not (tree / "nodus").is_dir():
            raise
    finally:
        if staging.exists():
            staging.chmod(0o755)
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def python_path(image_env: Sequence[str], env: Mapping[str, str]) -> str:
    """The container's PYTHONPATH: the Job's (else the image's) entries first, then MOUNT."""
    own = env.get("PYTHONPATH")
    if own is None:
        own = next((item.partition("=")[2] for item in image_env if item.startswith("PYTHONPATH=")), "")
    entries = [e for e in own.split(":") if e and e != MOUNT]
    return ":".join([*entries, MOUNT])
