"""`nodus checkpoint save|restore|verify`: the checkpoint library from a shell, no coordinator needed.

These verbs import nothing of the REST client: entry.py runs them straight from here, so a save or
a restore starts in the time Python and nodus.checkpoint take to import (ADR 0053). `ls`, `get` and
`now` (which may talk to the coordinator) live in checkpoint.py, which registers these beside them.

Locations: `s3://bucket/prefix` is an S3 store (credentials, region and endpoint from the usual AWS
variables, or --endpoint-url); a path ending in .tar.zst or .tzst is one archive FILE (with
FILE.manifest.json beside it); any other path is a local store directory.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from nodus.checkpoint import (ArchiveTooLarge, CheckpointError, CorruptArchive, DigestMismatch, NoSpace, NotFound,
                              SourceError, StoreError, UnsafeArchive)
from nodus.checkpoint.sizes import format_size, parse_size

from .errors import CliError

if TYPE_CHECKING:
    from nodus.checkpoint import Manifest, Store
    from nodus.checkpoint.mapped import MappedArchive

FILE_SUFFIXES = (".tar.zst", ".tzst")
DEFAULT_MAX_SIZE = "1Ti"

_FIXES: list[tuple[type[CheckpointError], str]] = [
    (ArchiveTooLarge, "raise --max-size, or save less"),
    (DigestMismatch, "the archive is damaged or was replaced; restore an earlier one (nodus checkpoint ls STORE)"),
    (UnsafeArchive, "this archive was not written by nodus checkpoint save; look inside with tar -tvf"),
    (CorruptArchive, "the archive is damaged or truncated; restore an earlier one"),
    (NoSpace, "free space on that filesystem (earlier checkpoints are intact)"),
    (NotFound, "see what exists with: nodus checkpoint ls STORE"),
    (StoreError, "check the location, credentials and endpoint (--endpoint-url, AWS_ENDPOINT_URL, AWS_* variables)"),
    (SourceError, ""),
]


def _cli_error(e: CheckpointError) -> CliError:
    fix = next((f for t, f in _FIXES if isinstance(e, t)), "")
    return CliError(str(e), fix)


def _is_file(location: str) -> bool:
    return location.endswith(FILE_SUFFIXES) or os.path.isfile(location)


def _store(location: str, args: argparse.Namespace) -> Store:
    options: dict[str, Any] = {}
    if location.startswith("s3://"):
        if args.endpoint_url:
            options["endpoint_url"] = args.endpoint_url
    elif not location:
        raise CliError("an empty location", "give FILE.tar.zst, DIR or s3://bucket/prefix")
    from nodus.checkpoint.stores import open_store  # each verb imports only what it uses (ADR 0081)

    try:
        return open_store(location, **options)
    except ValueError as e:
        raise CliError(str(e), "use s3://BUCKET/PREFIX") from None


def _size(text: str | None, flag: str) -> int | None:
    if text is None:
        return None
    try:
        return int(parse_size(text))
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None


def _describe(m: Manifest) -> str:
    return (f"{format_size(m.unpacked_size)} in {m.files} files → {format_size(m.size)} "
            f"(zstd -{m.level}), sha256 {m.sha256}")


def cmd_save(args: argparse.Namespace) -> int:
    max_size = _size(args.max_size, "--max-size")
    started = time.monotonic()
    common: dict[str, Any] = dict(root=args.directory, level=args.level, max_size=max_size, attempt=args.attempt,
                                  epoch=args.epoch)
    try:
        if not args.out.startswith("s3://") and _is_file(args.out) and not os.path.isdir(args.out):
            from nodus.checkpoint.standalone import save_file

            m = save_file(args.paths, args.out, seq=args.seq or 0, **common)
            where = args.out
        else:
            store = _store(args.out, args)
            m = store.save(args.paths, seq=args.seq, **common)
            where = f"{store.url} as checkpoint {m.seq}"
    except CheckpointError as e:
        raise _cli_error(e) from None
    print(f"saved {', '.join(m.paths)} to {where}: {_describe(m)} in {time.monotonic() - started:.1f}s")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    max_size = _size(args.max_size, "--max-size")
    started = time.monotonic()
    try:
        if not args.source.startswith("s3://") and os.path.isfile(args.source):
            if args.seq is not None:
                raise CliError("--seq applies to a store, not to one archive file")
            from nodus.checkpoint.standalone import restore_file

            manifest, summary = restore_file(args.source, args.into, max_size=max_size,
                                             archive=getattr(args, "archive", None))
            checked = "sha256 verified against its manifest" if manifest else \
                "no manifest beside it: sha256 not compared (zstd's checksums of the compressed frames still are)"
            what = args.source
        else:
            if not args.source.startswith("s3://") and not os.path.isdir(args.source):
                raise CliError(f"{args.source}: no such archive file or store directory",
                               "give FILE.tar.zst, DIR or s3://bucket/prefix")
            store = _store(args.source, args)
            manifest, summary = store.restore(args.into, seq=args.seq, max_size=max_size)
            checked = "sha256 verified"
            what = f"checkpoint {manifest.seq} of {store.url}"
    except CheckpointError as e:
        raise _cli_error(e) from None
    print(f"restored {what} into {args.into}: {summary.files} files, {summary.dirs} directories, "
          f"{format_size(summary.unpacked_size)}; {checked}; {time.monotonic() - started:.1f}s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        if not args.source.startswith("s3://") and os.path.isfile(args.source):
            from nodus.checkpoint.standalone import verify_file

            manifest, summary = verify_file(args.source, sha256=args.sha256)
            if args.sha256:
                compared = "matches --sha256"
            elif manifest:
                compared = "matches its manifest"
            else:
                compared = "not compared: no manifest beside it (pass --sha256 to compare)"
            what = args.source
        else:
            if not args.source.startswith("s3://") and not os.path.isdir(args.source):
                raise CliError(f"{args.source}: no such archive file or store directory",
                               "give FILE.tar.zst, DIR or s3://bucket/prefix")
            store = _store(args.source, args)
            manifest, summary = store.verify(args.seq)
            compared = "matches its manifest"
            what = f"checkpoint {manifest.seq} of {store.url}"
    except CheckpointError as e:
        raise _cli_error(e) from None
    print(f"{what}: ok. sha256 {summary.sha256} ({compared}); {format_size(summary.size)} compressed, "
          f"{summary.files} files, {summary.dirs} directories, {format_size(summary.unpacked_size)} unpacked; "
          "every member safe to restore")
    return 0


def add_file_verbs(verbs: Any, s3_flag: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register save, restore and verify on `nodus checkpoint`'s sub-parsers."""
    s = verbs.add_parser("save", help="snapshot PATHs into an archive file or a store")
    s.add_argument("paths", nargs="+", metavar="PATH", help="files or directories (saved as tar would name them)")
    s.add_argument("--out", required=True, metavar="FILE|DIR|s3://BUCKET/PREFIX",
                   help="FILE ending in .tar.zst/.tzst, a store directory, or an S3 store")
    s.add_argument("-C", "--directory", help="take relative PATHs from this directory, like tar -C")
    s.add_argument("--level", type=int, default=3, help="zstd level 1..22 (default 3)")
    s.add_argument("--max-size", default=DEFAULT_MAX_SIZE,
                   help=f"refuse an archive larger than this, before the upload completes (default {DEFAULT_MAX_SIZE})")
    s.add_argument("--seq", type=int, help="sequence number (default: one past the store's latest)")
    s.add_argument("--attempt", default="", help="the attempt saving it, recorded in the manifest")
    s.add_argument("--epoch", type=int, default=0, help="the gang epoch, recorded in the manifest")
    s3_flag(s)
    s.set_defaults(func=cmd_save, operator=True)

    r = verbs.add_parser("restore", help="restore an archive file or a store's checkpoint under a directory")
    r.add_argument("source", metavar="FILE|DIR|s3://BUCKET/PREFIX")
    r.add_argument("--into", required=True, metavar="DIR", help="each saved path is recreated under DIR, as tar -C DIR")
    r.add_argument("--seq", type=int, help="which checkpoint of a store (default: the latest committed)")
    r.add_argument("--max-size", help="refuse an archive larger than this")
    s3_flag(r)
    r.set_defaults(func=cmd_restore, operator=True)

    v = verbs.add_parser("verify", help="read an archive through: digest, checksum, every member's safety")
    v.add_argument("source", metavar="FILE|DIR|s3://BUCKET/PREFIX")
    v.add_argument("--seq", type=int, help="which checkpoint of a store (default: the latest committed)")
    v.add_argument("--sha256", help="compare a FILE with this digest instead of its manifest")
    s3_flag(v)
    v.set_defaults(func=cmd_verify, operator=True)


