"""The suite's secret scan: no Secret value in any log, status or audit record its daemons wrote.

Every Secret the tests create carries MARKER in its values. After the run, tests/conftest.py scans
the run's temporary root (every coordinator's and agent's data dir, log and work dir lives there) and
fails the run naming each file that holds the marker, plain or base64-encoded
(docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path

MARKER = "NODUS-TEST-SECRET-"
"""In every test Secret's values, e.g. "NODUS-TEST-SECRET-hf-1"."""

_SCANNED = re.compile(r"(\.log(\.\d+)?|\.json|\.jsonl|^store\.db(-wal)?)$")
"""Logs (the daemons', attempts', the audit log and its rotations), status and state JSON, the store."""


def needles(marker: str = MARKER) -> tuple[bytes, ...]:
    """The marker as written, and as base64 (at each of the three offsets a value may put it)."""
    found = [marker.encode()]
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + marker.encode()).decode()
        # Drop the characters that also hold bits of the bytes before and after the marker.
        start = (pad * 4 + 2) // 3 + 1 if pad else 0
        found.append(encoded[start:len(encoded) - 4].encode())
    return tuple(found)


def _delivered(path: Path) -> bool:
    """An attempt's secret mount (run/secrets/NAME/KEY): where the values are meant to be."""
    parts = path.parts
    return any(parts[i] == "secrets" and parts[i - 1] == "run" for i in range(1, len(parts)))


def scan(root: Path, marker: str = MARKER) -> list[Path]:
    """The files under `root` the scan covers that hold `marker`."""
    hits: list[Path] = []
    patterns = needles(marker)
    for directory, _, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(directory) / name
            if not (_SCANNED.search(name) or path.parent.name == "logs") or _delivered(path):
                continue
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if any(p in data for p in patterns):
                hits.append(path)
    return sorted(hits)
