#!/usr/bin/env python3
"""Placement pass cost with and without a price book: the pure scheduler, no daemons.

    .venv/bin/python bench/placement.py [--nodes 1000] [--attempts 50] [--passes 10]

One pass is `scheduler.place_all` of N waiting one-GPU attempts over M one-GPU nodes, sold round-robin
as the six x1 offerings of examples/pricebook.yaml's shape (on-demand, interruptible, fast), as the
placement controller runs it. Figures, each beside the anchor measured in the same run:
  1  a pass priced (the active book: policy filters, Balanced outlooks, explanations naming losers),
     beside the same pass without a book (what every coordinator did before issue 12, part 2)
  2  what pricing adds per node per attempt, in microseconds
A benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import record
from nodus.coordinator.money.pricebook import PriceBook, parse
from nodus.coordinator.scheduler import PROCESS, Amount, Gpu, NodeView, Request, place_all

GI = 1 << 30


def book() -> PriceBook:
    def offering(oid: str, family: str, rate: str, speed: str, spot: str = "") -> dict[str, Any]:
        o: dict[str, Any] = {
            "id": oid, "accelerator": {"id": f"nvidia-{family.lower()}-sxm-80g", "family": family, "gpusPerNode": 1,
                                       "memory": "80Gi"},
            "vcpu": 8, "memory": "32Gi", "regionClass": "us", "provider": "lab", "region": "us-1",
            "rateUSDPerHour": rate, "billingIncrement": "60s", "minimumCharge": "1m", "relativeSpeed": speed}
        if spot:
            o.update(interruptible=True, interruptionsPerHour=spot)
        return o
    return parse({"pricebookVersion": "bench", "storageUSDPerGiBMonth": "0.08", "offerings": [
        offering("a100-x1-spot", "A100", "1.10", "0.45", "0.05"), offering("a100-x1", "A100", "2.20", "0.45"),
        offering("h100-x1", "H100", "2.99", "1"), offering("h100-x1-spot", "H100", "1.80", "1", "0.1"),
        offering("l4-x1", "L4", "0.85", "0.12"), offering("b200-x1", "B200", "6.50", "2.2")]})


def fleet(size: int, priced: PriceBook) -> list[NodeView]:
    out = []
    for i in range(size):
        o = priced.offerings[i % len(priced.offerings)]
        assert o.accelerator is not None
        out.append(NodeView(f"n{i:05d}", True, False, frozenset({PROCESS}), Amount(8000, 32 * GI, 100 * GI, 1),
                            (Gpu(0, o.accelerator.family, 80 * GI),), {}, "us", o.id))
    return out


def timed(requests: list[tuple[int, Request]], nodes: list[NodeView], priced: PriceBook | None,
          passes: int) -> float:
    """The median of `passes` passes, in milliseconds."""
    samples = []
    for _ in range(passes):
        t = time.perf_counter()
        place_all(requests, nodes, [], book=priced)
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--attempts", type=int, default=50)
    ap.add_argument("--passes", type=int, default=10)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"nodes": 60, "attempts": 5, "passes": 2})
    priced = book()
    nodes = fleet(args.nodes, priced)
    requests = [(i, Request.of({"gpu": {"count": 1}}, None, {"interruptible": "Allow"}, "2h"))
                for i in range(args.attempts)]
    with record.Report("placement", args):
        plain = timed(requests, nodes, None, args.passes)
        with_book = timed(requests, nodes, priced, args.passes)
        extra_us = (with_book - plain) * 1000 / (args.nodes * args.attempts)
        print(f"placement pass: {args.attempts} one-GPU attempts over {args.nodes} nodes, median of {args.passes}")
        print(f"priced pass ms      {with_book:10.1f}    without a book    {plain:10.1f} ms")
        print(f"pricing adds        {extra_us:10.2f} µs per node per attempt")


if __name__ == "__main__":
    main()
