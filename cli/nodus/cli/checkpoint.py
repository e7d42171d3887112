"""`nodus checkpoint save|restore|verify|ls`: the checkpoint library from a shell, no coordinator needed;
and a Job's checkpoints from the coordinator: `ls --job JOB`, `get JOB`.

Locations: `s3://bucket/prefix` is an S3 store (credentials, region and endpoint from the usual AWS
variables, or --endpoint-url); a path ending in .tar.zst or .tzst is one archive FILE (with
FILE.manifest.json beside it); any other path is a local store directory.

    nodus checkpoint ls --job JOB [--index I]
    nodus checkpoint get JOB [--index I] [--seq N] [--rank R] [-o FILE | --into DIR]
    nodus checkpoint now JOB [--no-wait] [--timeout SECONDS]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from nodus.checkpoint import CheckpointError, format_size
from nodus.checkpoint.restore import restore

from .checkpoint_files import _cli_error, _store, add_file_verbs
from .client import CliError, Client
from .data import JOBS, download, filename_of, namespace_of, send

def cmd_ls(args: argparse.Namespace) -> int:
    if args.job:
        if args.store:
            raise CliError("give a store or --job, not both")
        return _ls_job(Client.of(args), args)
    if not args.store:
        raise CliError("nothing to list", "give DIR or s3://bucket/prefix, or --job JOB")
    if not args.store.startswith("s3://") and not os.path.isdir(args.store):
        raise CliError(f"{args.store}: no such store directory", "give DIR or s3://bucket/prefix")
    store = _store(args.store, args)
    try:
        manifests = store.list()
    except CheckpointError as e:
        raise _cli_error(e) from None
    if not manifests:
        print(f"No checkpoints in {store.url}.", file=sys.stderr)
        return 0
    rows = [["SEQ", "TIME", "SIZE", "FILES", "SHA256", "ATTEMPT"]]
    for m in manifests:
        rows.append([str(m.seq), m.time.strftime("%Y-%m-%dT%H:%M:%SZ"), format_size(m.size), str(m.files),
                     m.sha256[:12], m.attempt or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
    return 0


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _job_checkpoints(client: Client, args: argparse.Namespace) -> list[dict[str, Any]]:
    path = JOBS.format(ns=namespace_of(client, args), name=args.job) + "/checkpoints"
    return list(send(client, "GET", path, params={"index": args.index}).json().get("items") or [])


def _ls_job(client: Client, args: argparse.Namespace) -> int:
    items = _job_checkpoints(client, args)
    if not items:
        print(f"job {args.job} has no committed checkpoints for index {args.index}.", file=sys.stderr)
        return 0
    rows = [["SEQ", "TIME", "SIZE", "REASON", "FORMAT", "ATTEMPT", "STORED"]]
    for c in items:
        uri = str(c.get("uri") or "")
        rows.append([str(c.get("seq")), str(c.get("time") or "-")[:19] + "Z", format_size(int(c.get("size") or 0)),
                     c.get("reason") or "-", c.get("format") or "Snapshot", str(c.get("attempt") or "-"),
                     uri.rpartition("/")[0] + "/" if uri.startswith("s3://") else "nodus"])
    _table(rows)
    return 0


def cmd_get(client: Client, args: argparse.Namespace) -> int:
    """Downloads one of a Job's checkpoints (default: the latest), verified, to a file or into a directory.
    A gang's Dcp checkpoint is every rank's part: --into restores them all (the highest rank first, as an
    attempt's restore does), so DIR holds the whole torch.distributed.checkpoint; -o takes one rank's."""
    items = _job_checkpoints(client, args)
    if not items:
        raise CliError(f"job {args.job} has no committed checkpoints for index {args.index}",
                       f"checkpoints are taken while it runs (recovery.checkpoint); `nodus checkpoint ls --job "
                       f"{args.job}` lists them")
    chosen = items[-1] if args.seq is None else next((c for c in items if int(c["seq"]) == args.seq), None)
    seq = int(chosen["seq"]) if chosen is not None else args.seq  # an unknown seq: the server says what exists
    ranks = sorted((int(p.get("rank") or 0) for p in (chosen or {}).get("parts") or []), reverse=True) or [0]
    path = JOBS.format(ns=namespace_of(client, args), name=args.job) + f"/checkpoints/{seq}"
    if args.into is None:
        rank = args.rank if args.rank is not None else 0
        resp = send(client, "GET", path, params={"index": args.index, "rank": rank})
        target = args.output_file or filename_of(resp, f"{args.job}-{args.index}-checkpoint-{seq}.tar.zst")
        size, digest = download(resp, target)
        if target != "-":
            others = f" (a Dcp checkpoint of {len(ranks)} ranks: --rank N for the others)" if len(ranks) > 1 else ""
            print(f"{target}: checkpoint {seq} rank {rank}, {format_size(size)}, sha256 {digest}{others}",
                  file=sys.stderr)
        return 0
    files = dirs = unpacked = 0
    for rank in [args.rank] if args.rank is not None else ranks:
        resp = send(client, "GET", path, params={"index": args.index, "rank": rank})
        with tempfile.TemporaryDirectory(prefix="nodus-checkpoint-") as spool:
            local = os.path.join(spool, "checkpoint.tar.zst")
            download(resp, local)  # compared with the committed sha256 (X-Content-SHA256) as it arrives
            try:
                summary = restore(local, args.into)
            except CheckpointError as e:
                raise _cli_error(e) from None
        files, dirs, unpacked = files + summary.files, dirs + summary.dirs, unpacked + summary.unpacked_size
    parts = f" ({len(ranks)} ranks' parts)" if len(ranks) > 1 and args.rank is None else ""
    print(f"restored checkpoint {seq}{parts} of job {args.job} (index {args.index}) into {args.into}: {files} files, "
          f"{dirs} directories, {format_size(unpacked)}; sha256 verified")
    return 0


REQUESTED = "nodus.dev/checkpoint-requested-at"


def cmd_now(client: Client, args: argparse.Namespace) -> int:
    """Asks the Job for a checkpoint of every running attempt now (the annotation its controller acts
    on); waits until status.handledRequests.checkpoint says it was taken, unless --no-wait."""
    now = time.time()
    value = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    path = JOBS.format(ns=namespace_of(client, args), name=args.job)
    client.request("PATCH", path, body={"metadata": {"annotations": {REQUESTED: value}}},
                   content_type="application/merge-patch+json")
    print(f"checkpoint of job {args.job} requested at {value}", file=sys.stderr)
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        job = client.request("GET", path).json()
        status = job.get("status") or {}
        if (status.get("handledRequests") or {}).get("checkpoint") == value:
            latest = status.get("checkpoint") or {}
            seq = f" (checkpoint {latest['seq']})" if latest.get("seq") is not None else ""
            print(f"job {args.job}: checkpoint taken{seq}")
            return 0
        time.sleep(0.5)
    raise CliError(f"job {args.job} has not taken the checkpoint requested at {value} within {args.timeout:g}s",
                   f"it is taken once its attempts run: `nodus describe job {args.job}`; "
                   f"`nodus checkpoint ls --job {args.job}` lists what was taken")


def add_parser(subparsers: Any) -> None:
    """Register `checkpoint` and its verbs on the top-level subparsers of `nodus`."""
    p = subparsers.add_parser("checkpoint", help="save, restore, verify and list checkpoints (tar.zst + manifest)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="checkpoint_action", required=True, metavar="{save,restore,verify,ls,get}")

    def s3_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--endpoint-url", help="S3 endpoint (default $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL)")

    add_file_verbs(verbs, s3_flag)

    ls = verbs.add_parser("ls", help="list a store's committed checkpoints, or a Job's (--job)")
    ls.add_argument("store", nargs="?", metavar="DIR|s3://BUCKET/PREFIX")
    ls.add_argument("--job", help="list this Job's checkpoints, as the coordinator keeps them")
    ls.add_argument("--index", type=int, default=0, help="with --job: the Job index (default 0)")
    s3_flag(ls)
    ls.set_defaults(func=cmd_ls, operator=True)

    g = verbs.add_parser("get", help="download a Job's checkpoint from the coordinator (default: the latest)")
    g.add_argument("job")
    g.add_argument("--index", type=int, default=0, help="the Job index (default 0)")
    g.add_argument("--seq", type=int, help="which checkpoint (default: the latest committed)")
    g.add_argument("--rank", type=int, help="a Dcp gang checkpoint's part: only this rank's (default: every rank's "
                                            "with --into, rank 0's with -o)")
    out = g.add_mutually_exclusive_group()
    out.add_argument("-o", "--output-file", help="write the archive here (default: the server's file name; - for stdout)")
    out.add_argument("--into", metavar="DIR", help="restore it under DIR instead (sha256 verified first)")
    g.set_defaults(func=cmd_get)

    n = verbs.add_parser("now", help="take a checkpoint of a running Job now (and wait until it is taken)")
    n.add_argument("job")
    n.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="wait until the checkpoint is taken (default; --no-wait returns once it is asked)")
    n.add_argument("--timeout", type=float, default=600.0, help="how long to wait, in seconds (default 600)")
    n.set_defaults(func=cmd_now)
