#!/usr/bin/env python3
"""Checkpoint benchmark: `nodus checkpoint save|restore` against `tar | zstd` as a user types both.

    .venv/bin/python bench/checkpoint.py [--sizes-mb 360,1024] [--runs 5] [--level 3] [--keep DIR] [--fs ext4|here]

Command line against command line, same data, same run, each step a fresh process (or pipeline):
  save     `nodus checkpoint save data --out F.tar.zst` (tar, zstd frames, sha256, fsync, manifest)
           vs `tar -cf - data | zstd -T0 -3 -o A.tar.zst && sync A.tar.zst` (coreutils' sync FILE: fsync)
  restore  `nodus checkpoint restore F.tar.zst --into DIR` (sha256 verified, staged, renamed)
           vs `zstd -d -T0 -c A.tar.zst | tar -xf - -C DIR`
Data (seeded, generated once): `mixed` at each --sizes-mb (~30 % random bytes like bf16 weights, ~35 %
half-compressible binary like optimizer state, ~25 % text logs, 2,000 small files ~10 %), and `text`
and `random` (all of one kind) at the first size, reported separately.

Each of --runs rounds runs the four steps in an order that alternates (page cache warm for both
sides, os.sync() before each step, outputs removed between steps, and as many bytes as the data set written
and freed just before each step and each floor, so every step takes memory the guest holds: `_prefault` says
why; all untimed). Reported per data set and
step: the median wall seconds of each side, the median of the per-round ratios (anchor ÷ nodus:
above 1 is nodus ahead) with its min-max, the median CPU-seconds of each side (this process's
waited-for children: all their threads), and the floor: what no implementation can go below here —
save: read the state (in-process, 4 MiB reads) + write and fsync a file of our archive's size +
Python's start-up (`python -c pass`); restore: read our archive + write the unpacked bytes (no fsync,
as neither side syncs) + Python's start-up. Targets (issue 17): save ≥ 1.5 and restore ≥ 1.5 on
the mixed data at every size, ≥ 1.0 on the text data.

  freeze pause: the agent's hold of a running program for a checkpoint (agent/checkpointing.py
           `copy_held` with the cgroup freezer: freeze, the parallel in-process copy of the state
           into staging (checkpoint.localcopy), thaw) of a process that keeps writing into the data
           set (the largest mixed one), beside a plain `cp -a` subprocess of the same directory; one
           untimed round of both first, then the median of --runs; target: the pause no longer than
           the copy (ratio ≤ 1.0). Needs root and a cgroup freezer (v1 `freezer` or v2
           `cgroup.freeze`); without one the bench says so and prints the copy time only.

Where: with --fs ext4 (the default as root) every file of the bench lives on a scratch ext4 made with
mkfs.ext4's defaults on a loop device (bench/scratchfs.py says why: this machine's journal-less root ext4
makes any file created soon after large deletions cost ~1 ms of kernel time, for both sides alike); --fs here
runs in the temp dir (or --keep DIR) itself. The report names the filesystem.

A benchmark, not a test: it asserts nothing. Other work on the machine slows both sides alike within
a round; the load average is printed beside the figures.
"""
from __future__ import annotations

import argparse
import contextlib
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

import record
import scratchfs

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


def generate(root: Path, size_mb: int, seed: int = 7, kind: str = "mixed") -> int:
    """Write a data set under root/data (`mixed`, or all `text` or all `random`); returns its size in bytes."""
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

    if kind != "mixed":
        big(kind, 1.0, 64 if kind == "random" else 32)
        return written
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


def _prefault(where: Path, nbytes: int) -> None:
    """Writes `nbytes` into the page cache under `where` and frees them at once (the file is removed before any
    writeback), so the step after it takes pages the guest holds. This VM reports free memory to its host
    (virtio-balloon free page reporting: "Free page reporting enabled" at boot): memory free for ~2 s is given
    back, and the next use of it faults it in from the host, ~3 ms per MiB of new page cache here against ~0.2 ms
    for pages just freed (2026-12-08: a fresh 1 GiB write 2.1-3.1 s, the same write after freeing 1 GiB 0.23 s).
    Which step met given-back memory was chance (and favoured the side that ran second in a round): the 1 GiB
    restore's ratio swung 1.17-2.03 between runs. Bare-metal hosts (and VMs without reporting) give every step
    held pages; so does this."""
    path = where / ".prefault"
    block = bytes(4 * MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, memoryview(block)[:min(left, len(block))])
    finally:
        os.close(fd)
        path.unlink()


