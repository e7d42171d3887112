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

After start-up the heap keeps growing (a queue of 10,000 waiting Jobs is millions of tracked objects in the
cache), and CPython runs a full collection of all of it each time it grew by a quarter, and middle ones of
everything ten young collections left: 150-540 ms pauses of every request in flight under load (ADR 0084).
`Refreeze`, installed by `settle`, freezes what each middle or full collection leaves, and the middle
generation is collected after 2 young collections instead of 10, so no collection scans more than what
2 x 10,000 allocations left. Cyclic garbage made of frozen objects waits for the next full scan of
everything, which `Refreeze` asks for (unfreezing) whenever the process's peak RSS has grown `GROWTH` times
since the last.
"""
from __future__ import annotations

import enum
import gc
import resource
from dataclasses import dataclass
from typing import Any, Callable


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
    with the freeze (CPython's default is 700)."""
    middle_threshold: int = 2
    """Young collections between two of the middle generation (CPython's 10): its pause scans what that
    many young collections left, so it stays near a young one's (ADR 0084)."""
    refreeze: bool = True
    """Freeze what each full collection leaves (`Refreeze`)."""

    def __post_init__(self) -> None:
        for name, value in (("young", self.young_threshold), ("middle", self.middle_threshold)):
            if value < 1:
                raise ValueError(f"the {name} generation's threshold must be at least 1 (got {value}): "
                                 "0 would turn the collector off")

    @classmethod
    def of(cls, value: object) -> HeapSettings:
        """The settings of the `--gc-freeze` value; a clear error naming the flag otherwise."""
        try:
            return cls(Freeze(str(value or Freeze.ON.value).lower()))
        except ValueError:
            raise ValueError(f"--gc-freeze must be on or off (got {value!r})") from None


def peak_rss() -> int:
    """The process's peak resident set (getrusage's ru_maxrss: KiB on Linux); only compared with itself."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


GROWTH = 4
"""How much the peak RSS grows between two full scans of everything. What they free is small: bench/backlog.py's
10,000 Jobs (ADR 0084) had each such scan free ~4,100 objects (frozen cycles) of millions, at 245-400 ms of
CPU each when it doubled; four times bounds that garbage all the same and scans half as often."""


class Refreeze:
    """A `gc.callbacks` entry: after each collection of the middle or the oldest generation, freezes what
    survived it (gc.freeze moves every generation's objects to the permanent one, and after such a
    collection only its survivors are there), so no later collection scans them again: every pause is
    bounded by what two young collections leave. When the peak RSS has grown GROWTH times since the last full scan it
    unfreezes instead and freezes nothing until the next full collection, which scans everything once
    (freeing the cycles that died frozen)."""

    def __init__(self, rss: Callable[[], int] = peak_rss) -> None:
        self._rss = rss
        self._baseline = rss()
        self._scanning = False
        """Unfrozen, waiting for the full collection that scans everything."""
        self.freezes = self.unfreezes = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info.get("generation")
        if phase != "stop" or generation == 0:
            return
        if self._scanning:
            if generation != 2:
                return
            self._scanning = False
        elif (now := self._rss()) >= GROWTH * self._baseline:
            self._baseline, self._scanning = now, True
            gc.unfreeze()  # back in the oldest generation: the next full collection scans all of it
            self.unfreezes += 1
            return
        gc.freeze()
        self.freezes += 1

    def install(self) -> "Refreeze":
        for cb in list(gc.callbacks):
            if isinstance(cb, Refreeze):
                gc.callbacks.remove(cb)  # one per process (bench/estimate.py settles several services)
        gc.callbacks.append(self)
        return self


def settle(settings: HeapSettings) -> int:
    """Collects once, freezes the survivors, sets the young and middle thresholds and installs `Refreeze`
    (with Freeze.ON); returns how many objects are now frozen (0 with Freeze.OFF, which leaves the
    collector alone)."""
    if settings.freeze is Freeze.OFF:
        return gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    gc.set_threshold(settings.young_threshold, settings.middle_threshold, gc.get_threshold()[2])
    if settings.refreeze:
        Refreeze().install()
    return gc.get_freeze_count()
