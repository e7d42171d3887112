"""nodus-coordinator --gc-freeze: once start-up is done, its long-lived heap leaves the collector's
generations, so full collections inside requests no longer rescan the cache (heap.py)."""
from __future__ import annotations

import gc

import pytest

from nodus.coordinator.heap import Freeze, HeapSettings, Refreeze, settle
from nodus.coordinator.main import DEFAULTS, parser


class Cached:
    """Stands for an object of the synced cache."""


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_settle_moves_the_start_up_heap_out_of_the_full_collections() -> None:
    cached = [Cached() for _ in range(3)]
    assert _tracked(cached)
    thresholds = gc.get_threshold()
    try:
        frozen = settle(HeapSettings())
        assert frozen >= len(cached)
        assert not _tracked(cached)  # a full collection no longer scans it
        later = [Cached()]
        assert _tracked(later)  # what is allocated afterwards is collected as usual
        assert gc.get_threshold() == (10_000, 2, thresholds[2]), "young collections spaced, middle ones kept small"
        assert sum(isinstance(cb, Refreeze) for cb in gc.callbacks) == 1
        settle(HeapSettings())
        assert sum(isinstance(cb, Refreeze) for cb in gc.callbacks) == 1, "installed once however often settled"
    finally:
        _uninstall()
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _uninstall() -> None:
    for cb in [cb for cb in gc.callbacks if isinstance(cb, Refreeze)]:
        gc.callbacks.remove(cb)


class Cycle:
    """Long-lived objects in a reference cycle: only a collection that scans them frees them."""

    def __init__(self) -> None:
        self.me = self


def test_each_middle_or_full_collection_freezes_its_survivors_until_the_heap_grows_fourfold() -> None:
    rss = [1000]
    refreeze = Refreeze(rss=lambda: rss[0]).install()
    try:
        survivor = [Cached()]
        gc.collect(0)
        assert refreeze.freezes == 0 and _tracked(survivor), "a young collection freezes nothing"
        gc.collect(1)
        assert refreeze.freezes == 1 and not _tracked(survivor), "what a middle collection left is frozen"
        later = [Cached()]
        gc.collect()
        assert refreeze.freezes == 2 and not _tracked(later), "and what a full one left"
        dead = Cycle()
        gc.collect(1)
        del dead  # a cycle that died frozen: no collection scans it any more
        assert gc.collect() == 0
        rss[0] = 3999
        gc.collect(1)
        assert refreeze.unfreezes == 0 and not _tracked(survivor), "below fourfold: still frozen"
        rss[0] = 4000  # the heap grew fourfold: unfrozen, and nothing frozen until a full collection scanned it all
        gc.collect(1)
        assert refreeze.unfreezes == 1 and _tracked(survivor), "unfrozen: back in the oldest generation"
        gc.collect(1)
        assert _tracked(survivor), "a middle collection does not freeze what the full scan has not seen"
        assert gc.collect() >= 1, "the frozen cycle is freed by the full scan"
        assert not _tracked(survivor) and refreeze.unfreezes == 1, "and the survivors are frozen again"
    finally:
        _uninstall()
        gc.unfreeze()


def test_refreeze_off_installs_nothing() -> None:
    thresholds = gc.get_threshold()
    try:
        settle(HeapSettings(refreeze=False))
        assert not any(isinstance(cb, Refreeze) for cb in gc.callbacks)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_young_threshold_below_one_is_refused_naming_what_it_would_do() -> None:
    with pytest.raises(ValueError, match="turn the collector off"):
        HeapSettings(young_threshold=0)


def test_off_leaves_the_collector_as_cpython_sets_it() -> None:
    cached = [Cached()]
    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    assert settle(HeapSettings(Freeze.OFF)) == before
    assert _tracked(cached) and gc.get_threshold() == thresholds


def test_the_flag_defaults_to_on_and_a_bad_value_names_the_flag() -> None:
    assert HeapSettings.of(DEFAULTS["gc_freeze"]).freeze is Freeze.ON
    assert HeapSettings.of(parser().parse_args(["--gc-freeze", "off"]).gc_freeze).freeze is Freeze.OFF
    with pytest.raises(ValueError, match="--gc-freeze must be on or off"):
        HeapSettings.of("sometimes")
