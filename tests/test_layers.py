"""The dependency direction of DESIGN.md, enforced: a forbidden import fails here, not in review."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"coordinator": "coordinator", "agent": "agent", "checkpoint": "checkpoint",
           "launchers": "launchers", "proto": "proto", "nodus": "nodus"}
FORBIDDEN = {
    "checkpoint": {"coordinator", "agent", "launchers", "proto", "nodus"},
    "launchers": {"coordinator", "agent", "checkpoint", "proto", "nodus"},
    "agent": {"coordinator"},
    "coordinator": {"agent"},
    "proto": {"coordinator", "agent", "checkpoint", "launchers", "nodus"},
}


def _imports(path: Path, package: str) -> set[str]:
    """The nodus.* subpackages a module imports (relative imports resolved against its package)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                continue  # relative: stays inside its own folder by construction
            names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "nodus" and len(parts) > 1 and parts[1] in FOLDERS:
                found.add(parts[1])
            elif parts[0] == "nodus":
                found.add("nodus")
    return found - {package}


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_imports_only_what_the_design_allows(folder: str) -> None:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        hits = _imports(path, folder) & FORBIDDEN[folder]
        if hits:
            bad.append(f"{path.relative_to(ROOT)} imports nodus.{', nodus.'.join(sorted(hits))}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from nodus.coordinator import resources\nimport nodus.agent.main\n")
    assert _imports(module, "checkpoint") == {"coordinator", "agent"}
