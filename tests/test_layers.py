"""The dependency direction of DESIGN.md, enforced by import-linter (the contracts in pyproject.toml).

`lint-imports` runs over the installed source roots; then over a copy of the tree with one forbidden
import added, to show the contracts catch each kind of crossing rather than pass vacuously.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("proto", "sdk", "cli", "agent", "coordinator", "checkpoint", "launchers")
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(config: Path, pythonpath: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], capture_output=True, text=True,
                          env=env, cwd=config.parent, timeout=300)


def test_the_tree_keeps_every_contract() -> None:
    result = _lint(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source roots copied (Python files only), placed first on PYTHONPATH by _lint."""
    copy = tmp_path_factory.mktemp("tree")
    for root in SOURCE_ROOTS:
        shutil.copytree(ROOT / root, copy / root, ignore=shutil.ignore_patterns("__pycache__", "*.proto"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


@pytest.mark.parametrize("module,line,contract", [
    ("agent/nodus/agent/_bad.py", "from nodus.coordinator import errors",
     "The agent and the coordinator never import each other"),
    ("coordinator/nodus/coordinator/_bad.py", "import nodus.agent.layout",
     "The agent and the coordinator never import each other"),
    ("coordinator/nodus/coordinator/controllers/_bad.py", "from .. import grpc_api",
     "The coordinator's layers point one way"),
    ("coordinator/nodus/coordinator/api/_bad.py", "from ..controllers import objects",
     "The coordinator's layers point one way"),
    ("cli/nodus/cli/_bad.py", "from nodus.agent import layout", "The CLI and the Python client import neither daemon"),
    ("cli/nodus/client/_bad.py", "from nodus.coordinator import errors",
     "The CLI and the Python client import neither daemon"),
    ("checkpoint/nodus/checkpoint/_bad.py", "import nodus.launchers.model", "checkpoint imports nothing of ours"),
    ("launchers/nodus/launchers/_bad.py", "from nodus.v1 import common_pb2", "launchers import nothing of ours"),
])
def test_a_forbidden_import_breaks_its_contract(tree_copy: Path, module: str, line: str, contract: str) -> None:
    bad = tree_copy / module
    bad.write_text(f"{line}\n")
    try:
        result = _lint(tree_copy / "pyproject.toml", [tree_copy / r for r in SOURCE_ROOTS])
    finally:
        bad.unlink()
    assert result.returncode != 0, result.stdout
    assert f"{contract} BROKEN" in result.stdout, result.stdout
    assert "_bad" in result.stdout  # the report names the module that crossed


# The top-level modules of the namespace (the program-side helpers and the daemon settings) are
# modules, which import-linter cannot take as roots: they import no package of ours but the handshake.
SDK_MAY_IMPORT = {"nodus.handshake"}


@pytest.mark.parametrize("path", sorted((ROOT / "sdk" / "nodus").glob("*.py")), ids=lambda p: p.name)
def test_the_sdk_modules_import_no_package_of_ours(path: Path) -> None:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path.name}: relative import"
            # `from nodus import progress` names a module; `from nodus.x import y` names x.
            found |= {f"nodus.{a.name}" for a in node.names} if node.module == "nodus" else {node.module or ""}
    ours = {name for name in found if name.split(".")[0] == "nodus"}
    assert ours <= SDK_MAY_IMPORT, sorted(ours - SDK_MAY_IMPORT)
