"""bench/fleet.py runs once, in its quick configuration: a few simulated agents (the real agent's Link against a
real nodus-coordinator) place and finish every attempt of the burst, keep their long attempts across the
coordinator's restart, and the report prints every figure beside its target or anchor, as a number.

As tests/test_benches.py does for the other benches, nothing is asserted about the figures' values: this
machine is shared and noisy, and bench/ is where figures are read. The counts are asserted: they are what
the protocol did, not how fast.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_benches import NUM, figures

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_fleet_bench_places_and_finishes_every_attempt_and_prints_every_figure() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "fleet.py"), "--quick"], capture_output=True, text=True,
                          timeout=300, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stdout
    figures(report, {
        "enrolment": rf"^enrol \(CSR → client certificate\) p50 / p99\s+({NUM}) ms / ({NUM}) ms; all 3 in ({NUM}) s",
        "join": rf"^join \(Register \+ Connect over mTLS, all at once\)\s+({NUM}) s$",
        "CPU before beside the bare AgentService": rf"^coordinator CPU at steady state, before the burst\s+({NUM}) % "
                                                   rf"of a core .*bare grpc\.aio AgentService, same heartbeats ({NUM}) %$",
        "CPU after beside the bare AgentService": rf"^coordinator CPU at steady state, after the drain\s+({NUM}) % of a "
                                                  rf"core .*bare grpc\.aio AgentService, same heartbeats ({NUM}) %$",
        "CPU per heartbeat": rf"^  per heartbeat: ({NUM}) ms of CPU beside the bare AgentService's ({NUM}) ms$",
        "the store's writes in each CPU window": rf"^  store writes in that window: ({NUM})/s$",
        "the wait for a quiet store after the drain": rf"^  the store went quiet ({NUM}) s after the Jobs were "
                                                      rf"Succeeded, ({NUM}) writes later \(writes/s every 5 s: ",
        "assignment latency": rf"^create → assignment at its agent p50 / p99\s+({NUM}) ms / ({NUM}) ms\s+target p99 ≤ 1 s "
                              rf"(?:ok|MISSED)\s+max ({NUM}) ms$",
        "its anchor": rf"^create → assignment, one Job at a time on the idle fleet \(anchor\) p50 / p99\s+({NUM}) ms / "
                      rf"({NUM}) ms over 3 Jobs$",
        "reconnect storm": rf"^reconnect storm: every agent re-synchronised\s+({NUM}) s after the restart\s+target ≤ 30 s "
                           rf"(?:ok|MISSED)\s+coordinator spawn → serving ({NUM}) s, serving → all re-synchronised "
                           rf"({NUM}) s$",
        "summary row": rf"^3\s+({NUM}) / ({NUM}) %\s+({NUM}) %\s+({NUM}) / ({NUM}) ms\s+({NUM}) s$",
    })
    # Every attempt of the burst reached an agent, ended there, was acknowledged, and its Job succeeded.
    assert re.search(r"^placed and finished\s+12 of 12 Jobs' assignments reached an agent \(0 more attempts: "
                     rf"replacements\), 12 attempts ended and acknowledged in {NUM} s .*: 12 Succeeded$", report,
                     re.MULTILINE), report
    assert re.search(r"^  created 12 Jobs in .*, 0 errors$", report, re.MULTILINE), report
    # After the restart every agent re-synchronised and its long attempt still runs there.
    assert re.search(r"^  3 of 3 re-synchronised; 3 of 3 long attempts still running on their agents", report,
                     re.MULTILINE), report
