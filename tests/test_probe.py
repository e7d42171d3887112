"""The gang mesh probe: pure parts in-process, the probe itself as real processes on loopback."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent_double import free_port
from nodus.agent.probe import (Budget, EchoServer, PlanError, Report, bus_factor, classify_path,
                               message_sizes, parse_plan, run_probe)

PROBE = [sys.executable, "-m", "nodus.agent.probe"]


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def _plan(rank: int, ports: list[int], store_port: int, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "size": len(ports),
            "peers": [{"rank": r, "address": "127.0.0.1", "probe_port": p} for r, p in enumerate(ports)],
            "store": {"address": "127.0.0.1", "port": store_port}, **extra}


def _run_probes(plans: list[dict[str, Any]], listeners: list[socket.socket] | None = None,
                timeout: float = 60, env: dict[str, str] | None = None) -> list[tuple[int, dict[str, Any], str, float]]:
    """Starts one probe per plan at once; returns (exit code, last stdout line as JSON, stderr, seconds)."""
    started = time.monotonic()

    def one(i: int) -> tuple[int, dict[str, Any], str, float]:
        plan = plans[i]
        if listeners:
            plan = {**plan, "listen_fd": listeners[i].fileno()}
        p = subprocess.run(PROBE, input=json.dumps(plan), capture_output=True, text=True,
                           pass_fds=[plan["listen_fd"]] if listeners else [],
                           timeout=timeout, env=env)
        lines = p.stdout.strip().splitlines()
        return p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr, time.monotonic() - started

    with ThreadPoolExecutor(len(plans)) as pool:
        return list(pool.map(one, range(len(plans))))


@pytest.mark.parametrize("local, peer, path", [
    ("10.0.0.1", "192.168.1.2", "Private"),
    ("127.0.0.1", "127.0.0.1", "Private"),
    ("172.16.5.4", "10.1.2.3", "Private"),
    ("100.64.0.1", "100.127.255.254", "Private"),      # CGNAT
    ("198.18.0.1", "198.19.255.1", "Private"),         # benchmarking range, our multi-host tests
    ("169.254.1.1", "10.0.0.2", "Private"),            # link-local
    ("::1", "fd00::1", "Private"),
    ("fe80::1", "fc00::2", "Private"),
    ("localhost", "127.0.0.1", "Private"),
    ("10.0.0.1", "8.8.8.8", "Public"),
    ("8.8.8.8", "10.0.0.1", "Public"),
    ("100.128.0.1", "10.0.0.1", "Public"),             # just past CGNAT
    ("198.20.0.1", "10.0.0.1", "Public"),              # just past the benchmarking range
    ("2001:4860:4860::8888", "fd00::1", "Public"),
    ("no-such-host.invalid", "10.0.0.1", "Public"),    # unresolvable
])
def test_classify_path(local: str, peer: str, path: str) -> None:
    assert classify_path(local, peer) == path


def test_sizes_double_from_8_bytes_and_busbw_follows_nccl_tests() -> None:
    assert message_sizes(64) == [8, 16, 32, 64]
    assert message_sizes(100) == [8, 16, 32, 64]
    assert message_sizes(64 << 20)[-1] == 64 << 20 and len(message_sizes(64 << 20)) == 24
    assert bus_factor(2) == 1.0 and bus_factor(4) == 1.5 and bus_factor(1) == 0.0


def test_a_plan_gets_its_defaults() -> None:
    plan = parse_plan(_plan(1, [9001, 9002], 9003))
    assert (plan.rank, plan.size, plan.me.probe_port, plan.others[0].rank) == (1, 2, 9002, 0)
    assert (plan.backend, plan.max_bytes, plan.budget_s, plan.pings, plan.allreduce, plan.listen_fd) == \
        ("auto", 64 << 20, 30.0, 200, True, None)
    solo = parse_plan({"rank": 0, "size": 2, "allreduce": False,
                       "peers": [{"rank": 0, "address": "a", "probe_port": 1},
                                 {"rank": 1, "address": "b", "probe_port": 2}]})
    assert solo.store_port == 0   # no store needed without the all-reduce


@pytest.mark.parametrize("change, field", [
    (lambda p: p.pop("size"), "size"),
    (lambda p: p.update(rank=2), "rank"),
    (lambda p: p.update(rank=True), "rank"),
    (lambda p: p["peers"].pop(), "peers"),
    (lambda p: p["peers"][1].update(probe_port=70000), "peers[1].probe_port"),
    (lambda p: p["peers"][1].update(rank=0), "peers[1].rank"),
    (lambda p: p["peers"][0].update(address=""), "peers[0].address"),
    (lambda p: p.pop("store"), "store"),
    (lambda p: p["store"].pop("port"), "store.port"),
    (lambda p: p.update(backend="mpi"), "backend"),
    (lambda p: p.update(max_bytes=4), "max_bytes"),
    (lambda p: p.update(budget_s=0), "budget_s"),
    (lambda p: p.update(pings=0), "pings"),
    (lambda p: p.update(allreduce="yes"), "allreduce"),
    (lambda p: p.update(budget=5), "budget"),
])
def test_a_malformed_plan_names_the_field(change: Any, field: str) -> None:
    plan = _plan(0, [9001, 9002], 9003)
    change(plan)
    with pytest.raises(PlanError) as e:
        parse_plan(plan)
    assert e.value.field == field


def test_the_process_refuses_a_malformed_plan_naming_the_field() -> None:
    plan = _plan(0, [9001, 9002], 9003)
    plan["peers"][1]["probe_port"] = "x"
    p = subprocess.run(PROBE, input=json.dumps(plan), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "peers[1].probe_port" in p.stderr
    p = subprocess.run(PROBE, input="{not json", capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "not JSON" in p.stderr


def test_two_members_measure_rtt_in_process() -> None:
    """The RTT half without torch: two members as threads, each serving echo and pinging the other."""
    listeners = [_listener(), _listener()]
    ports = [s.getsockname()[1] for s in listeners]
    reports: list[Report] = []

    def member(rank: int) -> None:
        plan = parse_plan({**_plan(rank, ports, 1, allreduce=False, budget_s=10, pings=20),
                           "listen_fd": listeners[rank].fileno()})
        report = Report(plan)
        reports.append(report)
        run_probe(plan, report, Budget(time.monotonic(), plan.budget_s))

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    for report in reports:
        out = report.to_json()
        assert out["error"] == "" and out["bus_gbps"] is None and out["path"] == "Private"
        peer = 1 - out["rank"]
        assert set(out["rtt_ms"]) == {str(peer)} and out["worst_peer"] == peer
        assert out["worst_rtt_ms"] > 0  # how small is bench/gang.py's (beside a raw TCP echo)


def test_no_member_leaves_the_rtt_phase_while_a_peer_still_pings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its echo thread would share the GIL with torch's import and the rendezvous: the peer's RTT
    would time this process, not the network."""
    from nodus.agent import probe
    started: list[float] = []
    monkeypatch.setattr(probe, "measure_allreduce", lambda plan, report, budget: started.append(time.monotonic()))
    listeners = [_listener(), _listener()]
    ports = [s.getsockname()[1] for s in listeners]
    peer_echo = EchoServer(listeners[1]).start()   # rank 1 answers rank 0's pings at once...
    plan = parse_plan({**_plan(0, ports, 1, budget_s=10), "listen_fd": listeners[0].detach()})
    member = threading.Thread(target=run_probe, args=(plan, Report(plan), Budget(time.monotonic(), plan.budget_s)))
    member.start()
    with socket.create_connection(("127.0.0.1", ports[0])) as c:   # ...but pings rank 0 slowly
        c.sendall((1).to_bytes(4, "big"))
        assert c.recv(4, socket.MSG_WAITALL) == (1).to_bytes(4, "big")
        for _ in range(5):
            c.sendall(b".")
            assert c.recv(1) == b"."
            time.sleep(0.1)
        assert not started
        finished = time.monotonic()
    member.join(10)
    peer_echo.close()
    assert started and started[0] >= finished


