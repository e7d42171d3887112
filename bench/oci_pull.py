"""Image pulls: a cold pull through the agent's ImageStore beside `skopeo copy` of the same image from the
same registry, measured in the same run. "Fetched and verified" is when the pull's progress reaches its
total (every blob on disk and checked; issue 11's target: skopeo copy / that >= 1.0); "unpacked" is
when the rootfs is ready, beside skopeo copy plus `umoci raw unpack` of the image run alone. A warm
pull is a cache hit. The store fetches blobs itself (ADR 0092); the same pull through skopeo, as every
pull went before it (`ImageStore(direct=False)`, still the path for what the agent defers), is timed
in the same runs.

It starts a real docker-registry on loopback, builds an image of --megabytes incompressible data over
--layers layers plus busybox (tests/registry.py), pushes it, and pulls it --runs times into a fresh
cache each time. Run from the repository root: `.venv/bin/python bench/oci_pull.py [--megabytes 100]`.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from record import Report, add_flags, shrink  # noqa: E402
from registry import build_sized_layout, push, serve_registry  # noqa: E402

from nodus.agent.clock import SystemClock  # noqa: E402
from nodus.agent.oci.images import ImageStore, PullProgress  # noqa: E402
from nodus.agent.oci.skopeo import Skopeo  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--megabytes", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    add_flags(ap)
    args = shrink(ap.parse_args(), {"megabytes": 4, "layers": 2, "runs": 2})
    work = Path(tempfile.mkdtemp(prefix="nodus-bench-oci-"))
    try:
        layout = build_sized_layout(work / "image", args.megabytes, layers=args.layers)
        with serve_registry(work / "registry") as registry:
            digest = push(layout, registry, "bench/image", "v1")
            ref = f"{registry.host}/bench/image@{digest}"
            skopeo = Skopeo(insecure=frozenset({registry.host}))
            pulls: list[float] = []
            fetches: list[float] = []
            through: list[float] = []
            copies: list[float] = []
            unpacks: list[float] = []
            warm: list[float] = []
            for run in range(args.runs):
                cache = work / f"cache{run}"
                store = ImageStore(cache, 1 << 40, SystemClock(), lambda: (), skopeo)
                old = ImageStore(work / f"old{run}", 1 << 40, SystemClock(), lambda: (), skopeo, direct=False)
                copy = ["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                        f"docker://{ref}", f"oci:{work / f'copy{run}'}:image"]

                def pull(into: ImageStore, fetch_times: list[float], pull_times: list[float] | None) -> None:
                    start = time.perf_counter()
                    fetched: list[float] = []

                    def progress(p: PullProgress) -> None:
                        if p.done == p.total and not fetched:
                            fetched.append((time.perf_counter() - start) * 1000)
                    into.pull(ref, progress=progress)
                    if pull_times is not None:
                        pull_times.append((time.perf_counter() - start) * 1000)
                    fetch_times.append(fetched[0])

                steps = [lambda: pull(store, fetches, pulls),
                         lambda: copies.append(timed(lambda: subprocess.run(copy, check=True))),
                         lambda: pull(old, through, None)]
                # rotate which goes first, so none always meets a warmer page cache
                for step in steps[run % 3:] + steps[:run % 3]:
                    step()
                warm.append(timed(lambda: store.pull(ref)))
                unpacks.append(timed(lambda: subprocess.run(
                    ["umoci", "raw", "unpack", "--image", f"{layout}:latest", str(work / f"unpack{run}")],
                    check=True, capture_output=True)))
                shutil.rmtree(cache)
                shutil.rmtree(work / f"old{run}")
                for path in (work / f"copy{run}", work / f"unpack{run}"):
                    shutil.rmtree(path, ignore_errors=True)
        fetch, pulled = statistics.median(fetches), statistics.median(pulls)
        copied, unpack = statistics.median(copies), statistics.median(unpacks)
        with Report("oci_pull", args):
            print(f"image: {args.megabytes} MB of incompressible data in {args.layers} layers plus busybox, "
                  f"{args.runs} runs, medians")
            print(f"cold pull, fetched and verified  {fetch:,.0f} ms    skopeo copy (same registry)  {copied:,.0f} ms"
                  f"    ratio {copied / fetch:.2f}    target ≥ 1.0")
            print(f"  the same pull through skopeo (before ADR 0092)  {statistics.median(through):,.0f} ms"
                  f"    ratio {copied / statistics.median(through):.2f}")
            print(f"cold pull, unpacked  {pulled:,.0f} ms    skopeo copy + umoci raw unpack of it alone  "
                  f"{copied + unpack:,.0f} ms    ratio {(copied + unpack) / pulled:.2f}")
            print(f"warm pull (cache hit)  {statistics.median(warm):,.1f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
