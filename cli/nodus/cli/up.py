"""`nodus up`: the development all-in-one — a coordinator and one local agent on loopback.

Embedded SQLite, the process runtime, HTTPS REST and TLS gRPC on loopback (the agent verifies the
coordinator with its DATA_DIR/tls/ca.crt, as anywhere else); it prints the kubeconfig to
use and stays in the foreground until Ctrl-C (or SIGTERM), then stops both daemons.

It is one person's machine: the local agent runs attempts as the user who ran `nodus up`
(`--attempt-uids off`), so a Job may use the same interpreter and files as its user, wherever the
checkout lives (under /root too). `--attempt-uids START:COUNT` gives each attempt its own uid, as a
shared host installed with systemd does (ADR 0040).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import cast
from pathlib import Path

from .client import CliError


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise CliError(f"the coordinator exited with {proc.returncode}; its log: {log}",
                           "check the log; another process may hold the ports (--http-listen/--grpc-listen)")
        if time.monotonic() > deadline:
            raise CliError(f"the coordinator did not start within {timeout:.0f}s; its log: {log}")
        time.sleep(0.05)


def _banner(node: str, data: Path, kubeconfig: Path, endpoints: dict[str, str]) -> str:
    """What `nodus up` prints once both daemons run: where they listen, the admin token, and what to type next."""
    import yaml
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return "\n".join((
        f"nodus up: coordinator and agent {node!r} running (logs in {data})",
        f"  REST  {endpoints['http']}   gRPC  {endpoints['grpc']}",
        f"  admin token: {token}",
        "next:",
        f"  export KUBECONFIG={kubeconfig}",
        "  nodus apply -f examples/job.yaml && nodus watch job hello",
        "  nodus get jobs                      (or: kubectl get jobs.nodus.dev)",
        "  nodus logs -f hello",
        f"  grpcurl -cacert {kubeconfig.parent / 'tls' / 'ca.crt'} -H 'authorization: Bearer {token}' "
        f"{endpoints['grpc']} list",
        "Ctrl-C stops both daemons.",
    ))


def cmd_up(args: argparse.Namespace) -> int:
    data = Path(args.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    (data / "endpoints.json").unlink(missing_ok=True)
    coord_log, agent_log = data / "coordinator.log", data / "agent.log"
    price_book = ["--price-book", str(Path(args.price_book).resolve())] if args.price_book else []
    node_flags = [flag for name, value in (("--offering", args.offering), ("--simulate-gpus", args.simulate_gpus))
                  if value for flag in (name, value)]
    coordinator = subprocess.Popen(
        [str(bin_dir / "nodus-coordinator"), "--data-dir", str(data / "coordinator"),
         "--http-listen", args.http_listen, "--grpc-listen", args.grpc_listen, *price_book],
        stdout=open(coord_log, "ab"), stderr=subprocess.STDOUT)
    procs = [coordinator]
    try:
        _wait_for(data / "coordinator" / "endpoints.json", coordinator, coord_log)
        import orjson
        endpoints = orjson.loads((data / "coordinator" / "endpoints.json").read_bytes())
        grpc = endpoints["grpc"]
        agent = subprocess.Popen(
            [str(bin_dir / "nodus-agent"), "--coordinator", grpc, "--node", args.node,
             "--work-dir", str(data / "agent"), "--join-token-file", str(data / "coordinator" / "join-token"),
             "--coordinator-ca", str(data / "coordinator" / "tls" / "ca.crt"), "--runtime", "process",
             "--attempt-uids", args.attempt_uids, *node_flags],
            stdout=open(agent_log, "ab"), stderr=subprocess.STDOUT)
        procs.append(agent)
        kubeconfig = data / "coordinator" / "kubeconfig"
        print(_banner(args.node, data, kubeconfig, endpoints), flush=True)
        stop = {"now": False}

        def _stop(*_: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        while not stop["now"]:
            for p in procs:
                if p.poll() is not None:
                    raise CliError(f"{Path(str(cast(list[str], p.args)[0])).name} exited with {p.returncode}; logs in {data}")
            time.sleep(0.2)
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def add_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="run a coordinator and a local agent on loopback (development)")
    up.add_argument("--data-dir", default=os.environ.get("NODUS_UP_DIR", ".nodus"),
                    help="where both keep their state (default ./.nodus)")
    up.add_argument("--http-listen", default="127.0.0.1:8080")
    up.add_argument("--grpc-listen", default="127.0.0.1:7070")
    up.add_argument("--node", default="local")
    up.add_argument("--price-book", help="price book YAML for the coordinator (default: none, nothing is charged)")
    up.add_argument("--offering", help="offering id the local agent joins as (it must fit the price book's)")
    up.add_argument("--simulate-gpus", metavar="MODEL:COUNT[:MEMORY]",
                    help="the local agent reports these GPUs, marked simulated, instead of real ones")
    up.add_argument("--attempt-uids", default="off", metavar="START:COUNT|off",
                    help="uids the local agent runs attempts under, one each (default off: as your own user)")
    up.set_defaults(func=cmd_up, operator=True)
