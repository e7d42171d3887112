"""Three coordinator replicas on one PostgreSQL (docs/adr/0043-leader-lease-and-fencing.md): one leads
the controllers, every one serves the API, and `kill -9` of the leader during a burst of creates hands
the lease to another replica without losing an acknowledged create or creating an Attempt twice; with
two agents connected to the followers, Jobs running across the kill keep running and finish, and a
REST watch through a surviving replica sees every write to the Jobs once.

No blobs: the Jobs write no outputs or checkpoints (several replicas need --blob-url s3://… for those).
"""
from __future__ import annotations

import collections
import signal
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import requests
from conftest import Coordinator, job
from e2e import AGENT_ENV, attempts_of, joined, wait_status
from agent_double import AgentProcess
from postgres import postgres_cluster  # noqa: F401 - the session fixture
from test_durability import Watcher, list_rv, wait_for

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
ATTEMPTS = "/apis/nodus.dev/v1/namespaces/default/attempts"
LEASE = ("--leader-lease", "3s", "--leader-renew-interval", "1s")

pytestmark = pytest.mark.slow


def status(c: Coordinator) -> dict[str, str]:
    """/readyz?verbose as a dict ({} when the replica does not answer)."""
    try:
        r = c.session().get(c.url("/readyz?verbose"), timeout=5)
    except requests.RequestException:
        return {}
    lines = [line.split(": ", 1) for line in r.text.splitlines() if ": " in line]
    return {k: v for k, v in lines}


def replicas(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, n: int) -> list[Coordinator]:
    """n replicas on `url`: the first makes the CA and the vault key, the others get copies (ADR 0043)."""
    monkeypatch.setenv("NODUS_STORE_URL", url)
    first = Coordinator(tmp_path / "r0").start(extra_args=LEASE)
    started = [first]
    for i in range(1, n):
        data = tmp_path / f"r{i}"
        data.mkdir(mode=0o700)
        shutil.copytree(first.data_dir / "tls", data / "tls")
        shutil.copy2(first.data_dir / "secret.key", data / "secret.key")
        started.append(Coordinator(data).start(extra_args=LEASE))
    return started


def test_kill_9_of_the_leader_during_a_burst_hands_over_and_loses_nothing(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    a, b, c = replicas(tmp_path, url, monkeypatch, 3)
    try:
        wait_for(lambda: [status(r).get("role") for r in (a, b, c)] == ["leader", "follower", "follower"], 30,
                 "the first replica leading, the others following")
        assert {status(r)["epoch"] for r in (a, b, c)} == {"1"}
        assert status(b)["leader"] == status(a)["holder"]

        answered: dict[str, str] = {}
        lock = threading.Lock()
        unexpected: list[str] = []
        stop = threading.Event()

        def burst(worker: int, replica: Coordinator) -> None:
            s = replica.session()
            for i in range(100000):
                if stop.is_set():
                    return
                name = f"b-{worker}-{i}"
                r = s.post(replica.url(JOBS), json=job(name), timeout=30)
                if r.status_code == 201:
                    with lock:
                        answered[name] = r.json()["metadata"]["uid"]
                else:
                    unexpected.append(f"{name}: {r.status_code} {r.text}")
                    return

        threads = [threading.Thread(target=burst, args=(w, (b, c)[w % 2]), daemon=True) for w in range(8)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: len(answered) >= 100 or bool(unexpected), 90, "100 answered creates", 0.01)
            killed = time.monotonic()
            a.kill()  # the leader, mid-burst; the survivors keep answering
            wait_for(lambda: "leader" in (status(b).get("role"), status(c).get("role")), 30, "a new leader")
            took = time.monotonic() - killed
            wait_for(lambda: len(answered) >= 300 or bool(unexpected), 90, "300 answered creates", 0.01)
        finally:
            stop.set()
            for t in threads:
                t.join(40)
        assert not unexpected, unexpected[:5]
        roles = sorted(status(r)["role"] for r in (b, c))
        assert roles == ["follower", "leader"]
        wait_for(lambda: {status(r).get("epoch") for r in (b, c)} == {"2"}, 10, "both survivors to see epoch 2")
        print(f"takeover after kill -9: {took:.2f}s (lease 3s, renew interval 1s)")

        # Every create answered 201 is there once; each Job gets exactly one Attempt, from one leader.
        session = c.session()
        items = session.get(c.url(JOBS)).json()["items"]
        stored = {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}
        assert len(stored) == len(items)
        missing = sorted(set(answered) - set(stored))
        assert not missing, missing[:10]
        assert all(stored[n] == uid for n, uid in answered.items())

        def attempts_per_job() -> collections.Counter[str]:
            listed = session.get(c.url(ATTEMPTS)).json()["items"]
            return collections.Counter(str(att["spec"]["job"]) for att in listed)
        wait_for(lambda: set(attempts_per_job()) >= set(stored), 60, "an Attempt for every Job")
        twice = {name: n for name, n in attempts_per_job().items() if n != 1}
        assert not twice, f"Jobs with more than one Attempt: {dict(list(twice.items())[:10])}"

        # The store's log: the new leader's writes carry epoch 2, and epoch 1's stopped before them.
        with psycopg.connect(url) as conn:
            first_2 = conn.execute("SELECT min(revision) FROM log WHERE epoch = 2").fetchone()
            late_1 = conn.execute("SELECT count(*) FROM log WHERE epoch = 1 AND revision > %s",
                                  (first_2[0] if first_2 else 0,)).fetchone()
        assert first_2 is not None and first_2[0] is not None
        assert late_1 == (0,)
    finally:
        for r in (a, b, c):
            r.kill()


class Burst:
    """Creates Jobs through the given replicas from several threads, recording each 201's uid."""

    def __init__(self, targets: list[Coordinator], workers: int = 8, **spec: Any) -> None:
        self.answered: dict[str, str] = {}
        self.unexpected: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._spec = spec
        self._threads = [threading.Thread(target=self._run, args=(w, targets[w % len(targets)]), daemon=True)
                         for w in range(workers)]

    def _run(self, worker: int, replica: Coordinator) -> None:
        s = replica.session()
        for i in range(100000):
            if self._stop.is_set():
                return
            name = f"b-{worker}-{i}"
            r = s.post(replica.url(JOBS), json=job(name, **self._spec), timeout=30)
            if r.status_code != 201:
                self.unexpected.append(f"{name}: {r.status_code} {r.text}")
                return
            with self._lock:
                self.answered[name] = r.json()["metadata"]["uid"]

    def __enter__(self) -> "Burst":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """No new creates (those in flight still get their answers)."""
        self._stop.set()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)

    def until(self, count: int) -> None:
        wait_for(lambda: len(self.answered) >= count or bool(self.unexpected), 90, f"{count} answered creates", 0.01)
        assert not self.unexpected, self.unexpected[:5]


