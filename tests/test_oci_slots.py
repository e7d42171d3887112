"""A pod's id-range slot (oci/pod.py IdSlots): looking one up while another pod frees its slot between
the listing and the read finds the right slot instead of failing (a race bench/startup.py hit)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodus.agent.oci.slots import IdSlots


def test_a_slot_freed_during_the_lookup_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slots = IdSlots(tmp_path / "ids")
    assert slots.claim("pod-a") == 0 and slots.claim("pod-b") == 1
    real = Path.read_text

    def racing(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == "0":  # pod-a's slot goes away after iterdir() listed it
            self.unlink(missing_ok=True)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", racing)
    assert slots.slot_of("pod-b") == 1
    assert slots.slot_of("pod-a") is None


def test_two_pods_never_take_the_same_spare(tmp_path: Path) -> None:
    """ADR 0111: a spare slot is taken over under the directory's lock; of pods claiming at once, one gets it
    and the others a free slot each, never the spare's."""
    import threading

    from nodus.agent.oci.slots import SPARE

    slots = IdSlots(tmp_path / "ids")
    assert slots.claim("pod-a") == 0
    (tmp_path / "ids" / "1").write_text(SPARE)  # as make_spare leaves one (its namespaces aside)
    assert slots.spares() == [1]
    got: dict[str, int] = {}
    start = threading.Barrier(8)

    def claim(pod: str) -> None:
        start.wait()
        got[pod] = IdSlots(tmp_path / "ids").claim(pod)  # each its own descriptor of the lock, as processes have

    threads = [threading.Thread(target=claim, args=(f"pod-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got.values()) == list(range(1, 9))  # the spare's slot went to exactly one of them
    assert slots.spares() == []
    assert {pod: slots.slot_of(pod) for pod in got} == got  # each slot file names its one holder
