"""The node's identity: its key and client certificate in WORK_DIR/identity.

The key is made here and never leaves the host (identity/node.key, 0600); the coordinator signs a
certificate for it (Enrol, with the join token, once; Renew, with the certificate, at two thirds of
its life) and every later call goes to the agent port over mTLS with it
(docs/adr/0039-grpc-tls-and-node-identity.md). What the coordinator answered is kept beside it, so
a restarted agent reconnects with its certificate and never needs the join token again while the
certificate lasts.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import orjson

from nodus.v1 import agent_pb2

from .statefile import write_bytes

RENEW_AT = 2 / 3
"""The share of a certificate's life after which the agent renews it."""
X509_TIMEOUT = 60.0
"""Seconds a child doing the X.509 work may take (an interpreter start and an EC key: well under one)."""


class X509Failed(RuntimeError):
    """The X.509 helper could not make a CSR or read the certificate (the Link says so and retries)."""


class X509(Protocol):
    """The X.509 work the node identity needs: in process, or in a short-lived child (nodus.agent.x509)."""

    def csr(self, key_path: Path, node: str) -> str:
        """A CSR naming `node` for the key at `key_path` (made on first use)."""
        ...

    def inspect(self, cert_pem: bytes, ca_pem: bytes) -> tuple[float, float, bool]:
        """(notBefore, notAfter, issued by `ca_pem`) of the certificate."""
        ...


class InProcessX509:
    """For short-lived callers (`nodus-agent install`, benches, tests): cryptography in this process."""

    def csr(self, key_path: Path, node: str) -> str:
        from . import x509

        return x509.csr_for(key_path, node)

    def inspect(self, cert_pem: bytes, ca_pem: bytes) -> tuple[float, float, bool]:
        from . import x509

        return x509.inspect(cert_pem, ca_pem)


class SubprocessX509:
    """For nodus-agent: each operation in a child `python -m nodus.agent.x509`, so the daemon never maps
    cryptography (~8 MB of RSS). Blocking: the Link calls it on a thread."""

    def _run(self, args: list[str], stdin: bytes = b"") -> bytes:
        try:
            done = subprocess.run([sys.executable, "-m", "nodus.agent.x509", *args], input=stdin,
                                  capture_output=True, timeout=X509_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise X509Failed(f"the node identity's X.509 helper ({args[0]}) took over {X509_TIMEOUT:g}s") from None
        if done.returncode:
            raise X509Failed(f"the node identity's X.509 helper ({args[0]}) failed: "
                               f"{done.stderr.decode(errors='replace').strip()[-500:]}")
        return done.stdout

    def csr(self, key_path: Path, node: str) -> str:
        return self._run(["csr", str(key_path), node]).decode()

    def inspect(self, cert_pem: bytes, ca_pem: bytes) -> tuple[float, float, bool]:
        doc = orjson.loads(self._run(["inspect"], orjson.dumps({"cert": cert_pem.decode(), "ca": ca_pem.decode()})))
        return float(doc["notBefore"]), float(doc["notAfter"]), bool(doc["issuedBy"])


def agent_address(coordinator: str, port: int) -> str:
    """The agent port on the host the agent reaches the coordinator at."""
    host = coordinator.rpartition(":")[0] or coordinator
    return f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class Certificate:
    """The node's current certificate as the agent keeps it."""

    pem: bytes
    ca_pem: bytes
    agent_port: int
    not_before: float
    not_after: float
    issued_by_ca: bool
    """Whether `ca_pem` (the CA this agent trusts now) signed it: a coordinator whose data dir was replaced
    has a new CA, and a certificate of the old one is no identity there."""

    def renew_time(self) -> float:
        return self.not_before + (self.not_after - self.not_before) * RENEW_AT


def read_trust_file(path: Path | None) -> bytes | None:
    """A join token or CA file's current bytes (stripped); None when unset, unreadable or empty: the
    agent keeps what it had, so a file being rewritten is never mistaken for a new trust."""
    if path is None:
        return None
    try:
        data = path.read_bytes().strip()
    except OSError:
        return None
    return data or None


class NodeCredentials:
    """WORK_DIR/identity: node.key (0600), node.crt, ca.crt and the agent port."""

    def __init__(self, directory: Path, ca_pem: bytes | None = None, x509: X509 | None = None) -> None:
        self.directory = directory
        self.given_ca = ca_pem
        """--coordinator-ca, which wins over the CA an enrolment answered."""
        self.x509: X509 = x509 if x509 is not None else InProcessX509()

    @property
    def key_path(self) -> Path:
        return self.directory / "node.key"

    def csr(self, node: str) -> str:
        """A CSR for the node's key (made on first use: 0600, in a 0700 directory)."""
        return self.x509.csr(self.key_path, node)

    def load(self) -> Certificate | None:
        try:
            pem = (self.directory / "node.crt").read_bytes()
            meta = orjson.loads((self.directory / "agent.json").read_bytes())
            ca = self.given_ca or (self.directory / "ca.crt").read_bytes()
        except (OSError, ValueError):
            return None
        not_before, not_after, issued = self.x509.inspect(pem, ca)
        return Certificate(pem, ca, int(meta["agentPort"]), not_before, not_after, issued)

    def save(self, answer: agent_pb2.EnrolResponse) -> Certificate:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_bytes(self.directory / "ca.crt", answer.ca_pem.encode())
        write_bytes(self.directory / "agent.json", orjson.dumps({"agentPort": answer.agent_port,
                                                                    "node": answer.node_name}))
        write_bytes(self.directory / "node.crt", answer.certificate_pem.encode())
        loaded = self.load()
        assert loaded is not None
        return loaded

    def forget(self) -> None:
        """Drops the certificate (a revoked or re-admitted one); the key stays the node's."""
        (self.directory / "node.crt").unlink(missing_ok=True)

    def channel_credentials(self, cert: Certificate) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=cert.ca_pem, private_key=self.key_path.read_bytes(),
                                            certificate_chain=cert.pem)
