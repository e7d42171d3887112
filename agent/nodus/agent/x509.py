"""The node identity's X.509 work: its key, its certificate signing requests, and reading a certificate.

The only agent module that imports `cryptography`. nodus-agent runs it in a short-lived child process
(`python -m nodus.agent.x509 csr|inspect`, through enrolment.SubprocessX509) at enrolment, at renewal
and once at start, so the long-lived daemon never maps cryptography's ~8 MB library (issue 17: an
idle agent within 60 MB of RSS). Short-lived callers (`nodus-agent install`, benches, tests) call the
functions in process.

    python -m nodus.agent.x509 csr KEY_PATH NODE     -> the CSR's PEM on stdout (KEY_PATH made if missing)
    python -m nodus.agent.x509 inspect               <- {"cert": PEM, "ca": PEM} on stdin
                                                     -> {"notBefore": s, "notAfter": s, "issuedBy": bool}
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .statefile import write_bytes


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


def node_key(key_path: Path) -> ec.EllipticCurvePrivateKey:
    """The node's key at `key_path`, made (0600, in a 0700 directory) on first use."""
    if key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
    key_path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(key_path.parent, 0o700)
    key = new_key()
    write_bytes(key_path, key_pem(key))  # 0600 from the start
    return key


def csr_for(key_path: Path, node: str) -> str:
    return csr_pem(node_key(key_path), node)


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


def inspect(cert_pem: bytes, ca_pem: bytes) -> tuple[float, float, bool]:
    """(notBefore, notAfter as epoch seconds, issued by `ca_pem`)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return (cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp(),
            issued_by(cert_pem, ca_pem))


def main(argv: list[str]) -> int:
    if argv[:1] == ["csr"] and len(argv) == 3:
        sys.stdout.write(csr_for(Path(argv[1]), argv[2]))
        return 0
    if argv == ["inspect"]:
        doc = orjson.loads(sys.stdin.buffer.read())
        not_before, not_after, by = inspect(doc["cert"].encode(), doc["ca"].encode())
        sys.stdout.buffer.write(orjson.dumps({"notBefore": not_before, "notAfter": not_after, "issuedBy": by}))
        return 0
    print("usage: python -m nodus.agent.x509 csr KEY_PATH NODE | inspect < {\"cert\": PEM, \"ca\": PEM}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
