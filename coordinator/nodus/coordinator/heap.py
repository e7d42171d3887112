"""The coordinator's garbage collector, settled once start-up is done.

The coordinator's long-lived heap is the controllers' watch-fed cache (every object of the store,
decoded) and the indexes built on it. CPython's full (generation 2) collections scan every tracked
object, so one that lands inside a request costs tens of milliseconds once that heap is large
(bench/estimate.py recorded priced dry runs over 200 nodes with a full collection inside at a 43 ms
median). Once the store is open and the cache has synced, `settle` collects once and moves what
survives into the permanent generation (`gc.freeze`, what CPython's documentation recommends for a
long-lived heap): later full collections scan only what was allocated since, and frozen objects are
still freed by reference counting when the cache drops them. It also raises the young generation's
threshold (CPython's 700 allocations) to `HeapSettings.young_threshold`: a coordinator turning over
Jobs allocates and frees dicts by the million, and a 10,000-cell Sweep spent a fifth of its CPU in
~2,700 collections, 22 of them full ones of the heap it had grown since start-up (ADR 0061).
`nodus-coordinator --gc-freeze off` leaves the collector as CPython sets it.
"""
from __future__ import annotations

import enum
import gc
from dataclasses import dataclass


class Freeze(enum.Enum):
    """`--gc-freeze`: whether start-up's survivors leave the collector's generations."""

    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class HeapSettings:
    """How the coordinator tunes CPython's collector after start-up."""

    freeze: Freeze = Freeze.ON
    young_threshold: int = 10_000
    """Allocations (less frees) of tracked objects between two collections of the young generation, set
    with the freeze (CPython's default is 700; every tenth young collection sweeps the middle one and
    every tenth of those may be a full one, so this spaces all three)."""

    def __post_init__(self) -> None:
        if self.young_threshold < 1:
            raise ValueError(f"the young generation's threshold must be at least 1 (got {self.young_threshold}): "
                             "0 would turn the collector off")

    @classmethod
    def of(cls, value: object) -> HeapSettings:
        """The settings of the `--gc-freeze` value; a clear error naming the flag otherwise."""
        try:
            return cls(Freeze(str(value or Freeze.ON.value).lower()))
        except ValueError:
            raise ValueError(f"--gc-freeze must be on or off (got {value!r})") from None


def settle(settings: HeapSettings) -> int:
    """Collects once, freezes the survivors and sets the young threshold (with Freeze.ON); returns how
    many objects are now frozen (0 with Freeze.OFF, which leaves the collector alone)."""
    if settings.freeze is Freeze.OFF:
        return gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    gc.set_threshold(settings.young_threshold, *gc.get_threshold()[1:])
    return gc.get_freeze_count()
