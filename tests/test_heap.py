"""nodus-coordinator --gc-freeze: once start-up is done, its long-lived heap leaves the collector's
generations, so full collections inside requests no longer rescan the cache (heap.py)."""
from __future__ import annotations

import gc

import pytest

from nodus.coordinator.heap import Freeze, HeapSettings, settle
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
        assert gc.get_threshold() == (10_000, *thresholds[1:]), "young collections spaced, the others as they were"
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
