"""What a heartbeat's LeaseRenewal tells the agent (`liveness.expiry`, ADR 0117) is the expiry of the lease the
replica knows (`liveness.overlay`, ADR 0049) for any stored lease and newest beat: renewed by a beat heard
within the lease, the stored one otherwise, an expired stored lease revived by a beat."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings, strategies as st

from nodus.coordinator.clock import parse, rfc3339
from nodus.coordinator.controllers.liveness import Beat, expiry, overlay

T0 = 1_800_000_000.0
DURATION = 15.0
NODE = {"name": "n1", "sessionId": "s1", "epoch": 2}


@st.composite
def _stored(draw: Any) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    return {"node": "n1", "sessionId": draw(st.sampled_from(["s1", "s0"])), "epoch": 2,
            "expireTime": rfc3339(T0 + draw(st.floats(-40, 40))), "expired": draw(st.booleans())}


@settings(max_examples=300, deadline=None)
@given(stored=_stored(), beat_at=st.one_of(st.none(), st.floats(-40, 40)),
       session=st.sampled_from(["s1", "s0"]), now=st.floats(-20, 40))
def test_a_renewal_names_the_expiry_of_the_lease_the_replica_knows(stored: dict[str, Any] | None,
                                                                   beat_at: float | None, session: str,
                                                                   now: float) -> None:
    beat = None if beat_at is None else Beat(session, 2, T0 + beat_at)
    known = overlay(stored, beat, NODE, DURATION, T0 + now)
    said = expiry(stored, beat, NODE, DURATION, T0 + now)
    assert said == (None if known is None else parse(known.get("expireTime"))), (known, said)
