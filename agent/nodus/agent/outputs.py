"""Collecting an attempt's outputs after its command succeeded (in the supervisor, before it exits).

Every declared output, and everything under the outputs directory as the output named `outputs`
(skipped when nothing was written there): a file as it is, a directory as a tar.zst archive under
run/collected/. Each comes with its sha256 and size; the agent uploads them afterwards.
"""
from __future__ import annotations

import shutil
from typing import Any, Iterable

from .archive import MEDIA_TYPE, pack_dir, sha256_file
from .layout import AttemptLayout


def collect_outputs(layout: AttemptLayout, declared: Iterable[dict[str, Any]],
                    default: bool = True) -> tuple[list[dict[str, Any]], str]:
    """Returns (outputs, problem); a declared path that does not exist is the problem. `default` adds
    the outputs directory (not for a gang rank above 0: fromRanks Zero is the default)."""
    wanted = list(declared)
    if default and not any(o.get("name") == "outputs" for o in wanted):
        wanted.append({"name": "outputs", "path": "/nodus/outputs"})
    done: list[dict[str, Any]] = []
    for out in wanted:
        name, path = str(out["name"]), str(out["path"])
        local = layout.translate(path)
        if name == "outputs" and local == layout.outputs and (not local.is_dir() or not any(local.iterdir())):
            continue  # nothing was written under the outputs dir
        if not local.exists():
            return [], f"output {name}: {path} does not exist"
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
        layout.collected.mkdir(exist_ok=True)  # not made with the attempt: most collect nothing
        if local.is_dir():
            dest = layout.collected / f"{safe}.tar.zst"
            digest, size = pack_dir(local, dest)
            media = MEDIA_TYPE
        else:
            dest = local
            if not local.resolve().is_relative_to(layout.root.resolve()):
                dest = layout.collected / safe  # outside the attempt: freeze a copy for the upload
                shutil.copyfile(local, dest)
            digest, size = sha256_file(dest)
            media = "application/octet-stream"
        done.append({"name": name, "path": path, "file": str(dest), "sha256": digest, "size": size,
                     "media_type": media, "archive": local.is_dir()})
    return done, ""
