"""The probe's all-reduce half: torch.distributed over rank 0's TCPStore, doubling sizes while time lasts.

Every rank must issue the same sequence of collectives, so each decision that shapes it (iterations
per size, whether to try the next size) is a pure function of values every rank agrees on through a
MAX all-reduce: no rank waits in a collective that a peer decided to skip.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import time
from datetime import timedelta
from typing import Any, Callable

from .plan import INIT_END, SIZES_END, Budget, Plan, Report, SizeResult, bus_factor, message_sizes

log = logging.getLogger("nodus.agent.probe")

WARMUP_ITERS = 2
CALIBRATION_ITERS = 2   # timed to choose the iteration count; one alone is too noisy
MIN_ITERS = 2
MAX_ITERS = 10_000
TARGET_S = 0.2      # timed window of the largest size (the bandwidth the probe reports), shrunk when the budget cannot afford it
STEP_TARGET_S = 0.02
"""Timed window of every smaller size: the sweep's curve, not its headline. At 0.2 s for each of 22 sizes
the sweep alone took 4.4 s of a gang's start (issue 17's 3 s target for a probed 2-node gang)."""
DTYPE_BYTES = 4     # float32 elements


def _interface_of(address: str) -> str | None:
    """The local interface that holds `address`, so gloo and NCCL bind where the peers can reach them."""
    try:
        import psutil
        ips = {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(address, None)}
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address.split("%")[0] in ips for a in addrs):
                return str(name)
    except (ImportError, OSError, UnicodeError):
        pass
    return None


def _timed_loop(dist: Any, sync: Callable[[], None], tensor: Any, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    return time.perf_counter() - t


def measure_allreduce(plan: Plan, report: Report, budget: Budget) -> None:
    """Rendezvous through rank 0's TCPStore, then time all-reduces of doubling sizes while time lasts."""
    report.phase = "all-reduce setup"
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        report.fail(f"all-reduce skipped: torch is not importable ({e})")
        return
    if not dist.is_available():
        report.fail("all-reduce skipped: this torch has no torch.distributed")
        return
    iface = _interface_of(plan.me.address)
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    report.phase = "all-reduce rendezvous"
    store = dist.TCPStore(plan.store_address, plan.store_port, plan.size, plan.rank == 0,
                          timeout=timedelta(seconds=max(1.0, budget.left(INIT_END))), wait_for_workers=True)
    # Later store reads (the process group's own rendezvous, the done count) may take the whole budget.
    store.set_timeout(timedelta(seconds=budget.left(1.0) + 10))
    local_nccl = bool(torch.cuda.is_available() and dist.is_nccl_available())
    store.set(f"nodus-probe/nccl/{plan.rank}", "1" if local_nccl else "0")
    lacking = [r for r in range(plan.size) if store.get(f"nodus-probe/nccl/{r}") != b"1"]
    if plan.backend == "nccl" and lacking:
        raise RuntimeError(f"nccl requested but rank(s) {lacking} have no CUDA device or NCCL")
    backend = "nccl" if plan.backend == "nccl" or (plan.backend == "auto" and not lacking) else "gloo"
    report.backend = backend
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
    # Past the budget the watchdog reports and exits; the collective timeout only backs it up.
    dist.init_process_group(backend, store=store, rank=plan.rank, world_size=plan.size,
                            timeout=timedelta(seconds=budget.left(1.0) + 10),
                            device_id=device if backend == "nccl" else None)
    report.phase = "all-reduce sizes"
    try:
        _sweep(plan, report, budget, torch, dist, sync, device)
    except Exception as e:  # noqa: BLE001 - reported before a teardown that a lost peer could stall
        report.fail(describe(e, report.phase))
        dist.destroy_process_group()
        return
    report.phase = "all-reduce teardown"
    # Rank 0 hosts the store: it stays until every rank is done with it.
    store.add("nodus-probe/done", 1)
    if plan.rank == 0:
        end = time.monotonic() + min(2.0, budget.left(1.0))
        while store.add("nodus-probe/done", 0) < plan.size and time.monotonic() < end:
            time.sleep(0.01)
    dist.destroy_process_group()


def describe(e: BaseException, phase: str) -> str:
    return f"all-reduce ({phase}): {type(e).__name__}: {str(e).strip()[:300]}"


def _sweep(plan: Plan, report: Report, budget: Budget, torch: Any, dist: Any, sync: Callable[[], None],
           device: Any) -> None:
    def agree(*values: float) -> list[float]:
        """The maximum over ranks of each value: identical on every rank, so decisions stay in step."""
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    sizes = message_sizes(plan.max_bytes)
    stop_at = budget.total * SIZES_END
    (elapsed,) = agree(budget.elapsed())
    # What the budget affords, spread over the sizes as the windows are: one large one, the rest small.
    scale = min(1.0, 0.5 * (stop_at - elapsed) / (TARGET_S + STEP_TARGET_S * (len(sizes) - 1)))
    per_iter = 0.0   # of the previous size
    for nbytes in sizes:
        target = max(0.005, scale * (TARGET_S if nbytes == sizes[-1] else STEP_TARGET_S))
        predicted = (WARMUP_ITERS + CALIBRATION_ITERS + MIN_ITERS) * 2 * per_iter + target + 0.05
        if elapsed + predicted > stop_at:
            if not report.sizes:
                report.fail(f"all-reduce: no time left in the {plan.budget_s:g}s budget")
            log.info("rank %d: stopping before %d B (%.2fs elapsed)", plan.rank, nbytes, elapsed)
            return
        tensor = torch.zeros(nbytes // DTYPE_BYTES, dtype=torch.float32, device=device)
        _timed_loop(dist, sync, tensor, WARMUP_ITERS)
        agree(0.0)   # barrier: every rank starts the calibration together
        calibration, _ = agree(_timed_loop(dist, sync, tensor, CALIBRATION_ITERS), 0.0)
        iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(target * CALIBRATION_ITERS / max(calibration, 1e-9))))
        agree(0.0)
        seconds, elapsed = agree(_timed_loop(dist, sync, tensor, iters), budget.elapsed())
        per_iter = seconds / iters
        algbw = nbytes * 8 / per_iter / 1e9
        report.add_size(SizeResult(nbytes, per_iter, algbw, algbw * bus_factor(plan.size), iters))


def plain_allreduce_busbw(rank: int, size: int, store_address: str, store_port: int, nbytes: int, iters: int,
                          backend: str = "gloo", timeout_s: float = 60.0) -> float:
    """busbw (Gbit/s) of a plain loop: two warm-ups, a barrier, `iters` all-reduces of `nbytes` timed on
    this rank. The yardstick the probe is compared against; it shares none of the probe's machinery."""
    import torch
    import torch.distributed as dist
    store = dist.TCPStore(store_address, store_port, size, rank == 0,
                          timeout=timedelta(seconds=timeout_s))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s), device_id=device if backend == "nccl" else None)
    try:
        x = torch.zeros(nbytes // DTYPE_BYTES, dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - t) / iters
        dist.barrier()   # nobody leaves (rank 0 takes the store with it) while a peer still times
    finally:
        dist.destroy_process_group()
    return nbytes * 8 / seconds / 1e9 * bus_factor(size)
