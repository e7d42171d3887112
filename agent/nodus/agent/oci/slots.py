"""Which pod holds which host id range, and the namespaces that belong to each range.

A slot is claimed before a pod's first container and released after its last one is deleted, so two
live pods never share host ids and a restarted agent sees the claims it made: one file per claimed slot,
created exclusively, naming its holder. The slot's namespaces (a user namespace mapping the pod's ids to
the slot's range, a network and an IPC namespace it owns) are bound under `ns/<slot>/`.

Spare pods (docs/adr/0111-spare-pod-namespaces.md): making a pod's namespaces (an `unshare` holder, the id
maps, three bind mounts, loopback) is ~5 ms on an image attempt's way to running. The agent makes them
ahead, off that way, for a slot it holds as `~spare`; a pod claims a spare by taking over its holder file
under the directory's lock, so two pods never take the same one. Namespaces are never passed from one pod to
another: a spare is fresh, and a slot claimed fresh has whatever a crashed holder left under it removed
first. A slot held `~making` is one an agent was killed while making: removed at the agent's next start.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from .bundle import ID_SLOTS, IdRange
from .namespaces import PodError, create_namespaces, remove_namespaces

SPARE = "~spare"
"""The holder of a slot whose namespaces are made and wait for a pod (no pod id has a "~": pod_safe_id)."""
MAKING = "~making"
"""The holder while the agent makes a spare's namespaces."""


class IdSlots:
    """The slot files and the slots' namespaces under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def namespaces(self, slot: int) -> Path:
        """Where the slot's namespace files are bound (create_namespaces' directory)."""
        return self.directory / "ns" / str(slot)

    def _holders(self) -> Iterator[tuple[int, str]]:
        if not self.directory.is_dir():
            return
        for entry in self.directory.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                holder = entry.read_text()
            except FileNotFoundError:
                continue  # another pod freed that slot between the listing and the read
            yield int(entry.name), holder

    def slot_of(self, pod_id: str) -> int | None:
        return next((slot for slot, holder in self._holders() if holder == pod_id), None)

    def spares(self) -> list[int]:
        return sorted(slot for slot, holder in self._holders() if holder == SPARE)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialises taking over a spare (and removing spares): a read then a replace of its holder file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _hold(self, slot: int, holder: str) -> None:
        """Rewrites a held slot's holder at once (a reader sees the old name or the new, never neither)."""
        tmp = self.directory / f".{slot}.{os.getpid()}"
        tmp.write_text(holder)
        os.replace(tmp, self.directory / str(slot))

    def _claim_free(self, holder: str) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        for slot in range(ID_SLOTS):
            try:
                fd = os.open(self.directory / str(slot), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue
            # not fsynced: a restarted agent reads it from the page cache, and after a host crash no pod of
            # the slot lives (an empty file a crash left holds its slot either way, fsync or not)
            with os.fdopen(fd, "w") as f:
                f.write(holder)
            # a holder killed between its namespaces' removal and its release left them: never another pod's
            remove_namespaces(self.namespaces(slot))
            return slot
        raise PodError(f"all {ID_SLOTS} host id ranges are held by pods; wait for attempts to end")

    def claim(self, pod_id: str) -> int:
        """The pod's slot: the one it holds already (its namespaces with it), else a spare's (namespaces
        made), else the lowest free one (none yet)."""
        held = self.slot_of(pod_id)
        if held is not None:
            return held
        if self.directory.is_dir():
            with self._locked():
                spare = next((slot for slot, holder in self._holders() if holder == SPARE), None)
                if spare is not None:
                    self._hold(spare, pod_id)
                    return spare
        return self._claim_free(pod_id)

    def release(self, pod_id: str) -> None:
        """Frees the pod's slot, its namespaces first (a spare's, taken over, included)."""
        slot = self.slot_of(pod_id)
        if slot is not None:
            remove_namespaces(self.namespaces(slot))
            (self.directory / str(slot)).unlink(missing_ok=True)

    def make_spare(self) -> int:
        """Claims a free slot and makes its namespaces, then offers it as a spare; raises PodError."""
        slot = self._claim_free(MAKING)
        try:
            create_namespaces(self.namespaces(slot), IdRange.for_slot(slot))
        except BaseException:
            remove_namespaces(self.namespaces(slot))
            (self.directory / str(slot)).unlink(missing_ok=True)
            raise
        self._hold(slot, SPARE)
        return slot

    def remove_spares(self, unfinished_only: bool = False) -> int:
        """Removes the spares no pod took (or only those an agent was killed while making): their
        namespaces, then their slots. Returns how many."""
        if not self.directory.is_dir():
            return 0
        removed = 0
        with self._locked():
            for slot, holder in list(self._holders()):
                if holder == MAKING or (holder == SPARE and not unfinished_only):
                    self._hold(slot, MAKING)  # a removal cut short leaves no spare for a pod to take
                    remove_namespaces(self.namespaces(slot))
                    (self.directory / str(slot)).unlink(missing_ok=True)
                    removed += 1
        return removed

    def unbind_all(self) -> None:
        """Removes every slot's namespaces, whoever holds it: for a work dir about to be deleted, once no pod
        runs (`nodus-agent uninstall --purge`, a test's teardown)."""
        top = self.directory / "ns"
        for directory in top.iterdir() if top.is_dir() else ():
            remove_namespaces(directory)
