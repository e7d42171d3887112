"""CLI commands over the blob routes: `nodus outputs get|list`, `nodus logs`, `nodus volume push`.

    nodus outputs get JOB OUTPUT [--index I] [--rank R] [-o FILE|-]
    nodus outputs list JOB
    nodus logs JOB [--index I] [--attempt N] [--rank R] [-f [--progress]]
    nodus volume push NAME DIR
    nodus source push DIR
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import requests

from nodus.checkpoint import archive

from .client import CliError, Client

CHUNK = 1 << 20
JOBS = "/apis/nodus.dev/v1/namespaces/{ns}/jobs/{name}"
VOLUMES = "/apis/nodus.dev/v1/namespaces/{ns}/volumes/{name}"


def namespace_of(client: Client, args: argparse.Namespace) -> str:
    return getattr(args, "namespace", None) or client.namespace


def send(client: Client, method: str, path: str, *, params: dict[str, Any] | None = None,
          data: IO[bytes] | None = None, headers: dict[str, str] | None = None,
          missing_ok: str = "") -> requests.Response:
    """A streamed request (no read timeout: a log follow or an upload may take long); errors as CliError,
    except a 404 whose details.kind is `missing_ok`, which is returned."""
    try:
        resp = client.session.request(method, client.server + path, params=params, data=data, headers=headers,
                                      stream=True, timeout=(30, None))
    except requests.exceptions.SSLError as e:
        raise CliError(f"TLS error talking to {client.server}: {e}",
                       "use the kubeconfig the coordinator wrote (it carries its CA)") from None
    except requests.exceptions.ConnectionError:
        raise CliError(f"cannot reach the coordinator at {client.server}",
                       "start it (`nodus-coordinator --data-dir DIR`) or check the kubeconfig's server") from None
    if missing_ok and resp.status_code == 404:
        try:
            if (resp.json().get("details") or {}).get("kind") == missing_ok:
                return resp
        except ValueError:
            pass
    if resp.status_code >= 400:
        raise client._error(resp)
    return resp


# -- outputs -----------------------------------------------------------------------------------------

def filename_of(resp: requests.Response, fallback: str) -> str:
    m = re.search(r'filename="([^"/\\]+)"', resp.headers.get("Content-Disposition", ""))
    return m.group(1) if m else fallback


def cmd_outputs_get(client: Client, args: argparse.Namespace) -> int:
    path = JOBS.format(ns=namespace_of(client, args), name=args.job) + f"/outputs/{args.output}"
    params: dict[str, Any] = {"index": args.index}
    if args.rank is not None:
        params["rank"] = args.rank
    resp = send(client, "GET", path, params=params)
    target = args.output_file or filename_of(resp, f"{args.job}-{args.output}-{args.index}")
    size, digest = download(resp, target)
    if target != "-":
        print(f"{target}: {size} bytes, sha256 {digest}", file=sys.stderr)
    return 0


def download(resp: requests.Response, target: str) -> tuple[int, str]:
    """Writes the body to `target` (- for stdout; a file appears only whole, under its name once its
    sha256 matches the X-Content-SHA256 the server committed); returns (bytes, sha256)."""
    expected = resp.headers.get("X-Content-SHA256", "")
    digest = hashlib.sha256()
    size = 0
    if target == "-":
        for data in resp.iter_content(CHUNK):
            digest.update(data)
            size += len(data)
            sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        dest = Path(target)
        tmp = dest.with_name(dest.name + ".part")
        with open(tmp, "wb") as f:
            for data in resp.iter_content(CHUNK):
                digest.update(data)
                size += len(data)
                f.write(data)
        if expected and digest.hexdigest() != expected:
            tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, dest)
    if expected and digest.hexdigest() != expected:
        raise CliError(f"the download's sha256 {digest.hexdigest()} is not the committed {expected}",
                       "download it again")
    return size, digest.hexdigest()


def cmd_outputs_list(client: Client, args: argparse.Namespace) -> int:
    job = client.request("GET", JOBS.format(ns=namespace_of(client, args), name=args.job)).json()
    outputs = (job.get("status") or {}).get("outputs") or []
    if not outputs:
        print(f"job {args.job} has no committed outputs yet.", file=sys.stderr)
        return 0
    rows = [["NAME", "INDEX", "RANK", "SIZE", "SHA256", "PATH"]]
    rows += [[str(o.get("name", "")), str(o.get("index", 0)), str(o.get("rank", 0)), str(o.get("size", "")),
              str(o.get("sha256", ""))[:12], str(o.get("path", ""))] for o in outputs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


# -- logs --------------------------------------------------------------------------------------------

def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.progress is None:  # a bar below a followed log on a terminal; plain bytes into pipes and files
        args.progress = args.follow and sys.stdout.isatty()
    if args.progress and not args.follow:
        raise CliError("--progress shows the Job's progress while its log is followed", "add -f")
    path = JOBS.format(ns=namespace_of(client, args), name=args.job) + "/log"
    params: dict[str, Any] = {"index": args.index}
    if args.attempt is not None:
        params["attempt"] = args.attempt
    if args.rank is not None:
        params["rank"] = args.rank
    if args.follow:
        params["follow"] = "true"
    waited = False
    while True:
        # With -f, wait for the index's attempt rather than fail on a Job that was just created.
        resp = send(client, "GET", path, params=params, missing_ok="attempts" if args.follow else "")
        if resp.status_code != 404:
            break
        if not waited:
            print(f"waiting for job {args.job} index {args.index} to get an attempt…", file=sys.stderr)
            waited = True
        time.sleep(1.0)
    if args.progress:
        from rich.console import Console

        from .progress_view import follow_log
        events = client.watch(client.for_kind("Job", "nodus.dev/v1"), namespace_of(client, args),
                              {"fieldSelector": f"metadata.name={args.job}"})
        try:
            follow_log(args.job, resp.iter_content(None), events, Console())
        except KeyboardInterrupt:
            return 130
        return 0
    out = sys.stdout.buffer
    try:
        for data in resp.iter_content(None):
            out.write(data)
            out.flush()
    except KeyboardInterrupt:
        return 0
    return 0


# -- volumes -----------------------------------------------------------------------------------------

def pack(src: Path, dest: IO[bytes]) -> tuple[str, int, int]:
    """Archives the tree under `src` as tar.zst into `dest` (relative names, sorted, owners cleared: the
    uploader's uid means nothing on the node, and the same tree must archive the same, so an unchanged
    directory pushes no new revision); returns (sha256, size, regular files)."""
    plan = archive.scan(["."], root=src)
    info = archive.write(plan, dest, owner=(0, 0))
    files = sum(1 for e in plan.entries if stat.S_ISREG(e.st.st_mode) and not e.hardlink_to)
    return info.sha256, info.size, files


def cmd_volume_push(client: Client, args: argparse.Namespace) -> int:
    src = Path(args.dir)
    if not src.is_dir():
        raise CliError(f"{args.dir} is not a directory", "pass the directory whose content the volume holds")
    with tempfile.TemporaryFile(prefix="nodus-volume-") as archive:
        sha256, size, files = pack(src, archive)
        archive.seek(0)
        resp = send(client, "POST", VOLUMES.format(ns=namespace_of(client, args), name=args.name) + "/revisions",
                     data=archive, headers={"Content-Type": "application/zstd", "X-Content-SHA256": sha256,
                                            "Content-Length": str(size)})
    revision = resp.json()
    if revision.get("sha256") != sha256:
        raise CliError(f"the coordinator stored sha256 {revision.get('sha256')}, not the archive's {sha256}",
                       "push again")
    verb = "pushed" if revision.get("created") else "unchanged (same content as the latest revision)"
    print(f"volume/{args.name} revision {revision['revision']} {verb}: {revision.get('files', files)} files, "
          f"{revision.get('size', size)} bytes, sha256 {sha256}")
    return 0


# -- sources -----------------------------------------------------------------------------------------

def push_source(client: Client, namespace: str, directory: str) -> dict[str, Any]:
    """Uploads DIR as a Job's code (spec.source.blob) to the project; the coordinator's answer, whose
    sha256 is `sha256:<hex>`. Pushing the same tree again stores nothing new."""
    src = Path(directory)
    if not src.is_dir():
        raise CliError(f"{directory} is not a directory", "pass the directory holding the Job's code")
    with tempfile.TemporaryFile(prefix="nodus-source-") as archive:
        sha256, size, _ = pack(src, archive)
        archive.seek(0)
        resp = send(client, "POST", f"/apis/nodus.dev/v1/namespaces/{namespace}/sources", data=archive,
                    headers={"Content-Type": "application/zstd", "X-Content-SHA256": sha256,
                             "Content-Length": str(size)})
    answer: dict[str, Any] = resp.json()
    if answer.get("sha256") != f"sha256:{sha256}":
        raise CliError(f"the coordinator stored {answer.get('sha256')}, not the archive's sha256:{sha256}", "push again")
    return answer


def cmd_source_push(client: Client, args: argparse.Namespace) -> int:
    answer = push_source(client, namespace_of(client, args), args.dir)
    verb = "pushed" if answer.get("created") else "unchanged (already pushed)"
    print(f"source {verb}: {answer.get('files')} files, {answer.get('size')} bytes; use it in a Job as", file=sys.stderr)
    print(answer["sha256"])
    return 0


def add_parsers(sub: Any) -> None:
    """Registers `outputs`, `logs` and `volume` on the CLI's subparsers."""
    outputs = sub.add_parser("outputs", help="download a Job's committed outputs")
    outputs_sub = outputs.add_subparsers(dest="action", required=True)
    get = outputs_sub.add_parser("get", help="download one output")
    get.add_argument("job")
    get.add_argument("output", help='the declared output name ("outputs" for /nodus/outputs)')
    get.add_argument("--index", type=int, default=0, help="the Job index that produced it (default 0)")
    get.add_argument("--rank", type=int, help="the gang rank (outputs with fromRanks: All)")
    get.add_argument("-o", "--output-file", help="where to write it (default: the server's file name; - for stdout)")
    get.set_defaults(func=cmd_outputs_get)
    listing = outputs_sub.add_parser("list", help="list a Job's committed outputs")
    listing.add_argument("job")
    listing.set_defaults(func=cmd_outputs_list)

    logs = sub.add_parser("logs", help="print an attempt's log")
    logs.add_argument("job")
    logs.add_argument("--index", type=int, default=0, help="the Job index (default 0)")
    logs.add_argument("--attempt", type=int, help="the attempt number (default: the latest; a gang's epoch)")
    logs.add_argument("--rank", type=int, help="a gang member's rank (default 0)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the attempt ends")
    logs.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="with -f, a bar of the Job's progress below the log (default: on a terminal)")
    logs.set_defaults(func=cmd_logs)

    source = sub.add_parser("source", help="a Job's code, uploaded (spec.source.blob)")
    source_sub = source.add_subparsers(dest="action", required=True)
    spush = source_sub.add_parser("push", help="upload a directory; prints the sha256: for spec.source.blob")
    spush.add_argument("dir")
    spush.set_defaults(func=cmd_source_push)

    volume = sub.add_parser("volume", help="datasets with immutable revisions")
    volume_sub = volume.add_subparsers(dest="action", required=True)
    push = volume_sub.add_parser("push", help="upload a directory as the volume's next revision "
                                              "(creates the volume if it does not exist)")
    push.add_argument("name")
    push.add_argument("dir")
    push.set_defaults(func=cmd_volume_push)
