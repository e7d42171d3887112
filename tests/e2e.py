"""REST helpers for tests against a real coordinator and real agents: creating, reading and patching Jobs,
listing their Attempts, waiting for a Job with a deadline (a timeout says the Job's last status); and
starting agents that have registered and are reaped, workloads too, after the test."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

from conftest import BIN, Coordinator, job
from agent_double import AgentProcess, wait_for
from invariants import check_fleet

NS = "/apis/nodus.dev/v1/namespaces/default"
JOBS = f"{NS}/jobs"
ATTEMPTS = f"{NS}/attempts"
MERGE = {"Content-Type": "application/merge-patch+json"}
ENDED = ("Succeeded", "Failed", "Cancelled")


def create(c: Coordinator, name: str, **spec: Any) -> dict[str, Any]:
    r = c.session().post(c.url(JOBS), json=job(name, **spec))
    assert r.status_code == 201, r.text
    return r.json()


def grant(c: Coordinator, amount: str = "100.00", project: str = "default") -> None:
    """Credits for a project, as an operator grants them (`nodus credits grant`): with a price book
    active, nothing is placed that no hold covers."""
    c.run("nodus", "credits", "grant", "--project", project, amount)


def get_job(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{JOBS}/{name}"))
    assert r.status_code == 200, r.text
    return r.json()


def status(c: Coordinator, name: str) -> dict[str, Any]:
    """The Job's status: {} until the controller first writes one."""
    return get_job(c, name).get("status") or {}


def attempts_of(c: Coordinator, name: str) -> list[dict[str, Any]]:
    """The Job's Attempts by index, then number (a gang's members are index 0, numbered by epoch)."""
    r = c.session().get(c.url(ATTEMPTS), params={"labelSelector": f"nodus.dev/job={name}"})
    assert r.status_code == 200, r.text
    return sorted(r.json()["items"], key=lambda a: (a["spec"]["index"], a["spec"]["number"]))


def patch_state(c: Coordinator, name: str, state: str) -> None:
    r = c.session().patch(c.url(f"{JOBS}/{name}"), json={"spec": {"state": state}}, headers=MERGE)
    assert r.status_code == 200, r.text


def units(j: dict[str, Any]) -> int:
    """The units of work the Job's program reported done (nodus.progress), 0 before any."""
    return int((((j.get("status") or {}).get("progress") or {}).get("units") or {}).get("completed") or 0)


def wait_job(c: Coordinator, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float = 120,
             what: str = "", tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """The Job once `predicate(job)` holds; `tick` runs before each look (a test moving the clock)."""
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal last
        if tick is not None:
            tick()
        last = get_job(c, name)
        return last if predicate(last) else None

    try:
        return wait_for(check, timeout, interval=0.1, what=what or f"Job {name}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last status: {last.get('status')}") from None


def wait_status(c: Coordinator, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float = 60,
                what: str = "") -> dict[str, Any]:
    """The Job's status once `predicate(status)` holds."""
    return wait_job(c, name, lambda j: predicate(j.get("status") or {}), timeout, what).get("status") or {}


def ended(c: Coordinator, name: str, timeout: float = 180) -> dict[str, Any]:
    """The Job once its phase is terminal (members of a gang may still be stopping)."""
    return wait_job(c, name, lambda o: (o.get("status") or {}).get("phase") in ENDED, timeout,
                    what=f"Job {name} to end")


def settled(c: Coordinator, name: str, timeout: float = 60) -> dict[str, Any]:
    """The Job's status once it is terminal with no attempt left active."""
    return wait_status(c, name, lambda s: s.get("phase") in ENDED and not s.get("active"), timeout,
                       f"Job {name} to end with no attempt active")


def suspend(c: Coordinator, name: str) -> dict[str, Any]:
    """Suspends the Job; returns it once it is Suspended with no attempt active."""
    patch_state(c, name, "Suspended")
    return wait_job(c, name, lambda j: j["status"].get("phase") == "Suspended" and j["status"].get("active") == 0,
                    what=f"Job {name} to suspend")


def registered(a: AgentProcess, timeout: float = 30) -> None:
    """Until the agent has registered; fails at once, with its log, if it exited instead."""
    wait_for(lambda: "registered node" in a.log() or a.proc.poll() is not None, timeout,
             what=f"agent {a.node} to register")
    assert a.proc.poll() is None, f"nodus-agent exited {a.proc.returncode}:\n{a.log()[-3000:]}"


def agent_md(c: Coordinator) -> tuple[tuple[str, str], ...]:
    """gRPC metadata that authenticates as a node agent (by the join token)."""
    return (("authorization", "Bearer " + c.join_token),)


AGENT_ENV = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
"""Launchers (torchrun, ray, accelerate) resolve from the venv, as on a node where they are installed."""


@contextlib.contextmanager
def joined(started: list[AgentProcess], c: Coordinator | None = None) -> Iterator[list[AgentProcess]]:
    """The started agents once each has registered; reaped (workloads too) after. With the coordinator
    they joined, a test that passed must also leave the fleet's invariants whole (tests/invariants.py)."""
    try:
        for a in started:
            registered(a)
        yield started
        if c is not None:
            check_fleet(c, started)
    finally:
        for a in started:
            a.reap()


@contextlib.contextmanager
def start_agent(c: Coordinator, work_dir: Path, node: str = "node-a",
                extra_args: tuple[str, ...] = ()) -> Iterator[AgentProcess]:
    """One real agent on loopback, registered; reaped (workloads too) after."""
    with joined([AgentProcess(work_dir, c.grpc, c.join_token, node=node, extra_args=extra_args).start()], c) as [a]:
        yield a


def fleet(c: Coordinator, root: Path, count: int, prefix: str, *extra: str
          ) -> contextlib.AbstractContextManager[list[AgentProcess]]:
    """`count` real agents on loopback ("nodes" PREFIX-n0…), registered; reaped (workloads too) after."""
    return joined([AgentProcess(root / f"n{i}", c.grpc, c.join_token, node=f"{prefix}-n{i}", env=AGENT_ENV,
                                extra_args=("--advertise-address", "127.0.0.1", *extra)).start()
                   for i in range(count)], c)


@contextlib.contextmanager
def following(c: Coordinator, name: str, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`nodus logs NAME -f` as a user runs it, printing into OUT; killed after if it is still running."""
    env = {**os.environ, "NODUS_KUBECONFIG": str(c.kubeconfig), "HOME": str(c.data_dir.parent)}
    with open(out, "wb") as sink:
        follower = subprocess.Popen([str(BIN / "nodus"), "logs", name, "-f"], stdout=sink, stderr=subprocess.PIPE,
                                    env=env)
    try:
        yield follower
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def job_events(c: Coordinator, name: str) -> list[dict[str, Any]]:
    """The Events about Job NAME as kubectl lists them (core v1, by involvedObject), oldest first."""
    out = c.run("kubectl", "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
    items = json.loads(out)["items"]
    return sorted(items, key=lambda e: (e.get("lastTimestamp") or "", e["reason"]))


def wait_events(c: Coordinator, name: str, reasons: set[str], timeout: float = 30) -> list[dict[str, Any]]:
    """Job NAME's Events once every reason in `reasons` is among them."""
    def check() -> list[dict[str, Any]] | None:
        events = job_events(c, name)
        return events if reasons <= {e["reason"] for e in events} else None
    return wait_for(check, timeout, what=f"the events {sorted(reasons)} of Job {name}")
