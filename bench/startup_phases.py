"""Where bench/startup.py's many-index Job spends its time: each index's phases from its Attempt's
timestamps, and the CPU-seconds each process of the cluster spent per index.

With P indexes in flight, indexes/s = P / (an index's lifetime + the wait from its end to the next
index's Attempt), and on this host the CPUs cap it at (CPUs / CPU-seconds per index): the two lines
these functions feed say which of the two holds the figure back, and whose CPU it is.
"""
from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any, Callable

import psutil

PHASES = ("created → placed", "placed → inputs ready", "inputs ready → started", "started → finished",
          "end → next created")


def _when(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp).timestamp() if stamp else None


def index_phases(attempts: list[dict[str, Any]], parallelism: int) -> dict[str, float]:
    """Medians in ms over the Job's Attempts of each of PHASES: creationTimestamp → provisioningTime →
    inputsReadyTime → startTime → finishTime (the coordinator's and the agent's wall clocks, to the ms),
    and from the k-th end to the (k + parallelism)-th Attempt created (the slot that end freed)."""
    rows = []
    for a in attempts:
        st = a.get("status") or {}
        marks = [_when(a["metadata"].get("creationTimestamp")), _when(st.get("provisioningTime")),
                 _when(st.get("inputsReadyTime")), _when(st.get("startTime")), _when(st.get("finishTime"))]
        if None not in marks:
            rows.append(marks)
    if not rows:
        return {p: float("nan") for p in PHASES}
    out = {p: statistics.median((r[i + 1] - r[i]) * 1000 for r in rows) for i, p in enumerate(PHASES[:4])}
    created = sorted(r[0] for r in rows)
    ended = sorted(r[4] for r in rows)
    waits = [(created[k] - ended[k - parallelism]) * 1000 for k in range(parallelism, len(created))]
    out[PHASES[4]] = statistics.median(waits) if waits else float("nan")
    return out


def cpu_seconds(agent_pid: int, coordinator_pid: int) -> Callable[[], dict[str, float]]:
    """A reader of the CPU-seconds (user + system) so far of the agent, its supervisors (the zygote with
    the supervisors it forked, and what they ran) and the coordinator. Each process below the agent counts
    its own time and its reaped children's, so a supervisor still alive (one that stays for its Job's next
    index, ADR 0124, or one that runs) counts as much as one the zygote reaped."""
    agent, coordinator = psutil.Process(agent_pid), psutil.Process(coordinator_pid)

    def read() -> dict[str, float]:
        t = agent.cpu_times()
        out = {"agent": t.user + t.system, "supervisors": 0.0}
        for child in agent.children(recursive=True):
            try:
                c = child.cpu_times()
            except psutil.Error:
                continue
            out["supervisors"] += c.user + c.system + c.children_user + c.children_system
        c = coordinator.cpu_times()
        out["coordinator"] = c.user + c.system
        return out

    return read
