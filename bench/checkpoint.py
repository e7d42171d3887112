#!/usr/bin/env python3
"""Checkpoint benchmark: `nodus checkpoint` against `tar | zstd -T0 -3` on the same data, in one run.

    .venv/bin/python bench/checkpoint.py [--size-mb 1024] [--runs 3] [--level 3] [--keep DIR]

Data (generated once in a temp dir, seeded): ~30 % random bytes, ~35 % compressible binary
(16-symbol alphabet), ~25 % English-like text, and 2,000 small files (~10 %) of all three kinds.

Figures, each the median of --runs, page cache warm for both sides, os.sync() before each step,
the two sides alternating who goes first:
  save     nodus: LocalStore.save (in-process library: tar, zstd with threads=-1, sha256, fsync,
           manifest committed last)  vs  `tar -cf - DIR | zstd -T0 -3 -o FILE` then fsync(FILE)
  restore  nodus: LocalStore.restore (sha256 verified in a first pass, then extract)  vs
           `zstd -d -c FILE | tar -xf - -C DIR`
  MB/s are of the unpacked data; ratio = nodus MB/s / anchor MB/s (target ≥ 1.0 both ways);
  cpu-s = CPU seconds spent (all threads; the anchor's processes), which other load on the
  machine does not move, printed beside wall-clock MB/s, which it does;
  compression ratio = unpacked / archive bytes.
  freeze pause: the agent's hold of a running program for a checkpoint (agent/checkpointing.py
           `copy_held` with the cgroup freezer: freeze, the parallel in-process copy of the state
           into staging (checkpoint.localcopy), thaw) of a process that keeps writing into the data
           set, beside a plain `cp -a` subprocess of the same directory; one untimed round of both
           first, then the median of --runs; target: the pause no longer than the copy (ratio ≤ 1.0).
           Needs root and a cgroup freezer (v1 `freezer` or v2 `cgroup.freeze`); without one the
           bench says so and prints the copy time only.

A benchmark, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from nodus.agent.cgroups import Cgroup
from nodus.agent.checkpointing import Hold, copy_held
from nodus.agent.layout import AttemptLayout
from nodus.checkpoint import LocalStore

import record

MiB = 1 << 20
SMALL_FILES = 2000


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _compressible(rng: random.Random, n: int) -> bytes:
    table = bytes(rng.choice(b"\x00\x01\x02\x03\x10\x20\x40\x7f\x80\xaa\xbb\xcc\xdd\xee\xf0\xff") for _ in range(256))
    return rng.randbytes(n).translate(table)


def _text(rng: random.Random, n: int, vocab: list[str]) -> bytes:
    words: list[str] = []
    size = 0
    while size < n:
        line = " ".join(rng.choices(vocab, k=12)) + ".\n"
        words.append(line)
        size += len(line)
    return "".join(words).encode()[:n]


def generate(root: Path, size_mb: int, seed: int = 7) -> int:
    """Write the mixed data set under root/data; returns its size in bytes."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("etaoinshrdlucmfwypvbgkjqxz", k=rng.randint(2, 10))) for _ in range(5000)]
    total = size_mb * MiB
    data = root / "data"
    for sub in ("random", "compressible", "text", "small"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    text_block = _text(rng, 16 * MiB, vocab)  # rotated per file: text-like, no long-range repeats at level 3
    written = 0

    def big(kind: str, share: float, file_mb: int) -> None:
        nonlocal written
        budget = int(total * share)
        i = 0
        while budget > 0:
            n = min(budget, file_mb * MiB)
            if kind == "random":
                blob = rng.randbytes(n)
            elif kind == "compressible":
                blob = _compressible(rng, n)
            else:
                blob = b"".join(text_block[(k * 7919 + i * 104729) % len(text_block):][: 4 * MiB]
                                for k in range(-(-n // (4 * MiB))))
                blob = blob[:n]
            (data / kind / f"{kind}-{i:03d}.bin").write_bytes(blob)
            written += n
            budget -= n
            i += 1

    big("random", 0.30, 64)
    big("compressible", 0.35, 64)
    big("text", 0.25, 32)
    small_each = max(1, int(total * 0.10) // SMALL_FILES)
    for i in range(SMALL_FILES):
        n = max(1, int(small_each * rng.uniform(0.2, 1.8)))
        kind = i % 3
        blob = rng.randbytes(n) if kind == 0 else _compressible(rng, n) if kind == 1 else \
            text_block[(i * 4099) % (len(text_block) - n):][:n]
        d = data / "small" / f"d{i // 100:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i:04d}.dat").write_bytes(blob)
        written += n
    return written


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu() -> float:
    """CPU seconds of this process (all its threads) and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall seconds, CPU seconds) of one step."""
    os.sync()  # nobody pays for the previous step's dirty pages (an ext4 fsync commits the whole journal)
    c, t = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t, _cpu() - c


WRITER = """
import os, sys, time
path = os.path.join(sys.argv[1], "live")
print("ready", flush=True)
n = 0
while True:  # a program whose state changes all the time
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.001)
"""


def freeze_pause(work: Path, runs: int) -> tuple[list[float] | None, list[float], str]:
    """(freeze pauses or None, plain `cp -a` seconds, why there is no pause) of the same data dir.

    Round 0 is not timed: it warms both sides (the source's page cache, the agent's imports and
    threads) so the first timed round favours neither."""
    data = work / "data"
    copies: list[float] = []
    pauses: list[float] = []
    why = ""
    cg = Cgroup.create("nodus-bench", f"ckpt-{os.getpid()}") if os.geteuid() == 0 else None
    if cg is None:
        why = "not root: no cgroup to freeze"
    elif not ("freezer" in cg.paths or "unified" in cg.paths):
        why = "no cgroup freezer here (" + ("; ".join(cg.missing) or "v1 freezer not mounted") + ")"
    proc = None
    try:
        if not why:
            assert cg is not None
            proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE,
                                    start_new_session=True, preexec_fn=cg.attach)
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        layout = AttemptLayout(work / "attempt")
        for run in range(runs + 1):
            staging, plain = layout.run / f"checkpoint-{run}.d", work / "plain-copy"
            for d in (staging, plain):
                shutil.rmtree(d, ignore_errors=True)
            staging.mkdir(parents=True)

            def held() -> None:
                nonlocal why
                assert cg is not None and proc is not None
                hold = Hold(layout, run + 1, opted_in=False, main_pid=proc.pid, cgroup=cg)
                pause = copy_held(layout, [str(data)], staging, hold)[1]
                if hold.method != "freeze":
                    why = f"the cgroup could not be frozen (the agent would hold the program by {hold.method})"
                elif run:
                    pauses.append(pause)

            def cp() -> None:
                r = subprocess.run(["cp", "-a", str(data), str(plain)], capture_output=True, text=True)
                # the writer is not frozen for this copy: `live.tmp` may vanish between cp's listing and its copy
                if r.returncode and any("No such file" not in line for line in r.stderr.splitlines()):
                    raise RuntimeError(f"cp -a failed: {r.stderr.strip()}")

            steps = [cp] if why else [held, cp]
            if run % 2:
                steps.reverse()
            for step in steps:
                wall, _ = _timed(step)
                if step is cp and run:
                    copies.append(wall)
            for d in (staging, plain):
                shutil.rmtree(d, ignore_errors=True)
            if run:
                log(f"freeze run {run}: " + (f"pause {pauses[-1]:.3f}s, " if pauses and not why else "")
                    + f"cp -a {copies[-1]:.3f}s")
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if cg is not None:
            cg.kill_all()
            cg.remove()
        shutil.rmtree(work / "attempt", ignore_errors=True)
        for leftover in ("live", "live.tmp"):
            (data / leftover).unlink(missing_ok=True)
    return (None if why else pauses), copies, why


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--keep", help="generate (or reuse) the data here instead of a temp dir")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"size_mb": 16, "runs": 1})

    zstd = shutil.which("zstd")
    tar = shutil.which("tar")
    if not zstd or not tar:
        print("zstd (and tar) are needed for the anchor: apt-get install -y zstd tar", file=sys.stderr)
        return 2
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nodus-bench-ckpt-"))
    try:
        if not (work / "data").exists():
            log(f"generating {args.size_mb} MiB of mixed data in {work}")
            size = generate(work, args.size_mb)
        else:
            size = sum(p.stat().st_size for p in (work / "data").rglob("*") if p.is_file())
        files = sum(1 for p in (work / "data").rglob("*") if p.is_file())
        log(f"{size / MiB:.0f} MiB in {files} files; {os.cpu_count()} CPUs; zstd level {args.level}")

        store = LocalStore(work / "store")
        anchor = work / "anchor.tar.zst"
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in ("nodus save", "tar|zstd save",
                                                                         "nodus restore", "zstd|tar restore")}
        load_before = os.getloadavg()[0]
        archive_sizes: dict[str, int] = {}
        for run in range(args.runs):
            for d in ("out-nodus", "out-anchor"):
                shutil.rmtree(work / d, ignore_errors=True)
            for m in store.list():
                store.delete(m.seq)
            anchor.unlink(missing_ok=True)

            def nodus_save() -> None:
                m = store.save(["data"], root=work, level=args.level)
                archive_sizes["nodus"] = m.size

            def anchor_save() -> None:
                subprocess.run(f"'{tar}' -cf - data | '{zstd}' -q -T0 -{args.level} -o '{anchor}'", shell=True,
                               cwd=work, check=True)
                _fsync(anchor)
                archive_sizes["anchor"] = anchor.stat().st_size

            def nodus_restore() -> None:
                store.restore(work / "out-nodus")

            def anchor_restore() -> None:
                (work / "out-anchor").mkdir()
                subprocess.run(f"'{zstd}' -q -d -c '{anchor}' | '{tar}' -xf - -C '{work / 'out-anchor'}'", shell=True,
                               check=True)

            order = [("nodus save", nodus_save), ("tar|zstd save", anchor_save)]
            order2 = [("nodus restore", nodus_restore), ("zstd|tar restore", anchor_restore)]
            if run % 2:  # alternate who goes first, so neither always gets the warmer cache
                order.reverse()
                order2.reverse()
            for name, fn in order + order2:
                results[name].append(_timed(fn))
            log(f"run {run + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f}s ({v[-1][1]:.2f} cpu-s)"
                                               for k, v in results.items()) + f"; load {os.getloadavg()[0]:.1f}")

        out = subprocess.run(["diff", "-r", str(work / "data"), str(work / "out-nodus" / "data")],
                             capture_output=True, text=True)
        same = "identical" if out.returncode == 0 else f"DIFFERENT: {out.stdout[:200]}"

        mb = size / 1e6

        def rate(name: str) -> float:
            return mb / statistics.median(w for w, _ in results[name])

        def cpu(name: str) -> float:
            return statistics.median(c for _, c in results[name])

        with record.Report("checkpoint", args):
            print()
            print(f"checkpoint benchmark: {size / MiB:.0f} MiB, {files} files, zstd -{args.level}, {os.cpu_count()} CPUs, "
                  f"median of {args.runs}; load average {load_before:.1f} → {os.getloadavg()[0]:.1f} (other work on the "
                  "machine slows both sides; cpu-s is immune to it)")
            print(f"{'':8s} {'nodus MB/s':>10s} {'anchor MB/s':>11s} {'ratio':>6s} {'target':>7s}   "
                  f"{'nodus cpu-s':>11s} {'anchor cpu-s':>12s} {'ratio':>6s}   anchor")
            for label, ours, theirs, what in (
                    ("save", "nodus save", "tar|zstd save", "tar -cf - | zstd -T0 -3, fsync"),
                    ("restore", "nodus restore", "zstd|tar restore", "zstd -d | tar -x")):
                print(f"{label:8s} {rate(ours):10.0f} {rate(theirs):11.0f} {rate(ours) / rate(theirs):6.2f} {'≥ 1.0':>7s}   "
                      f"{cpu(ours):11.2f} {cpu(theirs):12.2f} {cpu(theirs) / cpu(ours):6.2f}   {what}")
            print("(MB = 10^6 bytes of unpacked data; ratio = nodus ÷ anchor for MB/s, anchor ÷ nodus for cpu-s: "
                  "above 1 is nodus ahead)")
            print(f"compression ratio: nodus {size / archive_sizes['nodus']:.2f}, "
                  f"anchor {size / archive_sizes['anchor']:.2f} (unpacked / archive)")
            print(f"restored tree vs source: {same}")

            log("freeze pause: the agent's hold of a running program beside a plain cp -a of the same data")
            pauses, copies, why = freeze_pause(work, args.runs)
            copy = statistics.median(copies)
            if pauses is None:
                print(f"freeze pause: n/a, {why}; plain cp -a of the state {copy:.3f}s")
            else:
                pause = statistics.median(pauses)
                print(f"freeze pause: {pause:.3f}s (agent: freeze, parallel in-process copy, thaw) "
                      f"vs plain cp -a {copy:.3f}s; ratio {pause / copy:.2f} (pause ÷ copy, target ≤ 1.0)")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
