"""A throwaway PostgreSQL cluster for tests: Debian's `postgresql` package (`initdb`, `pg_ctl`), in a
temp dir, on a free loopback port, one per test session; each test gets a fresh database.

initdb refuses to run as root, so as root the cluster runs as `nobody`. The server runs with
fsync=off: the durability the tests check is the client's (a coordinator killed with SIGKILL keeps
every write PostgreSQL acknowledged), not the server's disk, which is PostgreSQL's own business.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

USER = "nodus"


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: no /usr/lib/postgresql/*/bin/initdb "
                           "(apt-get install postgresql, as scripts/setup does)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """One running cluster; `database()` creates an empty database and returns its URL."""

    def __init__(self, root: Path, durable: bool = False) -> None:
        self.root = root
        self.durable = durable
        """fsync on (bench/api.py's anchor and its coordinator); the tests run with fsync off."""
        self.bindir = _bindir()
        self.data = root / "data"
        self.port = _free_port()
        self.run_as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    def _run(self, *argv: str) -> None:
        kwargs = {"user": self.run_as.pw_uid, "group": self.run_as.pw_gid} if self.run_as else {}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root,
                              check=False, **kwargs)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        if self.run_as:
            os.chown(self.root, self.run_as.pw_uid, self.run_as.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=300"
                   + ("" if self.durable else " -c fsync=off -c full_page_writes=off"))
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                  "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, dbname: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0".encode())
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    root = Path(tempfile.mkdtemp(prefix="nodus-pg-"))
    cluster = PostgresCluster(root)
    try:
        cluster.start()
        yield cluster
        cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
