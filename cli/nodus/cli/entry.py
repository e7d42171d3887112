"""The `nodus` command: `nodus checkpoint save|restore|verify` go straight to checkpoint_files, which
imports only nodus.checkpoint; everything else goes to main.py and its REST client.

A checkpoint saved from a shell (a job's own script, a cron line) pays the CLI's start-up on every
save: with main.py's imports (requests, grpc, yaml, every verb) that was about 0.35 CPU-seconds,
longer than saving a 100 MB state; this path starts in what Python and the library take (ADR 0053).
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing before the restore's digest starts (ADR 0104)
if TYPE_CHECKING:
    from nodus.checkpoint.mapped import MappedArchive


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "checkpoint" and argv[1] in ("save", "restore", "verify"):
        import os

        archive = _open_early(argv) if argv[1] == "restore" else None
        from .checkpoint_files import main as files_main

        rc = files_main(argv, archive)
        # out without the interpreter's teardown (every module, object and heap freed one by one): the
        # verb has joined its threads and closed its files, and nothing else is left to do (ADR 0081)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a closed pipe: what the interpreter's exit would have met too
                rc = rc or 120
        os._exit(rc)
    from .main import main as full_main

    full_main()


def _open_early(argv: list[str]) -> MappedArchive | None:
    """`checkpoint restore FILE ...`: FILE opened and its sha256 started on a thread before the argument
    parser, zstd and the tar reader are imported, so that the other CPU hashes while this one imports
    (ADR 0104). Only a help: checkpoint_files uses it where the parsed source is this same FILE and closes
    it otherwise; anything unusual (an option first, not a file, unreadable) leaves it to the normal path."""
    source = argv[2] if len(argv) > 2 else ""
    if not source or source.startswith(("-", "s3://")):
        return None
    import os

    if not os.path.isfile(source):
        return None
    from nodus.checkpoint.mapped import MappedArchive

    try:
        return MappedArchive(source)
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    main()
