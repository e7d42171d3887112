"""moto's S3 in server mode on a loopback port, for the tests that talk to S3 over HTTP (boto3 in
the test, in the agent, in the CLI). It accepts any keys; `env` adds moto settings (for example
S3_UPLOAD_PART_MIN_SIZE) and keys."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests

from agent_double import free_port

BIN = Path(sys.executable).parent


@contextlib.contextmanager
def moto_server(log_dir: Path, env: dict[str, str] | None = None, timeout: float = 30) -> Iterator[str]:
    """Starts moto_server, yields its endpoint URL once it answers, stops it on exit."""
    port = free_port()
    log = log_dir / "moto.log"
    exe = BIN / "moto_server"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                requests.get(f"{endpoint}/moto-api/", timeout=1)
                break
            except requests.RequestException:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start:\n{log.read_text(errors='replace')}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