def _timed(fn, warm: tuple[Path, int] | None = None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall seconds, CPU seconds) of one step; `warm`: (where, bytes) to `_prefault` just before it."""
    os.sync()  # nobody pays for the previous step's dirty pages (an ext4 fsync commits the whole journal)
    if warm is not None:
        _prefault(*warm)
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


def _floor_save(data: Path, archive_size: int, scratch: Path) -> float:
    """Read every file of the state, then write and fsync `archive_size` bytes: the I/O a save cannot skip."""
    t = time.perf_counter()
    for p in sorted(data.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb", buffering=0) as f:
                while f.read(4 * MiB):
                    pass
    _write(scratch, archive_size, sync=True)
    return time.perf_counter() - t


def _write(path: Path, size: int, *, sync: bool) -> None:
    block = os.urandom(4 * MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, memoryview(block)[:min(left, len(block))])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if not sync:
        path.unlink()


def _floor_restore(archive: Path, unpacked: int, scratch: Path) -> float:
    """Read the archive, then write `unpacked` bytes (no fsync): the I/O a restore cannot skip."""
    t = time.perf_counter()
    with open(archive, "rb", buffering=0) as f:
        while f.read(4 * MiB):
            pass
    _write(scratch, unpacked, sync=False)
    return time.perf_counter() - t


def _python_start() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t


class Side:
    """One side's measurements of one step over the rounds."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self.cpus: list[float] = []

    def add(self, wall_cpu: tuple[float, float]) -> None:
        self.walls.append(wall_cpu[0])
        self.cpus.append(wall_cpu[1])


def bench_set(work: Path, label: str, runs: int, level: int, nodus: str, tar: str, zstd: str) -> dict[str, object]:
    """Run the rounds on work/data; returns what the report prints."""
    data = work / "data"
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    ours, theirs = work / "nodus.tar.zst", work / "anchor.tar.zst"
    steps = {k: Side() for k in ("nodus save", "anchor save", "nodus restore", "anchor restore")}
    floors: dict[str, list[float]] = {"save": [], "restore": []}
    sizes: dict[str, int] = {}
    _python_start()  # untimed: the first spawn of an interpreter reads its files from disk
    starts: list[float] = []

    def clean(*paths: Path) -> None:
        for p in paths:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    def nodus_save() -> None:
        subprocess.run([nodus, "checkpoint", "save", "data", "--out", str(ours), "--level", str(level)], cwd=work,
                       check=True, stdout=subprocess.DEVNULL)
        sizes["nodus"] = ours.stat().st_size

    def anchor_save() -> None:
        subprocess.run(f"'{tar}' -cf - data | '{zstd}' -q -T0 -{level} -o '{theirs}' && sync '{theirs}'", shell=True,
                       cwd=work, check=True)
        sizes["anchor"] = theirs.stat().st_size

    def nodus_restore() -> None:
        subprocess.run([nodus, "checkpoint", "restore", str(ours), "--into", str(work / "out-nodus")], check=True,
                       stdout=subprocess.DEVNULL)

    def anchor_restore() -> None:
        (work / "out-anchor").mkdir()
        subprocess.run(f"'{zstd}' -q -d -T0 -c '{theirs}' | '{tar}' -xf - -C '{work / 'out-anchor'}'", shell=True,
                       check=True)

    same = "not compared"
    for run in range(runs):
        clean(ours, Path(f"{ours}.manifest.json"), theirs, work / "out-nodus", work / "out-anchor")
        saves = [("nodus save", nodus_save), ("anchor save", anchor_save)]
        restores = [("nodus restore", nodus_restore), ("anchor restore", anchor_restore)]
        if run % 2:  # alternate who goes first, so neither always gets the warmer cache
            saves.reverse()
            restores.reverse()
        for name, fn in saves:
            steps[name].add(_timed(fn, (work, size)))
        for name, fn in restores:
            steps[name].add(_timed(fn, (work, size)))
            if name == "nodus restore" and run == runs - 1:
                out = subprocess.run(["diff", "-r", "--no-dereference", str(data), str(work / "out-nodus" / "data")],
                                     capture_output=True, text=True)
                same = "identical" if out.returncode == 0 else f"DIFFERENT: {out.stdout[:200]}"
            clean(work / "out-nodus", work / "out-anchor")
        os.sync()
        _prefault(work, size)
        floors["save"].append(_floor_save(data, sizes["nodus"], work / "floor.bin"))
        clean(work / "floor.bin")
        os.sync()
        _prefault(work, size)
        floors["restore"].append(_floor_restore(ours, size, work / "floor.bin"))
        starts.append(_python_start())
        log(f"{label} round {run + 1}: " + ", ".join(f"{k} {v.walls[-1]:.2f}s ({v.cpus[-1]:.2f} cpu-s)"
                                                     for k, v in steps.items())
            + f"; floor save {floors['save'][-1]:.2f}s restore {floors['restore'][-1]:.2f}s; "
              f"load {os.getloadavg()[0]:.1f}")
    clean(ours, Path(f"{ours}.manifest.json"), theirs)
    return {"size": size, "steps": steps, "floors": floors, "start": statistics.median(starts), "sizes": sizes,
            "same": same}


