"""The operator's limits on what admission accepts, as one value passed down to every decoding.

`nodus-coordinator` builds it from its flags and hands it to the resource service, which gives it to
each admission; the per-field checks and cross-field rules that depend on it read it from there, so
two services in one process can admit under different limits.
"""
from __future__ import annotations

from dataclasses import dataclass

GANG_NODES = (2, 16)
"""The gang sizes the API can express (spec.distributed.nodes); the operator's cap lies within."""


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What the operator lets a Job ask for."""

    gang_max_nodes: int = 8
    """The most nodes a gang may ask for (2-16; 8 during the beta): `nodus-coordinator --gang-max-nodes`."""

    def __post_init__(self) -> None:
        low, high = GANG_NODES
        if isinstance(self.gang_max_nodes, bool) or not isinstance(self.gang_max_nodes, int) \
                or not low <= self.gang_max_nodes <= high:
            raise ValueError(f"the gang size cap must be between {low} and {high}, got {self.gang_max_nodes!r}")


BETA = AdmissionLimits()
"""The limits of the beta, where the operator set none."""
