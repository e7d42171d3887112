"""`nodus get sweep NAME`: after the Sweep's row, its cell table (index, params, gpu, region, phase,
cost, throughput), with the best cells marked as status.best names them."""
from __future__ import annotations

from typing import Any


def cell_table(sweep: dict[str, Any]) -> list[str]:
    """The lines of the cell table of a Sweep object (its status.cells and status.best)."""
    status = sweep.get("status") or {}
    best = status.get("best") or {}
    header = ["INDEX", "PARAMS", "GPU", "REGION", "REP", "PHASE", "COST", "UNITS/S", "BEST"]
    rows = []
    for cell in status.get("cells") or []:
        marks = [what for what, key in (("cost", "byCost"), ("throughput", "byThroughput"))
                 if best.get(key) == cell.get("index")]
        params = ",".join(f"{k}={v}" for k, v in sorted((cell.get("params") or {}).items()))
        rows.append([str(cell.get("index", "")), params or "-", cell.get("gpu") or "-", cell.get("region") or "-",
                     str(cell.get("repetition", 0)), cell.get("phase", ""), cell.get("costUSD", ""),
                     cell.get("unitsPerSecond") or "-", "*" + "+".join(marks) if marks else ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["   ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header, *rows]]