TARGETS = {"mixed": (1.5, 1.5), "text": (1.0, 1.0), "random": (None, None)}


def report(label: str, kind: str, r: dict[str, object]) -> list[str]:
    steps = r["steps"]
    floors = r["floors"]
    sizes = r["sizes"]
    assert isinstance(steps, dict) and isinstance(floors, dict) and isinstance(sizes, dict)
    start = float(r["start"])  # type: ignore[arg-type]
    lines = []
    for i, step in enumerate(("save", "restore")):
        ours, theirs = steps[f"nodus {step}"], steps[f"anchor {step}"]
        ratios = [a / n for a, n in zip(theirs.walls, ours.walls)]
        target = TARGETS[kind][i]
        verdict = "" if target is None else ("met" if statistics.median(ratios) >= target else "MISSED")
        floor = statistics.median(floors[step]) + start
        lines.append(f"{label:<17s} {step:<8s} {statistics.median(ours.walls):7.2f} {statistics.median(theirs.walls):8.2f} "
                     f"{statistics.median(ratios):6.2f} {min(ratios):5.2f}-{max(ratios):<5.2f} "
                     f"{'≥ ' + format(target, '.1f') if target else '-':>6s} {verdict:>6s} "
                     f"{statistics.median(ours.cpus):7.2f} {statistics.median(theirs.cpus):8.2f} {floor:7.2f}")
    size = int(r["size"])  # type: ignore[call-overload]
    lines.append(f"{'':17s} archive: nodus {sizes['nodus'] / 1e6:.0f} MB, anchor {sizes['anchor'] / 1e6:.0f} MB of "
                 f"{size / 1e6:.0f} MB (compression ratio nodus {size / sizes['nodus']:.2f}, anchor "
                 f"{size / sizes['anchor']:.2f}); restored tree vs source: {r['same']}")
    return lines


