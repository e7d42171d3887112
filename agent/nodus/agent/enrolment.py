"""The node's identity: its key and client certificate in WORK_DIR/identity.

The key is made here and never leaves the host (identity/node.key, 0600); the coordinator signs a
certificate for it (Enrol, with the join token, once; Renew, with the certificate, at two thirds of
its life) and every later call goes to the agent port over mTLS with it
(docs/adr/0039-grpc-tls-and-node-identity.md). What the coordinator answered is kept beside it, so
a restarted agent reconnects with its certificate and never needs the join token again while the
certificate lasts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nodus.v1 import agent_pb2

RENEW_AT = 2 / 3
"""The share of a certificate's life after which the agent renews it."""


def _write_private(path: Path, data: bytes) -> None:
    """Atomically, mode 0600 from the start (temp file, fsync, rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def csr_pem(key: ec.EllipticCurvePrivateKey, node: str) -> str:
    """A certificate signing request for `key` naming `node`."""
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM).decode()


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


def issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether the node certificate was signed by (one of) the CA(s) in `ca_pem`: a coordinator whose
    data dir was replaced has a new CA, and a certificate of the old one is no identity there."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return False
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):
            continue
    return False


class NodeCredentials:
    """WORK_DIR/identity: node.key (0600), node.crt, ca.crt and the agent port."""

    def __init__(self, directory: Path, ca_pem: bytes | None = None) -> None:
        self.directory = directory
        self.given_ca = ca_pem
        """--coordinator-ca, which wins over the CA an enrolment answered."""

    @property
    def key_path(self) -> Path:
        return self.directory / "node.key"

    def key(self) -> ec.EllipticCurvePrivateKey:
        """The node's key, made on first use."""
        if self.key_path.exists():
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
            if isinstance(key, ec.EllipticCurvePrivateKey):
                return key
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        key = new_key()
        _write_private(self.key_path, key_pem(key))
        return key

    def csr(self, node: str) -> str:
        return csr_pem(self.key(), node)

    def load(self) -> Certificate | None:
        try:
            pem = (self.directory / "node.crt").read_bytes()
            meta = orjson.loads((self.directory / "agent.json").read_bytes())
            ca = self.given_ca or (self.directory / "ca.crt").read_bytes()
        except (OSError, ValueError):
            return None
        cert = x509.load_pem_x509_certificate(pem)
        return Certificate(pem, ca, int(meta["agentPort"]), cert.not_valid_before_utc.timestamp(),
                           cert.not_valid_after_utc.timestamp())

    def save(self, answer: agent_pb2.EnrolResponse) -> Certificate:
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_private(self.directory / "ca.crt", answer.ca_pem.encode())
        _write_private(self.directory / "agent.json", orjson.dumps({"agentPort": answer.agent_port,
                                                                    "node": answer.node_name}))
        _write_private(self.directory / "node.crt", answer.certificate_pem.encode())
        loaded = self.load()
        assert loaded is not None
        return loaded

    def forget(self) -> None:
        """Drops the certificate (a revoked or re-admitted one); the key stays the node's."""
        (self.directory / "node.crt").unlink(missing_ok=True)

    def channel_credentials(self, cert: Certificate) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=cert.ca_pem, private_key=self.key_path.read_bytes(),
                                            certificate_chain=cert.pem)
