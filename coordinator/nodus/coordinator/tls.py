"""The coordinator's TLS material, for the REST gateway and the gRPC port alike.

kubectl sends bearer tokens only over HTTPS, and the gRPC port carries tokens, join tokens and the
Secret values inside Assignments, so both speak TLS (docs/adr/0039-grpc-tls-and-node-identity.md).
On first start the coordinator makes a private CA and a serving certificate signed by it in
DATA_DIR/tls (like k3s); the kubeconfig it writes carries the CA, agents take it as
--coordinator-ca. A later start that listens under a name the certificate lacks re-issues the
serving certificate from the same CA. An operator may bring a certificate instead.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None
    """The CA that signed `cert`, when the coordinator made it (goes into the kubeconfig)."""

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx

    def key_pair(self) -> tuple[bytes, bytes]:
        """(private key PEM, certificate chain PEM), as gRPC's server credentials take them."""
        return self.key.read_bytes(), self.cert.read_bytes()


def grpc_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """The gRPC port's TLS: the same serving certificate as REST."""
    return grpc.ssl_server_credentials([files.key_pair()])


def agent_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """The agent port's mTLS: the data dir's serving certificate, and a client certificate the same CA
    signed required of every caller (the node certificates enrol.py issues)."""
    assert files.ca is not None
    return grpc.ssl_server_credentials([files.key_pair()], root_certificates=files.ca.read_bytes(),
                                       require_client_auth=True)


def write_private(path: Path, data: bytes) -> None:
    """Writes a secret file atomically (temp file, fsync, rename) with mode 0600 from the start."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _names(extra_hosts: list[str]) -> list[x509.GeneralName]:
    """The serving certificate's SANs: localhost, the host name, the loopbacks and every listen host
    (an unspecified address such as 0.0.0.0 names no host and is left out)."""
    hosts = {"localhost", socket.gethostname(), *extra_hosts}
    ips = {"127.0.0.1", "::1"}
    names: list[x509.GeneralName] = []
    for h in sorted(hosts):
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            if h:
                names.append(x509.DNSName(h))
            continue
        if not ip.is_unspecified:
            ips.add(str(ip))
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(ips)]
    return names


def _covers(cert_path: Path, wanted: list[x509.GeneralName]) -> bool:
    """The certificate at `cert_path` names every one of `wanted`."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        have = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return False
    return set(wanted) <= have


def ensure_tls(data_dir: Path, extra_hosts: list[str]) -> TlsFiles:
    """Creates DATA_DIR/tls/{ca,tls}.{crt,key} once; later starts reuse them, re-issuing the serving
    certificate (same CA) when a listen host is not among its names."""
    tls_dir = data_dir / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(tls_dir / "tls.crt", tls_dir / "tls.key", tls_dir / "ca.crt")
    names = _names(extra_hosts)
    assert files.ca is not None
    if files.cert.exists() and files.key.exists() and files.ca.exists():
        if _covers(files.cert, names) or not (tls_dir / "ca.key").exists():
            return files
        ca = CertificateAuthority.load(tls_dir)
        _write_serving(files, ca.cert, ca.key, names)
        return files
    now = datetime.now(timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodus-coordinator-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write_private(tls_dir / "ca.key", _key_pem(ca_key))
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_serving(files, ca_cert, ca_key, names)
    return files


def _write_serving(files: TlsFiles, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                   names: list[x509.GeneralName]) -> None:
    now = datetime.now(timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodus-coordinator")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write_private(files.key, _key_pem(key))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """The CA in DATA_DIR/tls: it signed the serving certificate and signs the nodes' client certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def load(cls, tls_dir: Path) -> "CertificateAuthority":
        key = serialization.load_pem_private_key((tls_dir / "ca.key").read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{tls_dir / 'ca.key'} is not an EC private key")
        return cls(x509.load_pem_x509_certificate((tls_dir / "ca.crt").read_bytes()), key)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)
