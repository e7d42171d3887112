"""The coordinator's flags for blob and log garbage collection (blob_gc.py, ADR 0047).

main.py adds them to its parser (`add_flags`) and hands `gc(args)` to the control plane.
"""
from __future__ import annotations

import argparse

from .api import units
from .blob_gc import GcSettings

DEFAULTS = {"blob_gc_interval": "10m", "blob_gc_grace": "1h"}


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags, and their defaults beside the parser's own (`_defaults`, as nodus.config reads them)."""
    p.add_argument("--blob-gc-interval", help="how often blobs and logs nothing references any more (a deleted "
                   "Job's outputs and logs, old volume revisions' archives) are looked for, 1s-24h (default 10m)")
    p.add_argument("--blob-gc-grace", help="how long a blob or log stays unreferenced before it is deleted; an "
                   "upload is stored before the write that names it, so keep it well above any upload, 1s-720h "
                   "(default 1h)")
    p.set_defaults(_defaults={**(p.get_default("_defaults") or {}), **DEFAULTS})


def gc(args: argparse.Namespace) -> GcSettings:
    """--blob-gc-interval and --blob-gc-grace as seconds."""
    out = []
    for flag, value, most in (("--blob-gc-interval", args.blob_gc_interval, 24 * 3600),
                              ("--blob-gc-grace", args.blob_gc_grace, 720 * 3600)):
        try:
            seconds = units.parse_duration_ns(str(value)) / units.NS_PER_SECOND
        except ValueError as e:
            raise SystemExit(f"{flag}: {e}") from None
        if not 1 <= seconds <= most:
            raise SystemExit(f"{flag} must be between 1s and {most // 3600}h (got {value})")
        out.append(seconds)
    return GcSettings(interval=out[0], grace=out[1])
