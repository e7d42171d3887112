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
import socket
import stat
import sys
import threading
import time

from .allreduce import TARGET_S, describe, measure_allreduce, plain_allreduce_busbw
from .plan import (ECHO_END, RTT_END, WATCHDOG, Budget, Peer, Plan, PlanError, Report, bus_factor, classify_path,
                   message_sizes, parse_plan)
from .rtt import EchoServer, measure_rtt, open_listener

# What tests and the bench import from `nodus.agent.probe` (run_probe looks measure_allreduce up here).
__all__ = ["TARGET_S", "Budget", "EchoServer", "Peer", "Plan", "PlanError", "Report", "bus_factor", "classify_path",
           "main", "measure_allreduce", "message_sizes", "parse_plan", "plain_allreduce_busbw", "preload", "run_probe"]

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


def preload() -> None:
    """Imports torch.distributed before the plan arrives: the agent starts the probe when it accepts a
    member and hands it the plan once the gang has assembled, so the import (seconds on a busy host)
    overlaps the assembly instead of delaying the gang's start. A torch that fails to import is
    reported by the all-reduce, which imports it again."""
    try:
        import psutil  # noqa: F401  (the all-reduce finds the interface with it)
        import torch.distributed  # noqa: F401
    except Exception:  # noqa: BLE001 - reported later, with the plan's report
        pass


def read_request() -> tuple[str, int | None]:
    """The plan, and the listening socket the agent reserved for this member's echo server when stdin is
    the agent's Unix socket (it passes the socket with SCM_RIGHTS; `probe_process`); from a pipe, the
    plan alone (its `listen_fd`, if any, names an inherited descriptor)."""
    if not stat.S_ISSOCK(os.fstat(0).st_mode):
        return sys.stdin.read(), None
    channel = socket.socket(fileno=os.dup(0))
    try:
        data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 1)
        chunks = [data]
        while data and (chunk := channel.recv(1 << 16)):
            chunks.append(chunk)
    finally:
        channel.close()
    return b"".join(chunks).decode(), (fds[0] if fds else None)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="probe %(levelname)s %(message)s")
    if "--preload" in (sys.argv[1:] if argv is None else argv):
        preload()
    try:
        text, listen_fd = read_request()
        start = time.monotonic()  # the budget counts from the plan, not from a preloaded process's start
        if not text.strip():
            print("probe: no plan was given (the agent went away)", file=sys.stderr)
            return 2
        raw = json.loads(text)
        if listen_fd is not None and isinstance(raw, dict):
            raw["listen_fd"] = listen_fd
        plan = parse_plan(raw)
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
