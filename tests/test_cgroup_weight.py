"""An attempt's cgroup lifts its CPU weight to the kernel's default while the node sets a container up in
it (`Cgroup.default_weight`, docs/adr/0076), and gives the attempt its own back afterwards, also when the
setup fails. Needs a writable cgroup hierarchy (root on v1 or v2)."""
from __future__ import annotations

from typing import Iterator

import pytest

from cgroup_root import cgroups_unavailable, own_root
from nodus.agent.cgroups import DEFAULT_WEIGHT, Cgroup

pytestmark = pytest.mark.skipif(bool(cgroups_unavailable()), reason=cgroups_unavailable() or "")


@pytest.fixture
def root() -> Iterator[str]:
    yield from own_root("nodus-weight")


def _weight(cg: Cgroup) -> str:
    controller = "unified" if "unified" in cg.paths else "cpu"
    name, _ = DEFAULT_WEIGHT[controller]
    return (cg.paths[controller] / name).read_text().strip()


def test_a_small_floor_is_lifted_for_the_setup_and_restored(root: str) -> None:
    cg = Cgroup.create(root, "att", cpu_millis=100)
    try:
        own = _weight(cg)
        default = DEFAULT_WEIGHT["unified" if "unified" in cg.paths else "cpu"][1]
        assert own != default  # 100 millicores: 102 shares on v1, weight 10 on v2
        with Cgroup.locate(root, "att").default_weight():
            assert _weight(cg) == default
        assert _weight(cg) == own
        with pytest.raises(RuntimeError), Cgroup.locate(root, "att").default_weight():
            assert _weight(cg) == default
            raise RuntimeError("runc failed")
        assert _weight(cg) == own
    finally:
        cg.remove()


def test_a_cgroup_without_a_cpu_directory_is_left_alone(root: str) -> None:
    with Cgroup.locate(root, "never-made").default_weight():
        pass  # nothing located: nothing to lift or restore
