"""mypy as pyproject.toml [tool.mypy] configures it: strict on the pure cores, passing elsewhere.

The whole-tree run needs mypy at zero errors; the planted-error run shows the strict override is
really in effect for a strict module, so a pass is not vacuous.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nodus.agent", "nodus.coordinator", "nodus.checkpoint", "nodus.launchers", "nodus.cli", "nodus.client",
            "nodus.config", "nodus.progress", "nodus.handshake", "nodus.hf", "nodus.hostinstall")


def mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_a_planted_type_error_in_a_strict_module_is_reported(tmp_path: Path) -> None:
    # A copy of the launchers (they import nothing of ours), checked under the repo's config.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "launchers" / "nodus" / "launchers", src / "nodus" / "launchers")
    (src / "nodus" / "launchers" / "planted.py").write_text(
        "def count() -> int:\n    return 'three'\n\n\ndef untyped(x):\n    return x\n")
    done = mypy("--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                "-p", "nodus.launchers", cwd=src)
    print(done.stdout, done.stderr)
    assert done.returncode == 1
    assert 'planted.py:2: error: Incompatible return value type (got "str", expected "int")' in done.stdout
    # Only the strict override reports a function without annotations.
    assert "planted.py:5: error: Function is missing a type annotation  [no-untyped-def]" in done.stdout
    assert "Found 2 errors in 1 file" in done.stdout


def test_mypy_passes_as_configured(tmp_path: Path) -> None:
    done = mypy(*[a for p in PACKAGES for a in ("-p", p)], "--cache-dir", str(tmp_path / "cache"), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
