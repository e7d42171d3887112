"""`nodus image push DIR|FILE [--name NAME[:TAG]]` and `nodus image ls`: a project's own images in the
operator's registry, through the coordinator (docs/adr/0032-image-push.md).

push sends an OCI image layout directory (as a tar of it) or a `docker save` archive (as it is) to
`POST …/namespaces/P/images`; the coordinator copies it into the registry and answers the digest to put
in spec.image. What is not an image is refused here before anything is sent.
"""
from __future__ import annotations

import argparse
import os
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any

import orjson

from .client import CliError, Client
from .data import namespace_of, send

IMAGES = "/apis/nodus.dev/v1/namespaces/{ns}/images"
FIX = ("pass an OCI image layout directory (oci-layout and index.json, as `skopeo copy ... oci:DIR` writes) "
       "or a `docker save -o FILE IMAGE` archive")


def kind_of(path: Path) -> str:
    """"oci" for an OCI image layout directory, "docker-archive" for a `docker save` tar; CliError naming
    DIR|FILE and the fix for anything else."""
    if path.is_dir():
        missing = [n for n in ("oci-layout", "index.json") if not (path / n).is_file()]
        if missing:
            raise CliError(f"{path}: not an OCI image layout ({' and '.join(missing)} missing)", FIX)
        return "oci"
    if not path.exists():
        raise CliError(f"{path}: no such file or directory", FIX)
    try:
        with tarfile.open(path, mode="r:*") as tar:
            names = {m.name.removeprefix("./").split("/")[0] for m in tar}
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CliError(f"{path}: not a tar archive ({e})", FIX) from None
    if "manifest.json" in names:
        return "docker-archive"
    if {"oci-layout", "index.json"} <= names:
        return "oci"  # a layout already archived: sent as it is
    raise CliError(f"{path}: a tar without manifest.json is not a `docker save` archive", FIX)


def pack_layout(src: Path, dest: IO[bytes]) -> None:
    """The layout's tree as an uncompressed tar of relative names (layers are compressed already)."""
    with tarfile.open(fileobj=dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(files):
                full = Path(root) / name
                if full.is_file() and not full.is_symlink():
                    tar.add(str(full), arcname=str(full.relative_to(src)), recursive=False)


def cmd_push(client: Client, args: argparse.Namespace) -> int:
    path = Path(args.path)
    kind = kind_of(path)
    params = {"name": args.name} if args.name else None
    url = IMAGES.format(ns=namespace_of(client, args))
    # Refusals that need no upload (role, no registry, a bad --name) come first, not after the bytes.
    send(client, "POST", url, params={**(params or {}), "dryRun": "All"})
    headers = {"Content-Type": "application/x-tar"}
    if path.is_dir():
        with tempfile.TemporaryFile(prefix="nodus-image-") as archive:
            pack_layout(path, archive)
            headers["Content-Length"] = str(archive.tell())
            archive.seek(0)
            pushed = send(client, "POST", url, params=params, data=archive, headers=headers).json()
    else:
        with open(path, "rb") as f:
            headers["Content-Length"] = str(path.stat().st_size)
            pushed = send(client, "POST", url, params=params, data=f, headers=headers).json()
    if args.output == "json":
        sys.stdout.write(orjson.dumps(pushed, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"pushed {pushed['reference']} ({kind})")
    print(f"digest: {pushed['digest']}")
    print(f"spec.image: {pushed['image']}")
    return 0


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    items: list[dict[str, Any]] = send(client, "GET", IMAGES.format(ns=namespace_of(client, args))).json()["items"]
    if args.output == "json":
        sys.stdout.write(orjson.dumps(items, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    if not items:
        print(f"No images in project {namespace_of(client, args)} (push one with `nodus image push DIR|FILE`).",
              file=sys.stderr)
        return 0
    rows = [["NAME", "TAG", "DIGEST", "IMAGE"]] + [[i["name"], i["tag"], i["digest"], i["image"]] for i in items]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("image", help="your project's images in the operator's registry")
    actions = p.add_subparsers(dest="action", required=True)
    push = actions.add_parser("push", help="push an OCI image layout (DIR) or a `docker save` archive (FILE)")
    push.add_argument("path", metavar="DIR|FILE")
    push.add_argument("--name", help="NAME[:TAG] in the project's namespace (default: the archive's own tag; "
                                     "the tag defaults to latest)")
    push.add_argument("-o", "--output", choices=["json"])
    push.set_defaults(func=cmd_push)
    ls = actions.add_parser("ls", help="list the project's images: names, tags, digests")
    ls.add_argument("-o", "--output", choices=["json"])
    ls.set_defaults(func=cmd_ls)
