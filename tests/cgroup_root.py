"""For tests that make real cgroups: whether this host lets them, and a cgroup root of the test's
own that is swept (processes killed, directories removed) afterwards."""
from __future__ import annotations

import os
from typing import Iterator

from nodus.agent.cgroups import V1_CONTROLLERS, Cgroup, DEFAULT_FS, version


def cgroups_unavailable() -> str | None:
    """Why this host cannot make cgroups (None: it can)."""
    if os.geteuid() != 0:
        return "creating cgroups needs root"
    probe = Cgroup.create("nodus-tests", f"probe-{os.getpid()}")
    try:
        return None if probe.usable and not probe.missing else f"no writable cgroups: {probe.missing}"
    finally:
        probe.remove()


def own_root(prefix: str) -> Iterator[str]:
    """Yields a cgroup root name of this test's own; afterwards removes it with anything a failing
    test left in it (use it as the body of a fixture)."""
    name = f"{prefix}-{os.getpid()}"
    yield name
    for child in Cgroup.names(name):
        leftover = Cgroup.locate(name, child)
        leftover.kill_all()
        leftover.remove()
    parents = [DEFAULT_FS / name] if version() == 2 else [DEFAULT_FS / c / name for c in V1_CONTROLLERS]
    for parent in parents:
        try:
            parent.rmdir()
        except FileNotFoundError:
            pass