def test_jobs_running_on_agents_of_the_followers_finish_across_kill_9_of_the_leader(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    a, b, c = replicas(tmp_path, url, monkeypatch, 3)
    agents = [AgentProcess(tmp_path / f"n{i}", r.grpc, r.join_token, node=f"rep-n{i}", env=AGENT_ENV,
                           extra_args=("--advertise-address", "127.0.0.1")).start() for i, r in enumerate((b, c))]
    watcher = Watcher(c, list_rv(c))  # through a replica that survives, from before every write below
    watcher.start()
    try:
        with joined(agents):
            wait_for(lambda: status(a).get("role") == "leader", 30, "the first replica leading")
            sleeper = ["python3", "-c", "import time; time.sleep(6); print('done')"]
            running = [f"run-{i}" for i in range(4)]
            for i, name in enumerate(running):
                r = (b, c)[i % 2].session().post((b, c)[i % 2].url(JOBS), json=job(name, command=sleeper))
                assert r.status_code == 201, r.text
            for name in running:
                wait_status(c, name, lambda s: s.get("phase") == "Running", 60, f"{name} running")
            before = {name: [att["metadata"]["uid"] for att in attempts_of(c, name)] for name in running}
            assert all(len(uids) == 1 for uids in before.values()), before
            assert {att["spec"]["node"] for name in running for att in attempts_of(c, name)} <= {"rep-n0", "rep-n1"}

            with Burst([b, c], state="Suspended") as burst:  # creates only: Suspended Jobs get no Attempt
                burst.until(50)
                killed = time.monotonic()
                a.kill()
                wait_for(lambda: "leader" in (status(b).get("role"), status(c).get("role")), 30, "a new leader")
                took = time.monotonic() - killed
                burst.until(150)
            print(f"takeover after kill -9 with two agents: {took:.2f}s (lease 3s, renew interval 1s)")
            wait_for(lambda: {status(r).get("epoch") for r in (b, c)} == {"2"}, 10, "both survivors to see epoch 2")

            for name in running:  # the same attempts, never replaced, finish
                wait_status(c, name, lambda s: s.get("phase") == "Succeeded", 90, f"{name} to succeed")
                assert [att["metadata"]["uid"] for att in attempts_of(c, name)] == before[name]

            items = c.session().get(c.url(JOBS)).json()["items"]
            stored = {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}
            assert len(stored) == len(items) == len(burst.answered) + len(running)
            assert all(stored.get(n) == uid for n, uid in burst.answered.items())
            listed = c.session().get(c.url(ATTEMPTS)).json()["items"]
            per_job = collections.Counter(str(att["spec"]["job"]) for att in listed)
            assert per_job == collections.Counter({name: 1 for name in running})

            # The watch through c saw every write to the Jobs, each once, in order.
            with psycopg.connect(url) as conn:
                # Both agents' heartbeats, written through the followers, kept their nodes' leases alive
                # for the new leader's lease controller.
                for node in ("rep-n0", "rep-n1"):
                    row = conn.execute("SELECT value FROM kv WHERE key = %s", (f"_leases/{node}",)).fetchone()
                    assert row is not None and orjson.loads(row[0]).get("expired") is False, row
                head = conn.execute("SELECT max(revision) FROM log WHERE key LIKE 'jobs/default/%'").fetchone()
                assert head is not None
                wait_for(lambda: watcher.last_rv >= head[0], 30, "the watch to catch up")
                logged = [row[0] for row in conn.execute(
                    "SELECT revision FROM log WHERE key LIKE 'jobs/default/%%' AND revision > %s AND revision <= %s "
                    "ORDER BY revision", (watcher.events[0].rv - 1 if watcher.events else 0, head[0]))]
            seen = [e.rv for e in watcher.events if e.rv <= head[0]]
            assert not watcher.errors, watcher.errors
            assert seen == logged, f"{len(seen)} events seen, {len(logged)} written"
    finally:
        watcher.stopping.set()
        for r in (a, b, c):
            r.kill()


def test_a_leader_frozen_and_cut_off_from_postgresql_commits_nothing_after_the_takeover(
        tmp_path: Path, postgres_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    url = postgres_cluster.database()
    a, b = replicas(tmp_path, url, monkeypatch, 2)
    assert a.proc is not None
    try:
        wait_for(lambda: [status(r).get("role") for r in (a, b)] == ["leader", "follower"], 30, "a leading")
        with Burst([a], workers=4) as burst:  # a's controllers busy creating their Attempts
            burst.until(40)
            a.proc.send_signal(signal.SIGSTOP)  # a still believes it leads, with its decisions in flight
            burst.stop()
            with psycopg.connect(postgres_cluster.url("postgres"), autocommit=True) as admin:
                killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE application_name = %s", (f"nodus-coordinator pid={a.proc.pid}",)
                                       ).fetchone()
            assert killed is not None and killed[0] >= 2
            wait_for(lambda: status(b).get("role") == "leader", 30, "b to take over")
            assert status(b)["epoch"] == "2"
            names = [f"after-{i}" for i in range(20)]
            for name in names:  # Jobs a's controllers have not seen: on waking, a's cache hands them over
                assert b.session().post(b.url(JOBS), json=job(name)).status_code == 201
            a.proc.send_signal(signal.SIGCONT)  # the burst's requests held by the frozen a are answered now
        wait_for(lambda: status(a).get("role") == "follower", 30, "a to notice it lost the lease")
        wait_for(lambda: status(a).get("epoch") == "2", 10, "a to see epoch 2")
        assert status(a)["leader"] == status(b)["holder"]
        lost = [line for line in a.session().get(a.url("/metrics")).text.splitlines()
                if line.startswith('nodus_leader_lease_changes_total{change="lost"}')]
        assert lost == ['nodus_leader_lease_changes_total{change="lost"} 1.0'], lost

        def attempts() -> collections.Counter[str]:
            listed = b.session().get(b.url(ATTEMPTS)).json()["items"]
            return collections.Counter(str(att["spec"]["job"]) for att in listed)
        names += list(burst.answered)
        wait_for(lambda: set(attempts()) >= set(names), 60, "an Attempt for every Job")
        assert all(n == 1 for n in attempts().values()), attempts()
        with psycopg.connect(url) as conn:
            first_2 = conn.execute("SELECT min(revision) FROM log WHERE epoch = 2").fetchone()
            assert first_2 is not None and first_2[0] is not None
            late_1 = conn.execute("SELECT count(*) FROM log WHERE epoch = 1 AND revision > %s", (first_2[0],)).fetchone()
        assert late_1 == (0,)
        # Whether a's controllers tried a write before its next claim told it is a race; when they did,
        # the store refused it (LeaderDeposed) and nothing of epoch 1 landed after epoch 2 began (above).
        refused = a.log.read_text().count("another replica leads now, so this controller write was refused")
        print(f"controller writes of the deposed a refused by the store (LeaderDeposed): {refused}")
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        for r in (a, b):
            r.kill()
