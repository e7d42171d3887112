"""A pod's id-range slot (oci/pod.py IdSlots): looking one up while another pod frees its slot between
the listing and the read finds the right slot instead of failing (a race bench/startup.py hit)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodus.agent.oci.pod import IdSlots


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
