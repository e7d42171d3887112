"""The suite's secret scan (tests/secret_scan.py, run over the whole run by tests/conftest.py) finds
a test Secret's value in a log, a status file or an audit record, plain or base64, and leaves alone
the attempt's own secret mount, where the value belongs."""
from __future__ import annotations

import base64
from pathlib import Path

from secret_scan import MARKER, scan


def test_the_scan_names_each_file_that_holds_a_test_secret(tmp_path: Path) -> None:
    root = tmp_path / "planted"
    value = MARKER + "planted-41c9"
    files = {
        "data/coordinator.log": f"2026-12-03 INFO nodus: oops {value}\n",
        "data/audit.log.2": '{"verb":"create","name":"' + value + '"}\n',
        "work/attempts/a1/run/status.json": '{"message":"' + base64.b64encode(value.encode()).decode() + '"}',
        "work/attempts/a2/logs/attempt.log": "x" + base64.b64encode(b"ab" + value.encode()).decode() + "\n",
        "work/attempts/a3/run/secrets/db/password": value,  # delivered: where it belongs
        "data/clean.log": "nothing here\n",
        "inputs/manifest.yaml": value,  # a test's own input, not written by a daemon
    }
    try:
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        assert [p.relative_to(root).as_posix() for p in scan(root)] == [
            "data/audit.log.2", "data/coordinator.log", "work/attempts/a1/run/status.json",
            "work/attempts/a2/logs/attempt.log"]
    finally:  # the run's own scan (conftest.py) must not find these
        for name in files:
            (root / name).unlink()
    assert scan(root) == []
