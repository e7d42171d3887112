"""GPU names: the family and the variant a product name stands for, and whether a GPU matches a Job's
`resources.gpu.type` (a family such as H100 matches every H100 variant and never another family;
`exact` pins the variant). The scheduler matches measured GPUs and price book accelerators with them;
registration reads a measured GPU's family with them (for fit.py).
"""
from __future__ import annotations

from typing import Iterable

_BRANDS = {"nvidia", "tesla", "geforce", "quadro"}
_JOINED = {"rtx", "gtx", "titan"}


def _words(name: str) -> list[str]:
    return [w for w in name.lower().replace("_", " ").replace("-", " ").split() if w not in _BRANDS]


def gpu_family(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` → `H100`; `A100-SXM4-80GB` → `A100`; `NVIDIA GeForce RTX 4090` → `RTX-4090`."""
    words = _words(name)
    if not words:
        return ""
    if words[0] in _JOINED and len(words) > 1:
        return f"{words[0]}-{words[1]}".upper()
    return words[0].upper()


def gpu_variant(name: str) -> str:
    """The whole product name, normalized: `NVIDIA H100 80GB HBM3` → `h100-80gb-hbm3`."""
    return "-".join(_words(name))


def gpu_matches(gpu_name: str, wanted: Iterable[str], exact: bool) -> bool:
    """A GPU matches when any wanted type names its family (or, with `exact`, its variant)."""
    for want in wanted:
        if exact and gpu_variant(want) == gpu_variant(gpu_name):
            return True
        if not exact and gpu_family(want) == gpu_family(gpu_name):
            return True
    return False
