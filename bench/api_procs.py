"""bench/api.py's processes: the coordinator (one, or replicas on one store), the anchors' loops (bare
SQLite, bare psycopg, the echo server) and the watch client, each child in a process of its own."""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import time
import multiprocessing as mp
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

import pyspy

BIN = Path(sys.executable).parent
JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
BODY_TARGET = 2048


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process (and its reaped children) from /proc, in seconds; 0 if unreadable."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuMeter:
    """CPU use of some processes over a phase, as % of one core."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = {k: cpu_seconds(p) for k, p in pids.items()}
        self.t0 = time.monotonic()

    def report(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        return ", ".join(f"{k} {100 * (cpu_seconds(p) - self.start[k]) / dt:.0f}%" for k, p in self.pids.items())


def _exit_with_parent() -> None:
    """Child processes: ignore Ctrl-C (the parent cleans up) and die if the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    async def watch_parent() -> None:
        while True:
            await asyncio.sleep(1)
            if os.getppid() != parent:
                os._exit(1)
    return watch_parent  # type: ignore[return-value]


@dataclass
class Coordinator:
    data_dir: Path
    extra: list[str] = field(default_factory=list)
    """More nodus-coordinator flags (--store-url for a replica on PostgreSQL)."""
    proc: subprocess.Popen[bytes] | None = None
    http: str = ""
    token: str = ""
    ca: Path = field(default_factory=Path)
    log: Path = field(default_factory=Path)

    def start(self, timeout: float = 60) -> None:
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(BIN / "nodus-coordinator"), "--data-dir", str(self.data_dir),
             "--http-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--log-level", "WARNING",
             *self.extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        endpoints = self.data_dir / "endpoints.json"
        deadline = time.monotonic() + timeout
        while not endpoints.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"nodus-coordinator exited {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodus-coordinator did not start in {timeout:.0f}s:\n{self.log.read_text()}")
            time.sleep(0.05)
        self.http = orjson.loads(endpoints.read_bytes())["http"]
        config = yaml.safe_load((self.data_dir / "kubeconfig").read_text())
        self.token = config["users"][0]["user"]["token"]
        self.ca = self.data_dir.parent / f"{self.data_dir.name}-ca.crt"
        self.ca.write_bytes(base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]))

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def start_replicas(root: Path, count: int, extra: list[str]) -> list[Coordinator]:
    """`count` coordinators with flags `extra` (one store): the first makes the CA and the vault key,
    the others get copies of both, as docs/adr/0043-leader-lease-and-fencing.md sets replicas up."""
    first = Coordinator(root / "data", list(extra))
    first.start()
    started = [first]
    for i in range(1, count):
        data = root / f"data{i}"
        data.mkdir(mode=0o700)
        shutil.copytree(first.data_dir / "tls", data / "tls")
        shutil.copy2(first.data_dir / "secret.key", data / "secret.key")
        replica = Coordinator(data, list(extra))
        replica.start()
        started.append(replica)
    return started


def stop_process(p: mp.process.BaseProcess | None) -> None:
    if p is None or p.pid is None:
        return
    if p.is_alive():
        p.terminate()
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


# ------------------------------------------------------------------------------------------------
# anchor A: bare SQLite
# ------------------------------------------------------------------------------------------------
def sqlite_anchor(path: Path, seconds: float) -> tuple[float, int]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
    blob = secrets.token_bytes(BODY_TARGET)
    n = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO kv VALUES (?, ?)", (f"k{n:09d}", blob))
        conn.execute("COMMIT")
        n += 1
        if (n & 15) == 0 and time.monotonic() >= end:
            break
    dt = time.monotonic() - t0
    conn.close()
    return n / dt, n


