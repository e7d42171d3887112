"""nodus-agent does its X.509 work (the node key, CSRs, reading its certificate) in a short-lived child,
`python -m nodus.agent.x509`, so the daemon never loads cryptography. The child's answers must be
the in-process ones, and a failing child must surface as X509Failed (the Link reports it and retries)."""
from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509 as cx509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from httpsfiles import self_signed

from nodus.agent.enrolment import InProcessX509, SubprocessX509, X509Failed


def _ca(dir: Path) -> tuple[ec.EllipticCurvePrivateKey, cx509.Certificate, bytes]:
    """A self-signed CA (tests/httpsfiles.py's), its key and its PEM."""
    dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = self_signed(dir)
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    pem = cert_path.read_bytes()
    return key, cx509.load_pem_x509_certificate(pem), pem


def _sign(csr_pem: str, ca_key: ec.EllipticCurvePrivateKey, ca: cx509.Certificate, hours: int) -> bytes:
    csr = cx509.load_pem_x509_csr(csr_pem.encode())
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    cert = (cx509.CertificateBuilder().subject_name(csr.subject).issuer_name(ca.subject)
            .public_key(csr.public_key()).serial_number(cx509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(hours=hours)).sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_the_child_makes_the_node_key_private_and_answers_as_the_in_process_code_does(tmp_path: Path) -> None:
    key_path = tmp_path / "identity" / "node.key"
    csr = SubprocessX509().csr(key_path, "node-7")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path.parent.stat().st_mode) == 0o700
    request = cx509.load_pem_x509_csr(csr.encode())
    assert request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-7"
    assert request.is_signature_valid
    # a second CSR is for the same key: the key is made once
    again = cx509.load_pem_x509_csr(SubprocessX509().csr(key_path, "node-7").encode())
    assert again.public_key() == request.public_key()

    ca_key, ca, ca_pem = _ca(tmp_path / "ca")
    cert = _sign(csr, ca_key, ca, hours=6)
    child = SubprocessX509().inspect(cert, ca_pem)
    assert child == InProcessX509().inspect(cert, ca_pem)
    not_before, not_after, issued = child
    assert issued and not_after - not_before == 6 * 3600

    _, _, other_ca_pem = _ca(tmp_path / "other-ca")  # a replaced coordinator's CA did not sign it
    assert SubprocessX509().inspect(cert, other_ca_pem)[2] is False


def test_a_failing_child_is_an_x509_failure_that_says_what_failed() -> None:
    with pytest.raises(X509Failed, match=r"X\.509 helper \(inspect\) failed: .*"):
        SubprocessX509().inspect(b"not a certificate", b"not a CA")
