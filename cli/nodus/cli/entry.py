"""The `nodus` command: `nodus checkpoint save|restore|verify` go straight to checkpoint_files, which
imports only nodus.checkpoint; everything else goes to main.py and its REST client.

A checkpoint saved from a shell (a job's own script, a cron line) pays the CLI's start-up on every
save: with main.py's imports (requests, grpc, yaml, every verb) that was about 0.35 CPU-seconds,
longer than saving a 100 MB state; this path starts in what Python and the library take (ADR 0053).
"""
from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "checkpoint" and argv[1] in ("save", "restore", "verify"):
        import os

        from .checkpoint_files import main as files_main

        rc = files_main(argv)
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


if __name__ == "__main__":
    main()