def _compile_nodus() -> None:
    """Bytecode for nodus's own sources, as scripts/setup writes it and a wheel installs it: where
    PYTHONDONTWRITEBYTECODE is set (this machine sets it), a module edited (or merged) since setup would be
    compiled again at every `nodus` start, and the bench would time the compiler."""
    import nodus

    subprocess.run([sys.executable, "-m", "compileall", "-q", *nodus.__path__], stdout=subprocess.DEVNULL, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="360,1024", help="sizes of the mixed data sets (the first also for text and random)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--kinds", default="mixed,text,random")
    ap.add_argument("--keep", help="generate (or reuse) the data sets here instead of a temp dir")
    ap.add_argument("--fs", choices=("ext4", "here"), default="ext4",
                    help="ext4: run on a scratch ext4 with mkfs defaults on a loop device (needs root; see "
                         "bench/scratchfs.py); here: in the temp dir or --keep DIR itself")
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"sizes_mb": "16", "runs": 1, "fs": "here"})

    zstd, tar = shutil.which("zstd"), shutil.which("tar")
    if not zstd or not tar:
        print("zstd (and tar) are needed for the anchor: apt-get install -y zstd tar", file=sys.stderr)
        return 2
    nodus = str(Path(sys.executable).parent / "nodus")
    if not os.access(nodus, os.X_OK):
        print(f"{nodus} is missing: run scripts/setup (it installs the nodus command in .venv)", file=sys.stderr)
        return 2
    _compile_nodus()
    sizes = [int(x) for x in args.sizes_mb.split(",") if x]
    kinds = [k for k in args.kinds.split(",") if k]
    sets = [("mixed", mb) for mb in sizes] if "mixed" in kinds else []
    sets += [(k, sizes[0]) for k in kinds if k != "mixed"]
    top = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nodus-bench-ckpt-"))
    why = scratchfs.why_not() if args.fs == "ext4" else ""
    if why:
        print(f"--fs ext4: {why}; use --fs here to run on the filesystem of the temp dir", file=sys.stderr)
        return 2
    try:
        with contextlib.ExitStack() as stack:
            if args.fs == "ext4":
                # the data sets, two archives, two restored trees, the floor's scratch and the pause's copies
                need = (sum(sizes) + (len(sets) - len(sizes)) * sizes[0] + 6 * max(sizes) + 1024) * MiB
                base = stack.enter_context(scratchfs.ScratchExt4(top / "scratch-ext4.img", top / "ext4", need))
            else:
                base = top
            return _run(args, base, sets, nodus, tar, zstd)
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)


def _run(args: argparse.Namespace, base: Path, sets: list[tuple[str, int]], nodus: str, tar: str, zstd: str) -> int:
    load_before = os.getloadavg()[0]
    rows: list[str] = []
    largest_mixed: Path | None = None
    for kind, mb in sets:
        work = base / f"{kind}-{mb}"
        if not (work / "data").exists():
            log(f"generating {mb} MiB of {kind} data in {work}")
            generate(work, mb, kind=kind)
        files = sum(1 for p in (work / "data").rglob("*") if p.is_file())
        label = f"{kind} {mb} MiB"
        log(f"{label}: {files} files; {os.cpu_count()} CPUs; zstd level {args.level}")
        rows += report(label, kind, bench_set(work, label, args.runs, args.level, nodus, tar, zstd))
        if kind == "mixed":
            largest_mixed = work
    with record.Report("checkpoint", args):
        print()
        print(f"checkpoint benchmark: command line against command line, zstd -{args.level}, {os.cpu_count()} CPUs, "
              f"{args.runs} rounds; load average {load_before:.1f} → {os.getloadavg()[0]:.1f} (other work on the "
              "machine slows both sides; cpu-s is immune to it)")
        print(f"filesystem (--fs {args.fs}): {scratchfs.describe(base)}")
        print(f"{'data':<17s} {'step':<8s} {'nodus s':>7s} {'anchor s':>8s} {'ratio':>6s} {'min-max':<11s} "
              f"{'target':>6s} {'':>6s} {'nodus':>7s} {'anchor':>8s} {'floor s':>7s}")
        print(f"{'':<17s} {'':<8s} {'':>7s} {'':>8s} {'':>6s} {'':<11s} {'':>6s} {'':>6s} {'cpu-s':>7s} {'cpu-s':>8s}")
        for row in rows:
            print(row)
        print("save anchor: tar -cf - data | zstd -T0 -3 -o A && sync A; restore anchor: zstd -d -T0 -c A | tar -xf -")
        print("(s = median wall seconds of the whole command; ratio = anchor s ÷ nodus s per round, its median and "
              "min-max: above 1 is nodus ahead; floor = the I/O no implementation skips + Python's start-up)")
        if largest_mixed is not None:
            log("freeze pause: the agent's hold of a running program beside a plain cp -a of the same data")
            pauses, copies, why = freeze_pause(largest_mixed, args.runs)
            copy = statistics.median(copies)
            if pauses is None:
                print(f"freeze pause: n/a, {why}; plain cp -a of the state {copy:.3f}s")
            else:
                pause = statistics.median(pauses)
                print(f"freeze pause: {pause:.3f}s (agent: freeze, parallel in-process copy, thaw) "
                      f"vs plain cp -a {copy:.3f}s; ratio {pause / copy:.2f} (pause ÷ copy, target ≤ 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
