"""The gang mesh probe: `python -m nodus.agent.probe < plan.json`, one per member, on every member's host.

Before a multi-node gang starts its program, every member measures the network it will run on: the
TCP round trip to every other member (an echo server here, 1-byte pings there, the median) and the
gang's all-reduce bus bandwidth with torch.distributed, for sizes from 8 B doubling up to `max_bytes`
(nccl-tests' definitions: algbw = bytes / time, busbw = algbw × 2(n−1)/n). The agent reads the last
line of stdout, one JSON object (`Report.to_json`).

The whole probe is bounded by `budget_s`: each phase has a deadline (a fraction of the budget), and a
watchdog prints what was measured so far, with an error, and exits when the budget is spent, whatever
hangs. The exit status is 0 whenever a report is printed (a missing torch, an absent peer or a failed
all-reduce are reported in `error`), and 2 only for a malformed plan, the field named on stderr.

Its parts: `plan` (the plan, the budget, the report), `rtt` (the echo server and the pings),
`allreduce` (the bus-bandwidth sweep); this module runs them in order under the watchdog.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

from .allreduce import TARGET_S, describe, measure_allreduce, plain_allreduce_busbw
from .plan import (ECHO_END, RTT_END, WATCHDOG, Budget, Peer, Plan, PlanError, Report, bus_factor, classify_path,
                   message_sizes, parse_plan)
from .rtt import EchoServer, measure_rtt, open_listener

# What tests and the bench import from `nodus.agent.probe` (run_probe looks measure_allreduce up here).
__all__ = ["TARGET_S", "Budget", "EchoServer", "Peer", "Plan", "PlanError", "Report", "bus_factor", "classify_path",
           "main", "measure_allreduce", "message_sizes", "parse_plan", "plain_allreduce_busbw", "run_probe"]

log = logging.getLogger("nodus.agent.probe")


def run_probe(plan: Plan, report: Report, budget: Budget) -> None:
    """RTT to every peer, then the all-reduce sweep, then keep echoing until every peer is done pinging."""
    report.phase = "listen"
    try:
        server: EchoServer | None = EchoServer(open_listener(plan)).start()
    except OSError as e:
        report.fail(f"echo server: cannot listen on {plan.me.address}:{plan.me.probe_port} ({e})")
        server = None
    try:
        report.phase = "rtt"
        measure_rtt(plan, report, budget.deadline(RTT_END), budget.clock)
        if server is not None and plan.allreduce and plan.size > 1:
            # A peer's pings are answered by this process's echo thread, which shares the GIL (and
            # the core) with what comes next here: torch's import, the rendezvous. A peer still
            # pinging then times this process, not the network (40 µs read as 60-80 µs, once as
            # 1.2 ms, in the multi-host tests). So no member moves on before its peers are done.
            report.phase = "rtt (waiting for peers to finish pinging)"
            server.wait_finished({p.rank for p in plan.others}, budget.left(RTT_END))
        if plan.allreduce and plan.size > 1:
            try:
                measure_allreduce(plan, report, budget)
            except Exception as e:  # noqa: BLE001 - any failure of torch.distributed is a report, not a crash
                report.fail(describe(e, report.phase))
        if server is not None:
            # A completed rendezvous means every peer has pinged already; otherwise this waits for them.
            report.phase = "echo"
            missing = server.wait_finished({p.rank for p in plan.others}, budget.left(ECHO_END))
            if missing:
                report.fail(f"echo: rank(s) {sorted(missing)} did not finish pinging this member")
    finally:
        if server is not None:
            server.close()


def _watchdog(report: Report, budget: Budget) -> None:
    def fire() -> None:
        report.fail(f"the {report.plan.budget_s:g}s budget ran out during {report.phase}")
        if report.print_once(sys.stdout):
            sys.stderr.flush()
            os._exit(0)

    timer = threading.Timer(budget.left(WATCHDOG), fire)
    timer.daemon = True
    timer.start()


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="probe %(levelname)s %(message)s")
    start = time.monotonic()
    try:
        plan = parse_plan(json.loads(sys.stdin.read()))
    except json.JSONDecodeError as e:
        print(f"probe: bad plan: plan: not JSON ({e})", file=sys.stderr)
        return 2
    except PlanError as e:
        print(f"probe: bad plan: {e}", file=sys.stderr)
        return 2
    report = Report(plan)
    budget = Budget(start, plan.budget_s)
    _watchdog(report, budget)
    try:
        run_probe(plan, report, budget)
    except Exception as e:  # noqa: BLE001 - the agent gets a report whatever broke
        log.exception("probe failed")
        report.fail(f"probe ({report.phase}): {type(e).__name__}: {e}")
    report.print_once(sys.stdout)
    return 0