def main(argv: list[str], archive: MappedArchive | None = None) -> int:
    """`nodus checkpoint save|restore|verify ...` (argv from `checkpoint` on), parsed and run. `archive`:
    the restore's FILE, opened and being hashed since before the imports (entry.py, ADR 0104); used only
    by the restore of that same FILE, closed in any case."""
    try:
        return _main(argv, archive)
    finally:
        if archive is not None:
            archive.close()  # a no-op where the restore took and closed it


def _main(argv: list[str], archive: MappedArchive | None) -> int:
    parser = argparse.ArgumentParser(prog="nodus")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("checkpoint", help="save, restore and verify checkpoints (tar.zst + manifest)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="checkpoint_action", required=True, metavar="{save,restore,verify}")
    add_file_verbs(verbs, s3_flag)
    args = parser.parse_args(argv)
    if archive is not None and args.func is cmd_restore and args.source == archive.path:
        args.archive = archive
    _tune_process()
    try:
        return int(args.func(args))
    except CliError as e:
        e.report()
        return 1
    except BrokenPipeError:
        return 0


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt parameters (malloc.h)."""


def _tune_process() -> None:
    """Settings for this short process, which runs one save, restore or verify and exits (ADR 0081).

    - No cyclic garbage collection: what a checkpoint verb allocates is freed by reference counting;
      the collector only walked the imported modules' objects again and again, for nothing.
    - glibc keeps the memory it is given back: a restore decodes its frames into fresh 4 MiB buffers,
      and glibc gave each freed one back to the kernel (munmap, or MADV_DONTNEED on a thread's heap),
      so every buffer was faulted in and zeroed again: ~30-45 ms of a 360 MiB restore's 0.9 CPU-s.
      The process's peak is unchanged (the buffers in flight are bounded); it is simply not returned.
    """
    import gc

    gc.disable()
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest; a fixed value also stops its dynamic raise
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except (ImportError, OSError, AttributeError):
        pass  # not glibc (musl, macOS): the defaults stay


def s3_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--endpoint-url", help="S3 endpoint (default $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL)")
