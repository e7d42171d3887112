"""The SDK tree the OCI runtime mounts into every container (agent/oci/sdk.py): exactly the SDK's
modules, made once per content and read-only, and PYTHONPATH with the Job's or the image's entries
first. The container side runs end to end in test_oci_e2e.py."""
from __future__ import annotations

import stat
from pathlib import Path

from nodus.agent.oci import sdk

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_holds_every_sdk_module_as_the_source_tree_has_it(tmp_path: Path) -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "sdk" / "nodus").glob("*.py")}
    assert sorted(source) == sorted(f"{m}.py" for m in sdk.MODULES), "a new SDK module must be listed in MODULES"
    tree = sdk.install(tmp_path / "sdk")
    assert {p.name: p.read_bytes() for p in (tree / "nodus").iterdir()} == source
    for p in (tree, tree / "nodus", *(tree / "nodus").iterdir()):
        assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), f"{p} is writable"
        assert p.stat().st_mode & stat.S_IROTH, f"{p} is not readable by a pod's uid"


def test_one_tree_per_content_and_an_old_one_stays_for_running_attempts(tmp_path: Path) -> None:
    first = sdk.install(tmp_path, {"progress.py": b"v1"})
    assert sdk.install(tmp_path, {"progress.py": b"v1"}) == first
    second = sdk.install(tmp_path, {"progress.py": b"v2"})
    assert second != first
    assert (first / "nodus" / "progress.py").read_bytes() == b"v1"
    assert (second / "nodus" / "progress.py").read_bytes() == b"v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name]), "no staging left"


def test_python_path_keeps_the_jobs_or_the_images_entries_first() -> None:
    assert sdk.python_path(["PATH=/bin"], {}) == "/nodus/sdk"
    assert sdk.python_path(["PYTHONPATH=/app:/lib"], {}) == "/app:/lib:/nodus/sdk"
    assert sdk.python_path(["PYTHONPATH=/app"], {"PYTHONPATH": "/mine"}) == "/mine:/nodus/sdk"
    assert sdk.python_path([], {"PYTHONPATH": "/nodus/sdk:/mine"}) == "/mine:/nodus/sdk"
