"""Does a node's measured shape fit the offering it joins as? Pure: the differences, in words.

A customer pays an offering's rate for its shape, so a node that has fewer GPUs, another GPU family,
smaller GPUs, fewer vCPUs or less memory than the offering says is refused at registration, with
each difference named. GPUs must match in count exactly (an x4 host is not an x8 offering); vCPUs
and memory must be at least what is sold; the region class and interruptibility the agent declares
(--region, --interruptible) must be the offering's, so that placement and its customers read one
truth. Measured memory runs a little below the marketed size
(NVML reports 79.6 GiB of an "80 GB" H100; the kernel keeps some host RAM), hence the tolerance.
Disk and interconnect are not measured yet.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from .pricebook import Offering

MEMORY_TOLERANCE = Decimal("0.95")
"""A measured size counts as the offering's when it is at least this share of it."""


@dataclass(frozen=True, slots=True)
class MeasuredGpu:
    name: str
    family: str
    """The family the scheduler reads from the product name (NVIDIA H100 80GB HBM3 → H100)."""
    memory_bytes: int
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class MeasuredShape:
    """What the agent's inventory says the host is."""

    gpus: tuple[MeasuredGpu, ...]
    vcpus: int
    memory_bytes: int
    region_class: str = ""
    """What the agent was told (--region); empty: the offering's."""
    interruptible: bool = False


def _gib(n: int) -> str:
    return f"{Decimal(n) / (1 << 30):.1f}Gi"


def differences(offering: Offering, shape: MeasuredShape) -> tuple[str, ...]:
    """Every way `shape` falls short of `offering`; empty when it fits."""
    out: list[str] = []
    acc = offering.accelerator
    want = acc.gpus_per_node if acc else 0
    if len(shape.gpus) != want:
        out.append(f"GPUs: the node has {len(shape.gpus)}, offering {offering.id} has {want}")
    if acc is not None and shape.gpus:
        families = sorted({g.family for g in shape.gpus if g.family.upper() != acc.family.upper()})
        if families:
            out.append(f"GPU family: the node has {', '.join(families) or 'unnamed GPUs'}, "
                       f"offering {offering.id} has {acc.family}")
        smallest = min(g.memory_bytes for g in shape.gpus)
        if smallest < acc.memory_bytes * MEMORY_TOLERANCE:
            out.append(f"GPU memory: the node's smallest GPU has {_gib(smallest)}, offering {offering.id} has "
                       f"{_gib(acc.memory_bytes)} per GPU")
    if shape.vcpus < offering.vcpus:
        out.append(f"vCPU: the node has {shape.vcpus}, offering {offering.id} has {offering.vcpus}")
    if shape.memory_bytes < offering.memory_bytes * MEMORY_TOLERANCE:
        out.append(f"memory: the node has {_gib(shape.memory_bytes)}, offering {offering.id} has "
                   f"{_gib(offering.memory_bytes)}")
    if shape.region_class and shape.region_class != offering.region_class:
        out.append(f"region class: the node says {shape.region_class} (--region), offering {offering.id} is in "
                   f"{offering.region_class}")
    if shape.interruptible != offering.interruptible:
        said, sold = ("true", "is not interruptible") if shape.interruptible else ("false", "is interruptible")
        out.append(f"interruptible: the node says {said} (--interruptible), offering {offering.id} {sold}")
    return tuple(out)
