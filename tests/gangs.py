"""What the gang test modules share: creating and reading Jobs and their Attempts over REST, and
waiting for a Job with a deadline (the Job's status is printed when the wait fails)."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from conftest import Coordinator, job
from nodus.agent.testing import AgentProcess, wait_for

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
ATTEMPTS = "/apis/nodus.dev/v1/namespaces/default/attempts"
ENDED = ("Succeeded", "Failed", "Cancelled")


def create(c: Coordinator, name: str, **spec: Any) -> dict[str, Any]:
    r = c.session().post(c.url(JOBS), json=job(name, **spec))
    assert r.status_code == 201, r.text
    return r.json()


def get(c: Coordinator, name: str) -> dict[str, Any]:
    r = c.session().get(c.url(f"{JOBS}/{name}"))
    assert r.status_code == 200, r.text
    return r.json()


def attempts(c: Coordinator, name: str) -> list[dict[str, Any]]:
    r = c.session().get(c.url(ATTEMPTS), params={"labelSelector": f"nodus.dev/job={name}"})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def wait_job(c: Coordinator, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float = 120,
             what: str = "", tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """Until `predicate(job)` holds; `tick` runs before each look (a test moving the clock)."""
    def check() -> dict[str, Any] | None:
        if tick is not None:
            tick()
        obj = get(c, name)
        return obj if predicate(obj) else None
    try:
        return wait_for(check, timeout, interval=0.2, what=what or f"Job {name}")
    except AssertionError:
        print(get(c, name).get("status"))
        raise


def ended(c: Coordinator, name: str, timeout: float = 180) -> dict[str, Any]:
    return wait_job(c, name, lambda o: (o.get("status") or {}).get("phase") in ENDED, timeout,
                    what=f"Job {name} to end")


BIN = Path(sys.executable).parent
AGENT_ENV = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
"""Launchers (torchrun, ray, accelerate) resolve from the venv, as on a node where they are installed."""


@contextlib.contextmanager
def fleet(c: Coordinator, root: Path, count: int, prefix: str, *extra: str) -> Iterator[list[AgentProcess]]:
    """`count` real agents on loopback ("nodes" PREFIX-n0…), registered; reaped (workloads too) after."""
    token = (c.data_dir / "join-token").read_text().strip()
    started = [AgentProcess(root / f"n{i}", c.grpc, token, node=f"{prefix}-n{i}", env=AGENT_ENV,
                            extra_args=("--advertise-address", "127.0.0.1", *extra)).start() for i in range(count)]
    try:
        for a in started:
            wait_for(lambda a=a: "registered node" in a.log() or a.proc.poll() is not None, 30,
                     what=f"agent {a.node} to register")
            assert a.proc.poll() is None, f"nodus-agent exited {a.proc.returncode}:\n{a.log()[-3000:]}"
        yield started
    finally:
        for a in started:
            if a.proc is not None:
                a.reap()