def psycopg_anchor(url: str, seconds: float) -> tuple[float, int]:
    """The PostgreSQL ceiling: one INSERT and COMMIT per ~2 KB row on one connection, synchronous_commit
    on, into a server with fsync on (the durability the coordinator's store asks of it)."""
    import psycopg
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BYTEA NOT NULL)")
        conn.commit()
        durable = [conn.execute(f"SHOW {name}").fetchone()[0] for name in ("fsync", "synchronous_commit")]
        if durable != ["on", "on"]:
            raise RuntimeError(f"the anchor's server is not durable: fsync, synchronous_commit = {durable}")
        blob = secrets.token_bytes(BODY_TARGET)
        n = 0
        t0 = time.monotonic()
        end = t0 + seconds
        while True:
            conn.execute("INSERT INTO kv VALUES (%s, %s)", (f"k{n:09d}", blob))
            conn.commit()
            n += 1
            if (n & 15) == 0 and time.monotonic() >= end:
                break
        dt = time.monotonic() - t0
    return n / dt, n


# ------------------------------------------------------------------------------------------------
# anchor B: the echo server (own process)
# ------------------------------------------------------------------------------------------------
def echo_server_main(cert: str, key: str, conn: Any) -> None:
    parent_watch = _exit_with_parent()

    async def echo(request: web.Request) -> web.Response:
        obj = orjson.loads(await request.read())
        return web.Response(body=orjson.dumps(obj), status=201, content_type="application/json")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/echo", echo)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # as the coordinator's TlsFiles
        ctx.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx, backlog=1024)
        await site.start()
        conn.send(runner.addresses[0][1])
        await parent_watch()

    asyncio.run(serve())


# ------------------------------------------------------------------------------------------------
# watch client (own process)
# ------------------------------------------------------------------------------------------------
def watch_client_main(bases: list[str], token: str, ca: str, watchers: int, rv: str, conn: Any) -> None:
    """`watchers` watch streams from `rv`, watcher w on replica bases[w % len(bases)]."""
    parent_watch = _exit_with_parent()

    async def run() -> None:
        asyncio.create_task(parent_watch())
        ctx = ssl.create_default_context(cafile=ca)
        arrivals: list[dict[str, float]] = [{} for _ in range(watchers)]
        other: Counter[str] = Counter()
        errors: list[str] = []
        opened = asyncio.Semaphore(0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=30)
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=ctx), timeout=timeout,
                headers={"Authorization": f"Bearer {token}"}) as session:

            async def one(w: int) -> None:
                got = arrivals[w]
                try:
                    async with session.get(f"{bases[w % len(bases)]}{JOBS}", params={"watch": "true", "resourceVersion": rv}) as r:
                        if r.status != 200:
                            errors.append(f"watcher {w}: HTTP {r.status} {(await r.read())[:300]!r}")
                            opened.release()
                            return
                        opened.release()
                        async for line in r.content:
                            t = time.monotonic()
                            if not line.strip():
                                continue
                            ev = orjson.loads(line)
                            if ev.get("type") == "ADDED":
                                got.setdefault(ev["object"]["metadata"]["name"], t)
                            else:
                                other[ev.get("type", "?")] += 1
                                if ev.get("type") == "ERROR" and len(errors) < 5:
                                    errors.append(f"watcher {w}: ERROR event {line[:300]!r}")
                        errors.append(f"watcher {w}: stream ended by the server")
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - reported
                    errors.append(f"watcher {w}: {e!r}")
                    opened.release()

            tasks = [asyncio.create_task(one(w)) for w in range(watchers)]
            t0 = time.monotonic()
            for _ in range(watchers):
                await opened.acquire()
            conn.send(("ready", time.monotonic() - t0, list(errors)))
            loop = asyncio.get_running_loop()
            names, wait_s = await loop.run_in_executor(None, conn.recv)
            want = set(names)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if all(want.issubset(a.keys()) for a in arrivals):
                    break
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        result = [{n: a[n] for n in want if n in a} for a in arrivals]
        conn.send(("done", result, dict(other), errors))

    asyncio.run(run())


def profile(args: argparse.Namespace, servers: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """With --py-spy DIR: `py-spy record --gil` of each coordinator over the create phase (collapsed stacks in
    DIR/api-creates-<server>.txt; bench/pyspy.py)."""
    return pyspy.record(args.py_spy, {f"api-creates-{name.replace(' ', '-')}.txt": pid for name, pid in servers.items()},
                        rate=200)


unprofile = pyspy.stop
