"""What every bench shares about its report: the `--tiny` and `--save` flags, and bench/results/<name>.txt.

A bench prints its report inside `with Report(name, args):`; the report goes to stdout as before and, with
`--save`, also to bench/results/<name>.txt under a header that says when, where and in which
configuration it ran, so that a figure quoted in bench/README.md or an ADR can be traced to a real run.
`--tiny` swaps in the bench's own tiny configuration (seconds, not minutes) that tests/test_benches.py
runs so that no bench rots; its figures are only shape, not numbers to quote.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def add_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny configuration that runs in seconds (what the test suite runs; figures not to quote)")
    ap.add_argument("--save", action="store_true", help="also write the report to bench/results/<name>.txt")


def shrink(args: argparse.Namespace, tiny: dict[str, Any]) -> argparse.Namespace:
    """With --tiny, the tiny configuration's values replace the parsed ones."""
    if args.tiny:
        for key, value in tiny.items():
            setattr(args, key, value)
    return args


class Report:
    """Captures what the bench prints as its report; echoes it to stdout and, with --save, to the results file."""

    __slots__ = ("name", "args", "_buf", "_redirect")

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self._buf = io.StringIO()
        self._redirect = contextlib.redirect_stdout(self._buf)

    def __enter__(self) -> Report:
        self._redirect.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._redirect.__exit__(kind, exc, tb)
        text = self._buf.getvalue()
        sys.stdout.write(text)
        sys.stdout.flush()
        if kind is None and self.args.save:
            self.save(text)

    def save(self, text: str) -> None:
        config = " ".join(sys.argv[1:]) or "(defaults)"
        header = (f"# bench/{self.name}.py, run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
                  f"{platform.node()} ({os.cpu_count()} CPUs, shared with other work), Python "
                  f"{platform.python_version()}\n# configuration: {config}\n")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{self.name}.txt").write_text(header + text.lstrip("\n"))
