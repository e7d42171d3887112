"""Node identity: enrolment with the join token, short-lived client certificates, revocation.

As a kubelet's TLS bootstrap: a host holding the join token enrols once, sending a certificate
signing request for a key that never leaves it; the coordinator's CA (DATA_DIR/tls) signs a client
certificate whose common name is the node's name and whose organizational unit names the enrolment.
From then on the node calls the agent port over mTLS, and the node's name is the certificate's.

An enrolment is `_enrolments/<name>` in the store: the enrolment id, the SHA-256 of the key it was
issued for, the current certificate's expiry, and whether an operator revoked it. A name another
key enrolled is refused to every other holder of the join token (NodeEnrolled) until an operator
re-admits it (the record is deleted); the same key may enrol again (an agent whose certificate ran
out while it was down). A certificate counts only while its enrolment exists under its name with its
id and is not revoked, so a revocation, or a re-admission that a new holder took, refuses every
certificate issued before it at once.
"""
from __future__ import annotations

import functools
import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .clock import Clock, rfc3339
from .errors import NodusError
from .identity import Identity
from .store.base import Store
from .tls import CertificateAuthority, write_private

PREFIX = "_enrolments/"
_OU = "enrolment:"
_CHECK_SECONDS = 2.0
"""How long a certificate's check against its enrolment is reused; this replica's own revocations and
re-admissions clear it at once (as identity.py caches tokens)."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A node certificate just signed."""

    node: str
    certificate_pem: bytes
    ca_pem: bytes
    expire: float


@dataclass(frozen=True, slots=True)
class Peer:
    """The node a verified client certificate names."""

    node: str
    enrolment: str


