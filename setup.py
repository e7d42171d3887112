"""Maps the top-level folders onto the `nodus` package (docs/adr/0001-layout.md).

Each folder is a package of its own (`coordinator/` is `nodus.coordinator`), so the tree shows the
architecture while imports stay under one name. pyproject.toml holds everything else.
"""
from setuptools import find_packages, setup

ROOTS = {
    "nodus": "nodus",
    "nodus.proto": "proto",
    "nodus.coordinator": "coordinator",
    "nodus.agent": "agent",
    "nodus.checkpoint": "checkpoint",
    "nodus.launchers": "launchers",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for package, folder in ROOTS.items():
    package_dir[package] = folder
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