def test_the_echo_server_counts_finished_pingers() -> None:
    with _listener() as s:
        server = EchoServer(s).start()
        port = s.getsockname()[1]
        assert server.wait_finished({3}, timeout=0) == {3}
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall((3).to_bytes(4, "big") + b"ab")
            assert c.recv(6, socket.MSG_WAITALL) == (3).to_bytes(4, "big") + b"ab"
        assert server.wait_finished({3}, timeout=5) == set()
        server.close()


def test_two_members_without_allreduce_wait_for_each_others_pings() -> None:
    listeners = [_listener(), _listener()]
    ports = [s.getsockname()[1] for s in listeners]
    results = _run_probes([_plan(r, ports, 1, allreduce=False, budget_s=10) for r in (0, 1)], listeners)
    for code, out, err, _ in results:
        assert code == 0, err
        assert out["error"] == "" and set(out["rtt_ms"]) == {str(1 - out["rank"])} and out["bus_gbps"] is None


def test_without_torch_the_probe_still_measures_rtt_and_exits_0(tmp_path: Path) -> None:
    """No rendezvous to act as a barrier: each member keeps echoing until its peer has pinged it."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch on this host')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    listeners = [_listener(), _listener()]
    ports = [s.getsockname()[1] for s in listeners]
    results = _run_probes([_plan(r, ports, free_port(), budget_s=10) for r in (0, 1)], listeners, env=env)
    for code, out, err, seconds in results:
        assert code == 0, err
        assert out["bus_gbps"] is None and out["sizes"] == [] and "torch is not importable" in out["error"]
        assert set(out["rtt_ms"]) == {str(1 - out["rank"])}
        assert "did not finish pinging" not in out["error"]


@pytest.mark.slow
def test_two_probes_measure_rtt_and_busbw_like_a_plain_loop() -> None:
    listeners = [_listener(), _listener()]
    ports = [s.getsockname()[1] for s in listeners]
    # A budget far above what two probes need: this test is about what they measure, and on a loaded
    # machine torch's import and gloo's rendezvous alone took 12 s (the budget bench/agent_timings.py times).
    plans = [_plan(r, ports, free_port(), backend="gloo", max_bytes=256 << 10, budget_s=40) for r in (0, 1)]
    plans[1]["store"] = plans[0]["store"]
    results = _run_probes(plans, listeners)
    for code, out, err, _ in results:
        assert code == 0, err
        assert out["error"] == "", out["error"]
        assert set(out["rtt_ms"]) == {str(1 - out["rank"])}
        assert out["bus_gbps"] > 0 and out["backend"] == "gloo" and out["path"] == "Private"
        assert out["sizes"][0]["bytes"] == 8 and out["bytes"] == out["sizes"][-1]["bytes"]
        assert out["worst_rtt_ms"] > 0  # beside a raw TCP echo's: bench/gang.py
    # Every rank times the same window (the slowest rank's), so they report the same figure.
    assert results[0][1]["bus_gbps"] == results[1][1]["bus_gbps"]
    # The same size through a plain loop, in the same test: the probe's figure is of the same order.
    nbytes, iters = results[0][1]["bytes"], results[0][1]["sizes"][-1]["iters"]
    store_port = free_port()
    script = ("import sys; from nodus.agent.probe import plain_allreduce_busbw as f; "
            f"print(f(int(sys.argv[1]), 2, '127.0.0.1', {store_port}, {nbytes}, {iters}))")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE, text=True)
             for r in (0, 1)]
    plain = [float(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(b > 0 for b in plain) and len(plain) == 2  # the two figures side by side: bench/gang.py


@pytest.mark.slow
def test_three_probes_binding_their_own_ports() -> None:
    ports, store = [free_port() for _ in range(3)], free_port()
    results = _run_probes([_plan(r, ports, store, max_bytes=64 << 10, budget_s=40, pings=20) for r in range(3)])
    for code, out, err, _ in results:
        assert code == 0, err
        assert out["error"] == "", out["error"]
        assert set(out["rtt_ms"]) == {str(r) for r in range(3)} - {str(out["rank"])}
        assert out["bus_gbps"] > 0 and out["backend"] == "gloo"
        # busbw = algbw × 2(n−1)/n
        assert out["bus_gbps"] == pytest.approx(out["algbw_gbps"] * 4 / 3, rel=1e-3)


@pytest.mark.slow
def test_a_probe_whose_peer_never_comes_reports_within_its_budget() -> None:
    listener, absent = _listener(), free_port()   # nobody listens on the peer's port
    plan = _plan(0, [listener.getsockname()[1], absent], free_port(), budget_s=5)
    [(code, out, err, seconds)] = _run_probes([plan], [listener])
    assert code == 0, err  # it ends by itself (_run_probes waits 60 s): how soon: bench/agent_timings.py
    assert out["rtt_ms"] == {} and out["bus_gbps"] is None and out["worst_peer"] is None
    assert "rank 1" in out["error"], out["error"]


@pytest.mark.slow
def test_a_peer_that_freezes_midway_cannot_hold_the_probe_past_its_budget() -> None:
    """Whatever phase the frozen peer is in (pings, rendezvous, a collective), rank 0 reports in time."""
    ports, store = [free_port(), free_port()], free_port()
    procs = [subprocess.Popen(PROBE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for _ in ports]
    for rank, p in enumerate(procs):
        assert p.stdin is not None
        p.stdin.write(json.dumps(_plan(rank, ports, store, backend="gloo", budget_s=6)))
        p.stdin.close()
    try:
        time.sleep(2.5)   # the peer is mid-probe: the sweep alone runs until 85% of the budget
        os.kill(procs[1].pid, signal.SIGSTOP)
        assert procs[0].stdout is not None
        out = procs[0].stdout.read()
        assert procs[0].wait(10) == 0
        report = json.loads(out.strip().splitlines()[-1])
        assert report["rank"] == 0 and report["error"], report
    finally:
        for p in procs:
            p.kill()
            p.wait()