@functools.lru_cache(maxsize=4096)
def peer_of(pem: bytes) -> Peer | None:
    """The node and enrolment a (TLS-verified) client certificate names; None for a certificate that
    is not a node certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    enrolment = next((u[len(_OU):] for u in units if u.startswith(_OU)), "")
    if not names or not enrolment:
        return None
    return Peer(str(names[0].value), enrolment)


def _key_digest(csr: x509.CertificateSigningRequest) -> str:
    der = csr.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _csr(pem: str) -> x509.CertificateSigningRequest:
    try:
        csr = x509.load_pem_x509_csr(pem.encode())
    except ValueError as e:
        raise NodusError("BadRequest", f"csr_pem is not a PEM certificate signing request: {e}",
                         fix="send the CSR of the node's key (nodus-agent makes it)") from None
    if not csr.is_signature_valid:
        raise NodusError("BadRequest", "the CSR's signature does not verify", fix="sign the CSR with the node's key")
    return csr


class Enrolments:
    """Issues, renews, checks and revokes node certificates."""

    def __init__(self, store: Store, identity: Identity, ca: CertificateAuthority, clock: Clock,
                 lifetime: float, join_token_file: Path | None = None) -> None:
        self.store, self.identity, self.ca, self.clock, self.lifetime = store, identity, ca, clock, lifetime
        self.join_token_file = join_token_file
        self._checked: dict[Peer, tuple[float, dict[str, Any]]] = {}
        """Where the coordinator keeps the current join token for its operators (DATA_DIR/join-token)."""

    async def record(self, node: str) -> dict[str, Any] | None:
        rec = await self.store.get(PREFIX + node)
        return None if rec is None else dict(orjson.loads(rec.value))

    async def records(self) -> dict[str, dict[str, Any]]:
        result = await self.store.list(PREFIX)
        return {r.key[len(PREFIX):]: dict(orjson.loads(r.value)) for r in result.records}

    async def _write(self, node: str, doc: dict[str, Any]) -> None:
        self._forget(node)
        rec = await self.store.get(PREFIX + node)
        if rec is None:
            await self.store.create(PREFIX + node, orjson.dumps(doc))
        else:
            await self.store.update(PREFIX + node, orjson.dumps(doc), rec.revision)

    # -- the node's side --------------------------------------------------------------------------
    async def enrol(self, authorization: str | None, node: str, csr_pem: str) -> Issued:
        """The join token's one use: a certificate for `node`, unless another key holds the name."""
        join_token_id = await self.identity.verify_join_token(authorization)
        if not node:
            raise NodusError("BadRequest", "node_name is required", fix="start the agent with --node NAME")
        csr = _csr(csr_pem)
        digest = _key_digest(csr)
        current = await self.record(node)
        if current is not None and current.get("revoked"):
            raise NodusError("NodeRevoked", f'node "{node}" was revoked and cannot enrol again',
                             name=node, kind="nodes", fix=f"an operator re-admits it: nodus node readmit {node}")
        if current is not None and current.get("keySha256") != digest:
            raise NodusError("NodeEnrolled", f'node "{node}" is enrolled with another key; the join token cannot '
                             f'take an enrolled name', name=node, kind="nodes",
                             fix=f"start this host under another --node, or have an operator re-admit the name: "
                                 f"nodus node readmit {node}")
        enrolment = current["id"] if current is not None else secrets.token_hex(8)
        issued = self._sign(node, enrolment, csr)
        now = self.clock.now()
        await self._write(node, {**(current or {}), "name": node, "id": enrolment, "keySha256": digest,
                                 "enrolTime": (current or {}).get("enrolTime") or rfc3339(now),
                                 "renewTime": rfc3339(now), "expireTime": rfc3339(issued.expire),
                                 "joinTokenId": join_token_id, "revoked": False})
        return issued

    async def renew(self, peer: Peer, csr_pem: str) -> Issued:
        """A fresh certificate for the node that presented a current one (checked by `check`)."""
        current = await self.check(peer)
        csr = _csr(csr_pem)
        issued = self._sign(peer.node, peer.enrolment, csr)
        now = self.clock.now()
        await self._write(peer.node, {**current, "keySha256": _key_digest(csr), "renewTime": rfc3339(now),
                                      "expireTime": rfc3339(issued.expire)})
        return issued

    def _forget(self, node: str) -> None:
        self._checked = {p: v for p, v in self._checked.items() if p.node != node}

    async def check(self, peer: Peer) -> dict[str, Any]:
        """The enrolment a verified certificate belongs to; NodeRevoked when it no longer counts."""
        cached = self._checked.get(peer)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        current = await self.record(peer.node)
        if current is None or current.get("id") != peer.enrolment:
            raise NodusError("NodeRevoked", f'the certificate of node "{peer.node}" belongs to an enrolment that '
                             'was re-admitted away', name=peer.node, kind="nodes",
                             fix=f"enrol again with the join token once an operator re-admits it: "
                                 f"nodus node readmit {peer.node}")
        if current.get("revoked"):
            raise NodusError("NodeRevoked", f'node "{peer.node}" was revoked', name=peer.node, kind="nodes",
                             fix=f"an operator re-admits it: nodus node readmit {peer.node}")
        if len(self._checked) > 10_000:
            self._checked.clear()
        self._checked[peer] = (time.monotonic() + _CHECK_SECONDS, current)
        return current

    def _sign(self, node: str, enrolment: str, csr: x509.CertificateSigningRequest) -> Issued:
        now = datetime.fromtimestamp(self.clock.now(), timezone.utc)
        expire = now + timedelta(seconds=self.lifetime)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nodus:nodes"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _OU + enrolment),
                                     x509.NameAttribute(NameOID.COMMON_NAME, node)]))
            .issuer_name(self.ca.cert.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(expire)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca.key.public_key()),
                           critical=False)
            .sign(self.ca.key, hashes.SHA256())
        )
        return Issued(node, cert.public_bytes(serialization.Encoding.PEM), self.ca.pem, expire.timestamp())

    # -- operators --------------------------------------------------------------------------------
    async def revoke(self, node: str, message: str = "") -> dict[str, Any]:
        current = await self.record(node)
        if current is None:
            raise NodusError("NotFound", f'node "{node}" is not enrolled', name=node, kind="nodes",
                             fix="list the nodes with `nodus node ls` (NodeService.ListNodes)")
        current.update(revoked=True, revokeTime=rfc3339(self.clock.now()), message=message)
        await self._write(node, current)
        return current

    async def rotate_join_token(self) -> tuple[str, int]:
        """A new join token for hosts yet to enrol; the old ones refuse enrolments from now on, and
        enrolled nodes, which hold certificates, are not touched."""
        token, retired = await self.identity.rotate_join_token()
        if self.join_token_file is not None:
            write_private(self.join_token_file, token.encode() + b"\n")
        return token, retired

    async def readmit(self, node: str) -> None:
        """Forgets the enrolment: the next Enrol under the name takes it, whatever its key."""
        rec = await self.store.get(PREFIX + node)
        if rec is None:
            raise NodusError("NotFound", f'node "{node}" is not enrolled', name=node, kind="nodes",
                             fix="list the nodes with `nodus node ls` (NodeService.ListNodes)")
        await self.store.delete(rec.key, rec.revision)
        self._forget(node)
