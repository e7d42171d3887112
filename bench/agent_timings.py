"""The agent's timings whose assertions left the tests, each beside its anchor or its configured target.

The tests keep the functional half (a cancelled program that obeys SIGTERM is not killed, a stubborn one
gets SIGKILL, an init command past its timeout fails the attempt, 151 progress reports are folded, a stop
at the gate cancels the member, a probe without its peer reports by itself, a store killed mid-save keeps
its latest checkpoint); how long each takes is read here, measured in the same run as what it is set
beside. Run it from the repository root: `.venv/bin/python bench/agent_timings.py [--runs 5]`; it takes
about a minute. The figures, through the real daemons and processes:

- cancel grace: a real `nodus-agent` against the tests' protocol double of the coordinator
  (tests/agent_double.py). A Cancel with a 30 s grace of a program that exits on SIGTERM: time from the
  Cancel to the attempt's finishTime, beside a bare SIGTERM of the same program spawned here. A Cancel
  with a 1 s grace of a program that ignores SIGTERM: the same time beside the configured grace.
- init timeout: an init command that sleeps 60 s with a 500 ms timeout: from the moment the init command
  started (it writes the time) to the attempt's finishTime, beside the timeout.
- progress folding: a program writing 151 progress reports 10 ms apart, `--runs` times: Progress
  messages per second of its runs (each run's first and its forced last not counted) beside the agent's limit
  (decisions.PROGRESS_MIN_INTERVAL) and the program's own report rate.
- gate stop: a gang member's supervisor (`python -m nodus.agent.supervisor`, as the agent starts it)
  waiting at its gate: from cancel.json written to its finishTime, beside the same stop of a supervisor
  whose main command runs (and exits on SIGTERM).
- probe budget: the mesh probe (`python -m nodus.agent.probe`) whose peer never comes, and one whose
  peer is frozen (SIGSTOP) midway: time to its report beside its budget; and two probes on a host
  without torch (RTT only), beside their budget and the 5 s the test once allowed.
- handshake hold (tests/test_recovery_agent.py): `checkpointing.take` of a program that answers the
  handshake: the pause it was held, beside a plain copy of the same state and the handshake timeout.
- the store's kill -9 trial (tests/test_checkpoint_stores.py): a saver process killed at a random moment
  of a save, then the store listed, verified and restored: seconds per trial, beside an in-process save
  of the same size and a bare interpreter start that imports the library.

Nothing is asserted; a target that is missed is printed as MISSED.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from nodus.agent.checkpointing import HANDSHAKE_TIMEOUT, handshake_dir, handshake_env, take
from nodus.agent.decisions import PROGRESS_MIN_INTERVAL
from nodus.agent.gang import PROBE_GRACE
from nodus.agent.layout import AttemptLayout
from nodus.agent.statefile import read_json, write_json
from nodus.checkpoint import LocalStore
from nodus.checkpoint.localcopy import copy_tree
from nodus.v1 import agent_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' doubles
from agent_double import AgentProcess, FakeCoordinator, free_port, wait_for  # noqa: E402

import record  # noqa: E402
from daemons import stop_all  # noqa: E402
from test_checkpoint_stores import SAVER  # noqa: E402  (the test's kill -9 program, timed here)
from test_recovery_agent import HANDSHAKE  # noqa: E402  (the test's opted-in program, timed here)

PY = sys.executable
POLITE = ("import signal, sys, time\n"
          "def bye(*a):\n    print('got SIGTERM', flush=True); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\nwhile True: time.sleep(0.05)\n")
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM', flush=True))\n"
            "print('up', flush=True)\nwhile True: time.sleep(0.05)\n")
PROGRESS = ("import time\nfrom nodus import progress\n"
            "for i in range(1, 151):\n"
            "    progress.report(stage='train', completed=i, total=150)\n"
            "    time.sleep(0.01)\n"
            "progress.report(step=7, totalSteps=10)\n")
CANCEL_GRACE_POLITE = 30
CANCEL_GRACE_STUBBORN = 1
INIT_TIMEOUT_MS = 500


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def p50_max(values: list[float]) -> str:
    return f"{ms(statistics.median(values))} ms / {ms(max(values))} ms"


def seconds_of(ts: Any) -> float:
    return ts.seconds + ts.nanos / 1e9


def verdict(ok: bool) -> str:
    return "" if ok else "  MISSED"


# -- through the agent -------------------------------------------------------------------------------
def assignment(attempt_id: str, code: str, *args: str) -> agent_pb2.Assignment:
    a = agent_pb2.Assignment(attempt_id=attempt_id, index=0, attempt_number=1, command=[PY, "-c", code, *args])
    a.job.project, a.job.name, a.job.uid = "default", "job-" + attempt_id, "uid-" + attempt_id
    return a


def cancelled_after(fake: FakeCoordinator, attempt_id: str, code: str, grace: int) -> float:
    """Seconds from a Cancel of a running attempt to its finishTime (both this host's wall clock)."""
    fake.assign(assignment(attempt_id, code))
    wait_for(lambda: "up" in fake.log(attempt_id), 30, what=f"{attempt_id} to run")
    asked = time.time()
    fake.cancel(attempt_id, reason="Cancelled", grace=grace)
    end = fake.wait_final(attempt_id, 60)
    return seconds_of(end.finish_time) - asked


def bare_sigterm(code: str) -> float:
    """The anchor: the same program spawned here, SIGTERM, until it has exited."""
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.readline()
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait()
    return time.monotonic() - t0


def init_timeout_after(fake: FakeCoordinator, attempt_id: str, mark: Path) -> float:
    a = assignment(attempt_id, "print('main')")
    # sh, not python: the mark is written within a millisecond or two of the init command's spawn
    a.init_command.command.extend(["sh", "-c", f'date +%s.%N > "{mark}"; exec sleep 60'])
    a.init_command.timeout.FromMilliseconds(INIT_TIMEOUT_MS)
    fake.assign(a)
    end = fake.wait_final(attempt_id, 60)
    return seconds_of(end.finish_time) - float(mark.read_text())


def progress_rate(fake: FakeCoordinator, attempt_id: str) -> tuple[int, float]:
    """(Progress messages sent, seconds the program ran)."""
    fake.assign(assignment(attempt_id, PROGRESS))
    end = fake.wait_final(attempt_id, 60)
    wait_for(lambda: attempt_id in fake.log_eof, 20, what="the log's eof")
    return len(fake.progress(attempt_id)), seconds_of(end.finish_time) - seconds_of(end.start_time)


def agent_figures(args: argparse.Namespace, tmp: Path) -> None:
    fake = FakeCoordinator(lease=30.0, heartbeat=0.5).start()
    agent = AgentProcess(tmp / "work", fake.address, fake.token)
    try:
        agent.start()
        wait_for(fake.current, 30, what="the agent's stream")
        polite = [cancelled_after(fake, f"polite-{i}", POLITE, CANCEL_GRACE_POLITE) for i in range(args.runs)]
        bare = [bare_sigterm(POLITE) for _ in range(args.runs)]
        stubborn = [cancelled_after(fake, f"stubborn-{i}", STUBBORN, CANCEL_GRACE_STUBBORN) for i in range(args.runs)]
        init = [init_timeout_after(fake, f"init-{i}", tmp / f"init-{i}.started") for i in range(args.runs)]
        folded = [progress_rate(fake, f"progress-{i}") for i in range(args.runs)]
    finally:
        agent.stop()
        stop_all([], [tmp / "work"])  # whatever an interrupted run left of its attempts
        fake.stop()
    limit = 1 / PROGRESS_MIN_INTERVAL
    sent, ran = sum(n for n, _ in folded), sum(t for _, t in folded)
    # Each run's last message is its end's, never held back; its first goes at once. Between the others
    # the agent waits PROGRESS_MIN_INTERVAL, so those per second are what the limit bounds.
    paced = sent - 2 * len(folded)
    print(f"cancel → exit, exits on SIGTERM (grace {CANCEL_GRACE_POLITE} s), p50 / max  {p50_max(polite)}"
          f"  beside a bare SIGTERM of it {ms(statistics.median(bare))} ms; grace {ms(CANCEL_GRACE_POLITE)} ms"
          f"{verdict(max(polite) < CANCEL_GRACE_POLITE)}")
    over = statistics.median(stubborn) - CANCEL_GRACE_STUBBORN
    print(f"cancel → exit, ignores SIGTERM (grace {CANCEL_GRACE_STUBBORN} s), p50 / max  {p50_max(stubborn)}"
          f"  beside the configured grace {ms(CANCEL_GRACE_STUBBORN)} ms (p50 over it by {ms(over)} ms)"
          f"{verdict(min(stubborn) >= CANCEL_GRACE_STUBBORN)}")
    timeout = INIT_TIMEOUT_MS / 1e3
    print(f"init timeout → Failed, p50 / max  {p50_max(init)}  beside the configured timeout {INIT_TIMEOUT_MS} ms "
          f"(target: within 1,000 ms past it){verdict(max(init) <= timeout + 1.0)}")
    print(f"progress messages/s  {paced / ran:.2f}/s  beside the limit {limit:.2f}/s "
          f"(PROGRESS_MIN_INTERVAL {PROGRESS_MIN_INTERVAL} s; {sent} messages in {len(folded)} runs, each run's first "
          f"and forced last not counted); the program wrote {151 * len(folded) / ran:.1f} reports/s over {ran:.2f} s"
          f"{verdict(paced <= limit * ran)}")


# -- a gang member's supervisor --------------------------------------------------------------------
def supervisor(root: Path, *, command: list[str], gang: bool) -> tuple[subprocess.Popen[bytes], AttemptLayout]:
    layout = AttemptLayout(root)
    layout.make()
    write_json(layout.spec, {"attempt_id": root.name, "command": command, "env": {"PATH": os.environ["PATH"]},
                             "working_dir": str(root), "outputs": [], "resources": {}, "cgroups": False,
                             "stop_grace": 2, **({"gang": {"epoch": 1, "rank": 1}} if gang else {})})
    proc = subprocess.Popen([PY, "-m", "nodus.agent.supervisor", str(root)], stdin=subprocess.PIPE,
                            stdout=open(layout.run / "supervisor.log", "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(b'{"env": {}}')
    proc.stdin.close()
    return proc, layout


def stopped_after(root: Path, *, gang: bool, wake: bool = True) -> float:
    """Seconds from the stop request to the supervisor's finishTime, at the gate or with its command
    running. `wake`: as the agent asks (runtime.request_stop: cancel.json, then SIGTERM to the supervisor);
    without it, cancel.json alone, which the supervisor polls for (what tests/test_supervisor_gang.py writes)."""
    proc, layout = supervisor(root, command=[PY, "-c", POLITE], gang=gang)
    try:
        ready: Callable[[dict[str, Any]], bool] = ((lambda s: s.get("gate") == "waiting") if gang else
                                                   (lambda s: s.get("phase") == "RUNNING"))
        wait_for(lambda: ready(read_json(layout.status) or {}), 30, what="the member at its gate or running")
        if not gang:
            wait_for(lambda: layout.log.exists() and "up" in layout.log.read_text(), 30, what="the command")
        asked = time.time()
        write_json(layout.cancel, {"phase": "CANCELLED", "reason": "ScaledDown", "grace_seconds": 2})
        if wake:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)
        end = read_json(layout.status) or {}
        if (end.get("phase"), end.get("reason")) != ("CANCELLED", "ScaledDown"):
            raise SystemExit(f"the stopped supervisor ended {end.get('phase')}/{end.get('reason')}, not CANCELLED")
        return float(end["finish_time"]) - asked
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def gate_figures(args: argparse.Namespace, tmp: Path) -> None:
    at_gate = [stopped_after(tmp / f"gate-{i}", gang=True) for i in range(args.runs)]
    polled = [stopped_after(tmp / f"gate-polled-{i}", gang=True, wake=False) for i in range(args.runs)]
    running = [stopped_after(tmp / f"running-{i}", gang=False) for i in range(args.runs)]
    print(f"gate stop → Cancelled, p50 / max  {p50_max(at_gate)}  beside a running member's stop "
          f"{p50_max(running)} (target ≤ 2,000 ms){verdict(max(at_gate) <= 2.0)}")
    print(f"  cancel.json alone (polled at the gate), p50 / max  {p50_max(polled)}{verdict(max(polled) <= 2.0)}")


# -- the mesh probe ----------------------------------------------------------------------------------
PROBE = [PY, "-m", "nodus.agent.probe"]


def probe_plan(rank: int, ports: list[int], store_port: int, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "size": len(ports),
            "peers": [{"rank": r, "address": "127.0.0.1", "probe_port": p} for r, p in enumerate(ports)],
            "store": {"address": "127.0.0.1", "port": store_port}, **extra}


def absent_peer(budget: float) -> float:
    """A probe whose peer never listens: seconds until it reports."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        plan = probe_plan(0, [listener.getsockname()[1], free_port()], free_port(), budget_s=budget,
                          listen_fd=listener.fileno())
        t0 = time.monotonic()
        subprocess.run(PROBE, input=json.dumps(plan), capture_output=True, text=True, pass_fds=[listener.fileno()],
                       timeout=budget + 60, check=True)
        return time.monotonic() - t0


def frozen_peer(budget: float) -> float:
    """Two probes; the peer is frozen (SIGSTOP) at 40 % of the budget: seconds until rank 0 reports."""
    ports, store = [free_port(), free_port()], free_port()
    procs = [subprocess.Popen(PROBE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for _ in ports]
    t0 = time.monotonic()
    try:
        for rank, p in enumerate(procs):
            assert p.stdin is not None
            p.stdin.write(json.dumps(probe_plan(rank, ports, store, backend="gloo", budget_s=budget)))
            p.stdin.close()
        time.sleep(budget * 0.4)
        os.kill(procs[1].pid, signal.SIGSTOP)
        assert procs[0].stdout is not None
        procs[0].stdout.read()
        procs[0].wait(budget + 60)
        return time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()


def without_torch(budget: float, tmp: Path) -> float:
    """Two probes on a host where torch does not import (RTT only): seconds until both have reported."""
    fake_torch = tmp / "no-torch" / "torch"
    fake_torch.mkdir(parents=True, exist_ok=True)
    (fake_torch / "__init__.py").write_text("raise ImportError('no torch on this host')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_torch.parent), os.environ.get("PYTHONPATH", "")])}
    listeners = [socket.socket(), socket.socket()]
    try:
        for s in listeners:
            s.bind(("127.0.0.1", 0))
            s.listen(16)
        ports, store = [s.getsockname()[1] for s in listeners], free_port()
        t0 = time.monotonic()
        procs = [subprocess.Popen(PROBE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, env=env, pass_fds=[s.fileno()]) for s in listeners]
        for rank, (p, s) in enumerate(zip(procs, listeners)):
            assert p.stdin is not None
            p.stdin.write(json.dumps(probe_plan(rank, ports, store, budget_s=budget, listen_fd=s.fileno())))
            p.stdin.close()
        for p in procs:
            assert p.stdout is not None
            p.stdout.read()
            p.wait(budget + 60)
        return time.monotonic() - t0
    finally:
        for s in listeners:
            s.close()


def probe_figures(args: argparse.Namespace, tmp: Path) -> None:
    absent = [absent_peer(args.probe_budget) for _ in range(args.runs)]
    frozen = [frozen_peer(args.probe_budget) for _ in range(max(1, args.runs // 2))]
    rtt_only = [without_torch(2 * args.probe_budget, tmp) for _ in range(args.runs)]
    budget_ms = ms(args.probe_budget)
    print(f"probe, peer never comes: report after p50 / max  {p50_max(absent)}  beside its budget {budget_ms} ms "
          f"(the agent gives up at budget + {PROBE_GRACE:.0f} s){verdict(max(absent) <= args.probe_budget + 1)}")
    print(f"probe, peer frozen midway: report after p50 / max  {p50_max(frozen)}  beside its budget {budget_ms} ms"
          f"{verdict(max(frozen) <= args.probe_budget + 1)}")
    print(f"probe without torch (RTT only, 2 members): both reported after p50 / max  {p50_max(rtt_only)}  beside "
          f"its budget {ms(2 * args.probe_budget)} ms (target ≤ 5,000 ms){verdict(max(rtt_only) <= 5.0)}")


# -- the checkpoint handshake ------------------------------------------------------------------------


def handshake_pauses(runs: int, tmp: Path) -> tuple[list[float], list[float]]:
    """(the agent's hold of a program that answers the handshake, a plain copy of the same state)."""
    layout = AttemptLayout(tmp / "handshake")
    for d in (layout.state, layout.run):
        d.mkdir(parents=True, exist_ok=True)
    (layout.state / "weights.bin").write_bytes(random.Random(3).randbytes(4 << 20))
    env = {**os.environ, **handshake_env(layout)}
    handshake_dir(layout).mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([PY, "-c", HANDSHAKE, str(layout.state)], env=env, stdout=subprocess.PIPE,
                            start_new_session=True)
    pauses, copies = [], []
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        for seq in range(1, runs + 1):
            snap = take(layout, seq, ["/nodus/state"], opted_in=True, main_pid=proc.pid, cgroup=None)
            if snap.method != "handshake":
                raise SystemExit(f"checkpoint {seq} was held by {snap.method}, not the handshake")
            pauses.append(snap.pause)
            snap.archive.unlink()
            t0 = time.monotonic()
            copy_tree(layout.state, tmp / f"plain-copy-{seq}")
            copies.append(time.monotonic() - t0)
    finally:
        proc.kill()
        proc.wait()
    return pauses, copies


def handshake_figures(args: argparse.Namespace, tmp: Path) -> None:
    pauses, copies = handshake_pauses(args.runs, tmp)
    print(f"handshake hold (answer, then local copy of 4 MB), p50 / max  {p50_max(pauses)}  beside a plain copy of "
          f"the state {p50_max(copies)}; handshake timeout {ms(HANDSHAKE_TIMEOUT)} ms")


# -- the store's kill -9 trial --------------------------------------------------------------------------
def crash_trials(trials: int, tmp: Path) -> tuple[list[float], list[float]]:
    """tests/test_checkpoint_stores.py's trial: (seconds per trial, seconds of its list + verify + restore)."""
    store_dir, state = tmp / "store", tmp / "state"
    state.mkdir(parents=True)
    store = LocalStore(store_dir)
    rng = random.Random(7)
    whole, recovery = [], []
    for trial in range(trials):
        t0 = time.monotonic()
        proc = subprocess.Popen([PY, "-c", SAVER, str(store_dir), str(state), str(7 + trial)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(rng.uniform(0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t1 = time.monotonic()
        latest = store.list()[-1]
        store.verify(latest.seq)
        into = tmp / f"restore-{trial}"
        store.restore(into)
        seq_text, digest = (into / str(state).lstrip("/") / "seq").read_text().split()
        if int(seq_text) != latest.seq or hashlib.sha256(
                (into / str(state).lstrip("/") / "blob").read_bytes()).hexdigest() != digest:
            raise SystemExit(f"trial {trial}: the restored checkpoint is not the latest one whole")
        recovery.append(time.monotonic() - t1)
        store.prune(older_than=timedelta(0))
        store.collect_garbage(grace=timedelta(0))
        subprocess.run(["rm", "-rf", str(into)], check=True)
        whole.append(time.monotonic() - t0)
    return whole, recovery


def in_process_save(tmp: Path) -> float:
    """The anchor: one save of the trial's mean state (about 2 MB) in this process."""
    state = tmp / "anchor-state"
    state.mkdir(parents=True)
    (state / "blob").write_bytes(random.Random(1).randbytes(1 << 20) + bytes(1 << 19))
    store = LocalStore(tmp / "anchor-store")
    t0 = time.monotonic()
    store.save([str(state)], seq=1, level=1)
    return time.monotonic() - t0


def interpreter_start() -> float:
    t0 = time.monotonic()
    subprocess.run([PY, "-c", "import nodus.checkpoint"], check=True)
    return time.monotonic() - t0


def crash_figures(args: argparse.Namespace, tmp: Path) -> None:
    whole, recovery = crash_trials(args.crash_trials, tmp / "crash")
    save = statistics.median(in_process_save(tmp / f"anchor-{i}") for i in range(3))
    start = statistics.median(interpreter_start() for _ in range(3))
    print(f"kill -9 trial, p50 / max  {p50_max(whole)} per trial ({args.crash_trials} trials, "
          f"{sum(whole):.1f} s in all)  beside an interpreter start with the library {ms(start)} ms "
          f"and a 1.5 MB save in process {ms(save)} ms")
    print(f"  of which list + verify + restore after the kill, p50 / max  {p50_max(recovery)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs of each figure (the probe's frozen peer: half)")
    ap.add_argument("--probe-budget", type=float, default=5.0, help="the probe's budget in seconds")
    ap.add_argument("--crash-trials", type=int, default=20)
    record.add_flags(ap)
    args = record.shrink(ap.parse_args(), {"runs": 1, "probe_budget": 2.0, "crash_trials": 2})

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through every finally: the agent, supervisors and probes stop
    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="nodus-agent-timings-") as d, record.Report("agent_timings", args):
        tmp = Path(d)
        print(f"agent timings ({args.runs} runs each, load average {os.getloadavg()[0]:.2f})")
        agent_figures(args, tmp)
        gate_figures(args, tmp)
        probe_figures(args, tmp)
        handshake_figures(args, tmp)
        crash_figures(args, tmp)


if __name__ == "__main__":
    main()
