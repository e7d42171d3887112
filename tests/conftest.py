"""Fixtures that start real `nodus-coordinator` processes on loopback, the way users run them."""
from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import grpc
import orjson
import pytest
import requests
import yaml

# The OCI registry fixtures (session-scoped: one registry of each kind for the whole run).
from registry import oci_registry, private_oci_registry  # noqa: F401

# Agents started by the suite (and its benches) run attempts as their own user, as before ADR 0040:
# the suite's programs are this venv's interpreter (under /root, 0700 here) writing into pytest's 0700
# directories, which no attempt uid reaches. tests/test_attempt_uids_e2e.py runs agents with the range.
os.environ.setdefault("NODUS_ATTEMPT_UIDS", "off")


BIN = Path(sys.executable).parent


class GrpcAddress(str):
    """A coordinator's gRPC HOST:PORT that also knows how to reach it: `ca` is the CA its TLS
    certificate is verified with (DATA_DIR/tls/ca.crt), None when it runs with --grpc-insecure.
    Agents started on it (agent_double.AgentProcess) take it as --coordinator-ca, centrally."""

    ca: Path | None

    def __new__(cls, address: str, ca: Path | None) -> "GrpcAddress":
        self = super().__new__(cls, address)
        self.ca = ca
        return self


@dataclass
class Coordinator:
    """A running coordinator process and what a client needs to reach it."""

    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    http: str = ""
    grpc: GrpcAddress = GrpcAddress("", None)
    agent_address: str = ""
    """The agents' mTLS port (endpoints.json "agent"); "" on a --grpc-insecure coordinator."""
    token: str = ""
    ca: Path = field(default_factory=Path)
    log: Path = field(default_factory=Path)

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    @property
    def join_token(self) -> str:
        """What a node agent registers with."""
        return (self.data_dir / "join-token").read_text().strip()

    def start(self, http_port: int = 0, grpc_port: int = 0, timeout: float = 30,
              extra_args: tuple[str, ...] = (), host: str = "127.0.0.1") -> "Coordinator":
        """Starts the coordinator listening on `host` (HTTP and gRPC); waits for its endpoints file."""
        (self.data_dir / "endpoints.json").unlink(missing_ok=True)
        self.log = self.data_dir.parent / f"{self.data_dir.name}.log"
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(BIN / "nodus-coordinator"), "--data-dir", str(self.data_dir),
             "--http-listen", f"{host}:{http_port}", "--grpc-listen", f"{host}:{grpc_port}", *extra_args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        endpoints = self.data_dir / "endpoints.json"
        while not endpoints.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"coordinator did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        ep = orjson.loads(endpoints.read_bytes())
        self.http = ep["http"]
        self.grpc = GrpcAddress(ep["grpc"], self.data_dir / "tls" / "ca.crt" if ep.get("grpcTls") else None)
        self.agent_address = ep.get("agent", "")
        config = yaml.safe_load(self.kubeconfig.read_text())
        self.token = config["users"][0]["user"]["token"]
        self.ca = self.data_dir / "ca-for-tests.crt"
        self.ca.write_bytes(base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]))
        return self

    @property
    def grpc_ca(self) -> Path | None:
        """The CA that verifies the gRPC port (None: plaintext, --grpc-insecure)."""
        return self.grpc.ca

    def channel(self) -> grpc.Channel:
        """A gRPC channel to the coordinator, TLS verified with its CA (as agents, nodus and grpcurl connect)."""
        if self.grpc.ca is None:
            return grpc.insecure_channel(self.grpc)
        return grpc.secure_channel(self.grpc, grpc.ssl_channel_credentials(self.grpc.ca.read_bytes()))

    def enrol(self, node: str, key: Any, token: str | None = None) -> Any:
        """AgentService.Enrol as nodus-agent calls it: the join token and a CSR for `key`; the answer."""
        from nodus.agent.x509 import csr_pem
        from nodus.v1 import agent_pb2, agent_pb2_grpc
        with self.channel() as channel:
            return agent_pb2_grpc.AgentServiceStub(channel).Enrol(
                agent_pb2.EnrolRequest(node_name=node, csr_pem=csr_pem(key, node)),
                metadata=(("authorization", f"Bearer {token if token is not None else self.join_token}"),), timeout=10)

    def node_channel(self, node: str, key: Any, token: str | None = None) -> grpc.Channel:
        """A channel to the agent port over mTLS with a certificate for `node` and `key` (enrolled with
        the join token, or `token`); on a --grpc-insecure coordinator, the plaintext port (the join
        token authenticates there)."""
        if self.grpc.ca is None:
            return self.channel()
        from nodus.agent.x509 import key_pem
        answer = self.enrol(node, key, token)
        creds = grpc.ssl_channel_credentials(self.grpc.ca.read_bytes(), key_pem(key), answer.certificate_pem.encode())
        return grpc.secure_channel(self.agent_address, creds)

    def grpcurl_tls(self) -> list[str]:
        """grpcurl's flags for this coordinator's gRPC port: -cacert DATA_DIR/tls/ca.crt, or -plaintext."""
        return ["-plaintext"] if self.grpc.ca is None else ["-cacert", str(self.grpc.ca)]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def session(self, token: str | None = None) -> requests.Session:
        s = requests.Session()
        s.trust_env = False  # else REQUESTS_CA_BUNDLE in the environment replaces our CA
        s.verify = str(self.ca)
        s.headers["Authorization"] = f"Bearer {token if token is not None else self.token}"
        return s

    def url(self, path: str) -> str:
        return self.http + path

    def run(self, *argv: str, check: bool = True, input: str | None = None,
            timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Runs a client tool (kubectl, grpcurl, nodus) from the venv against this coordinator."""
        tool, *rest = argv
        full_env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "NODUS_KUBECONFIG": str(self.kubeconfig),
                    "NODUS_COORDINATOR": self.grpc, "HOME": str(self.data_dir.parent), **(env or {})}
        result = subprocess.run([str(BIN / tool), *rest], capture_output=True, text=True, input=input,
                                timeout=timeout, env=full_env)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                                 f"stderr:\n{result.stderr}")
        return result

    def grpc_token(self, project: str, role: str) -> str:
        out = self.run("nodus", "token", "create", "--project", project, "--role", role)
        return out.stdout.strip()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with Coordinator(tmp_path / "data").start() as c:
        yield c


@pytest.fixture(scope="module")
def shared_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """One coordinator for a module's read-mostly tests (each test uses its own names)."""
    with Coordinator(tmp_path_factory.mktemp("coord") / "data").start() as c:
        yield c


def job(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"command": ["python3", "-c", "print('hi')"]}
    body.update(spec)
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": body}


# -- parallel runs (scripts/test: pytest-xdist, --dist loadgroup) --------------------------------------
# Each module runs whole on one worker (its module-scoped daemons start once). The modules that use the
# host's own network (namespaces, bridges, veths named by slot, nftables), runc pods or the session's
# OCI registries share one group, so none of them runs beside another; so do the tests marked `host` in
# a module that otherwise does not (the benches that run pods or namespaces), and the rest of such a
# module runs on the other worker meanwhile. NOTE: with pytest 9.2 and pytest-xdist 3.8 these groups are
# not in effect: xdist marks a group by rewriting the item's `_nodeid`, which pytest 9.2's structured node
# ids no longer read (pytest-xdist#1386, fix proposed in #1388), so tests are scheduled one by one.
HOST_MODULES = ("test_oci_", "test_netns", "test_gang_netns", "test_image_")


def xdist_group(module: str, host: bool = False) -> str:
    return "host" if host or module.startswith(HOST_MODULES) else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__ if item.module else ""
        item.add_marker(pytest.mark.xdist_group(xdist_group(module, item.get_closest_marker("host") is not None)))


# -- the secret scan (tests/secret_scan.py, ADR 0046) ----------------------------------------------------
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the whole run (in the xdist controller, whose temporary root holds every worker's): no
    log, status or audit record a daemon wrote may hold a test Secret's value."""
    if hasattr(session.config, "workerinput"):
        return
    from secret_scan import MARKER, scan
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    hits = scan(factory.getbasetemp())
    if hits:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"secret scan: a test Secret's value ({MARKER}…) is in {len(hits)} file(s) the daemons wrote:",
                 *(f"  {p}" for p in hits)]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
