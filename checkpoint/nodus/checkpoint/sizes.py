"""Byte quantities as people and the Job spec write them: `1Ti`, `512Mi`, `10G`, `4096`."""
from __future__ import annotations

import re

_UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGTP]i?)?[bB]?\s*$")


def parse_size(text: str) -> int:
    """`1Ti` → 1099511627776. Raises ValueError naming the accepted forms."""
    m = _QUANTITY.match(text)
    if not m or (m.group(2) or "") not in _UNITS:
        raise ValueError(f"{text!r} is not a size (use a number with an optional unit: 4096, 512Mi, 10G, 1Ti)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def format_size(n: int) -> str:
    """1536 → `1.5Ki`: binary units, at most three significant digits."""
    if n < 1024:
        return str(n)
    value = float(n)
    for unit in ("Ki", "Mi", "Gi", "Ti", "Pi"):
        value /= 1024
        if value < 1024 or unit == "Pi":
            return f"{value:.0f}{unit}" if value >= 100 else f"{value:.3g}{unit}"
    return str(n)
