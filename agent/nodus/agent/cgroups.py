"""Per-attempt cgroups: memory limit and OOM count, freezer, CPU weight.

cgroup v1 (a directory per controller: /sys/fs/cgroup/{memory,freezer,cpu}/<root>/<name>) and v2
(one directory /sys/fs/cgroup/<root>/<name>, `cgroup.freeze`, `memory.events`) are both handled.
On v1 an attempt gets only the controllers it uses (ADR 0072): memory (its limit and OOM count) and
freezer (kill_all, the checkpoint freeze) always, cpu only with a CPU request; each one more is a
directory to make and remove and one more move for every step it starts. Older agents also made
pids; `locate` and `names` still find all four. The name follows from the agent's work dir and the attempt id, so a restarted agent finds
the cgroup of an attempt it re-adopts without having stored anything. Where a controller cannot be created (no
permission, not mounted) the attempt runs without it; the caller logs what is missing.

This module is imported by the supervisor, so it imports nothing heavy.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

V1_CONTROLLERS = ("memory", "pids", "freezer", "cpu")
"""What `locate`, `names` and the sweeps look in; `create` makes only what an attempt uses."""
DEFAULT_WEIGHT = {"cpu": ("cpu.shares", "1024"), "unified": ("cpu.weight", "100")}
"""The kernel's default CPU weight of a cgroup (v1 `cpu.shares`, v2 `cpu.weight`): what the agent's own work has."""
DEFAULT_FS = Path(os.environ.get("NODUS_CGROUP_FS", "/sys/fs/cgroup"))


def _write(path: Path, value: str) -> None:
    # open(path, "w")'s flags, without its buffered file's fstat, ioctl and seeks: one write(2) per value
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def version(fs: Path = DEFAULT_FS) -> int:
    """2 on a unified hierarchy, 1 where v1 controllers are mounted, 0 without cgroups."""
    if (fs / "cgroup.controllers").exists():
        return 2
    if any((fs / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return 1
    return 0


@dataclass(slots=True)
class Cgroup:
    """One attempt's cgroup directories (one per v1 controller, or the single v2 one)."""

    version: int
    paths: dict[str, Path] = field(default_factory=dict)
    """Controller name ("unified" on v2) to directory."""
    missing: list[str] = field(default_factory=list)
    """What could not be created, for the log."""

    @classmethod
    def locate(cls, root: str, name: str, fs: Path = DEFAULT_FS) -> "Cgroup":
        """The cgroup as it exists now (possibly nothing); never creates anything."""
        v = version(fs)
        cg = cls(v)
        if v == 2:
            p = fs / root / name
            if p.is_dir():
                cg.paths["unified"] = p
        elif v == 1:
            for c in V1_CONTROLLERS:
                p = fs / c / root / name
                if p.is_dir():
                    cg.paths[c] = p
        return cg

    @staticmethod
    def names(root: str, fs: Path = DEFAULT_FS) -> set[str]:
        """The cgroups directly under `root` (in any controller's directory on v1); never creates anything."""
        v = version(fs)
        parents = [fs / root] if v == 2 else [fs / c / root for c in V1_CONTROLLERS] if v == 1 else []
        found: set[str] = set()
        for parent in parents:
            try:
                found.update(p.name for p in parent.iterdir() if p.is_dir())
            except OSError:
                continue  # that controller has no such root
        return found

    @classmethod
    def create(cls, root: str, name: str, memory_bytes: int = 0, cpu_millis: int = 0,
               fs: Path = DEFAULT_FS) -> "Cgroup":
        v = version(fs)
        cg = cls(v)
        if v == 0:
            cg.missing.append(f"no cgroup hierarchy under {fs}")
            return cg
        if v == 2:
            cg._create_v2(fs, root, name, memory_bytes, cpu_millis)
        else:
            cg._create_v1(fs, root, name, memory_bytes, cpu_millis)
        return cg

    def _create_v1(self, fs: Path, root: str, name: str, memory_bytes: int, cpu_millis: int) -> None:
        for c in ("memory", "freezer", "cpu") if cpu_millis > 0 else ("memory", "freezer"):
            if not (fs / c / "cgroup.procs").exists():
                self.missing.append(f"{c} (not mounted)")
                continue
            p = fs / c / root / name
            try:
                p.mkdir(parents=True, exist_ok=True)
                if c == "memory" and memory_bytes > 0:
                    _write(p / "memory.limit_in_bytes", str(memory_bytes))
                if c == "cpu" and cpu_millis > 0:
                    _write(p / "cpu.shares", str(max(2, cpu_millis * 1024 // 1000)))
            except OSError as e:
                self.missing.append(f"{c} ({e.strerror or e})")
                continue
            self.paths[c] = p

    def _create_v2(self, fs: Path, root: str, name: str, memory_bytes: int, cpu_millis: int) -> None:
        parent = fs / root
        try:
            parent.mkdir(exist_ok=True)
            available = set((fs / "cgroup.controllers").read_text().split())
            wanted = [c for c in ("memory", "pids", "cpu") if c in available]
            for level in (fs, parent):
                try:
                    _write(level / "cgroup.subtree_control", " ".join("+" + c for c in wanted))
                except OSError as e:
                    self.missing.append(f"controllers at {level} ({e.strerror or e})")
            p = parent / name
            p.mkdir(exist_ok=True)
        except OSError as e:
            self.missing.append(f"cgroup ({e.strerror or e})")
            return
        self.paths["unified"] = p
        try:
            if memory_bytes > 0:
                _write(p / "memory.max", str(memory_bytes))
            if cpu_millis > 0:
                _write(p / "cpu.weight", str(min(10000, max(1, cpu_millis * 100 // 1000))))
        except OSError as e:
            self.missing.append(f"limits ({e.strerror or e})")

    # -- use ---------------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return bool(self.paths)

    def attach(self, pid: int = 0) -> None:
        """Moves `pid` (0: the calling process) into every directory; used in the child before exec."""
        value = str(pid or os.getpid())
        for p in self.paths.values():
            _write(p / "cgroup.procs", value)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for p in self.paths.values():
            try:
                found.update(int(x) for x in (p / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def oom_kills(self) -> int:
        """How many times the kernel's OOM killer struck inside this cgroup."""
        if "unified" in self.paths:
            return _keyed(self.paths["unified"] / "memory.events").get("oom_kill", 0)
        mem = self.paths.get("memory")
        if mem is None:
            return 0
        counters = _keyed(mem / "memory.oom_control")
        if "oom_kill" in counters:
            return counters["oom_kill"]
        try:  # old kernels: a limit hit shows in failcnt only
            return 1 if int((mem / "memory.failcnt").read_text()) > 0 else 0
        except (OSError, ValueError):
            return 0

    @contextlib.contextmanager
    def default_weight(self) -> Iterator[None]:
        """The kernel's default CPU weight for the duration, the attempt's own after (docs/adr/0076).

        For the node's work that runs inside the attempt's cgroup: `runc init` sets a container up (its
        mounts, pivot_root, the exec) in the container's cgroup, under this one, so with a small CPU floor
        it waited behind every busier cgroup of a loaded node (260 ms against 61 ms at 102 shares, load 6).
        A weight is relative only, nothing is reserved, and the attempt has its own weight back once runc
        returned (the workload's first milliseconds at most ran at the default)."""
        saved: list[tuple[Path, str]] = []
        for controller, (name, default) in DEFAULT_WEIGHT.items():
            path = self.paths.get(controller)
            if path is None:
                continue
            try:
                own = (path / name).read_text().strip()
                if own != default:
                    _write(path / name, default)
                    saved.append((path / name, own))
            except OSError:
                continue  # no CPU controller there: nothing to lift
        try:
            yield
        finally:
            for file, own in saved:
                try:
                    _write(file, own)
                except OSError:
                    pass  # the cgroup went (the attempt ended meanwhile)

    def freeze(self, frozen: bool = True) -> bool:
        try:
            if "unified" in self.paths:
                _write(self.paths["unified"] / "cgroup.freeze", "1" if frozen else "0")
                return True
            if "freezer" in self.paths:
                _write(self.paths["freezer"] / "freezer.state", "FROZEN" if frozen else "THAWED")
                return True
        except OSError:
            pass
        return False

    def kill_all(self, rounds: int = 50) -> None:
        """SIGKILLs every process in the cgroup, freezing it meanwhile so nothing forks away."""
        if not self.pids():
            return  # nothing runs in it, so nothing can fork into it: no freeze needed
        frozen = self.freeze(True)
        try:
            for _ in range(rounds):
                pids = self.pids()
                if not pids:
                    return
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if frozen:
                    self.freeze(False)
                    frozen = False
                time.sleep(0.01)
        finally:
            if frozen:
                self.freeze(False)

    def remove(self, tries: int = 50) -> list[Path]:
        """Removes the directories once their last tasks left; returns those still there after `tries`
        looks 10 ms apart per directory."""
        left = []
        for p in self.paths.values():
            for _ in range(tries):
                try:
                    p.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # the last tasks are still leaving
            else:
                left.append(p)
        return left


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def own_paths(v: int, fs: Path = DEFAULT_FS) -> dict[str, Path]:
    """This process's own cgroup directory per controller (v1), or {"unified": it} (v2), from /proc/self/cgroup."""
    found: dict[str, Path] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            rel = path.lstrip("/")
            if v == 2 and hierarchy == "0" and not controllers:
                found["unified"] = fs / rel
            for c in controllers.split(",") if v == 1 else ():
                found[c] = fs / c / rel
    return found


class MoveWarmer:
    """Keeps the kernel's cgroup-move lock in its fast state while an attempt's supervisor is on its way to
    its first move (ADR 0072, ADR 0082).

    Every move into a cgroup takes the kernel's threadgroup lock for writing; when no move happened for
    about one RCU grace period that first waits for a grace period (synchronize_rcu: 6-16 ms on a loaded
    2-CPU host), and a move while the last one is less than a grace period old waits for nothing. So
    from an attempt's accept until shortly after its supervisor was forked, this thread moves the agent's
    own process to where it already is every `interval` seconds: moves that change nothing and cost ~10 us
    of CPU each, and only its first waits, off every path that waits. One move at the accept (as before)
    was not enough: the supervisor's first move came 20-30 ms later, when the lock had gone back to its
    slow state and it waited the whole grace period again (strace of the zygote, ADR 0082). A host mounted
    with `favordynmods` waits for none; there this costs its writes.
    """

    INTERVAL = 0.003
    """Seconds between moves: under a grace period (moves 10 ms apart waited again, 5 ms apart did not)."""

    def __init__(self, procs: Path, interval: float = INTERVAL) -> None:
        self.procs = procs
        """The agent's own cgroup.procs (in one hierarchy: the lock is the kernel's, for all of them)."""
        self.interval = interval
        self._until = 0.0
        """Monotonic: moves go on until then."""
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: OSError | None = None
        """Set once a move was refused: the warmer stops."""
        self.moves = 0
        """Moves made so far."""
        self.holding = False
        """Whether the thread is between moves of a hold (False: it waits for the next poke)."""

    @classmethod
    def of_self(cls, fs: Path = DEFAULT_FS) -> "MoveWarmer | None":
        """The warmer for this process's own cgroup, or None without a cgroup hierarchy to move in."""
        v = version(fs)
        try:
            own = own_paths(v, fs) if v else {}
        except OSError:
            return None
        path = own.get("unified" if v == 2 else "freezer")
        return cls(path / "cgroup.procs") if path is not None else None

    def poke(self, hold: float = 0.05) -> None:
        """Asks for moves from now until `hold` seconds from now (or later, where an earlier poke asked for
        longer); returns at once."""
        if self.failed is not None:
            return
        self._until = max(self._until, time.monotonic() + hold)
        self._wanted.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cgroup-move-warmer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        pid = str(os.getpid())
        while self.failed is None:
            self._wanted.wait()
            self._wanted.clear()
            self.holding = True
            while self.failed is None:
                try:
                    _write(self.procs, pid)
                    self.moves += 1
                except OSError as e:
                    self.failed = e
                if time.monotonic() >= self._until:
                    break
                time.sleep(self.interval)
            self.holding = self._wanted.is_set()
