"""A local HTTPS file server for `url` inputs: a directory served on 127.0.0.1 with a self-signed
certificate that an agent trusts by --input-ca-file, so no test reaches outside the machine."""
from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import ssl
import threading
from pathlib import Path


def self_signed(dir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key: DIR/https.crt and DIR/https.key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = dir / "https.crt", dir / "https.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class HttpsFiles:
    """Serves BASE/www over HTTPS in a thread; `ca` is the certificate to trust."""

    def __init__(self, base: Path) -> None:
        self.root = base / "www"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ca, key = self_signed(base)
        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(self.root), **k)  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, name: str, data: bytes) -> tuple[str, str]:
        """Serves `data` as NAME; its url and sha256."""
        (self.root / name).write_bytes(data)
        return f"{self.url}/{name}", hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "HttpsFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
