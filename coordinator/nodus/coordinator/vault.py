"""Secret values, encrypted at rest.

Secret objects in the keyspace carry only key names and versions; each version's values live under
`_secrets/<project>/<name>/<version>` encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under a key
kept in DATA_DIR/secret.key (mode 0600). Values never leave the coordinator through the resource
API; only attempts receive them (the agent issue delivers them over the agent stream).

secret.key is a key ring: one Fernet key a line, the first the current one (new values are
encrypted under it), the others still read. `nodus-coordinator vault rotate` (vault_rotate.py) puts
a new key first, re-encrypts every value under it, and only then drops the old ones
(docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Callable

import orjson
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from .errors import NodusError
from .store.base import Store


def load_or_create_key(path: Path) -> bytes:
    """The key ring in `path` (made with one new key if there is none)."""
    if path.exists():
        return path.read_bytes().strip()
    key = Fernet.generate_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    return key


def ring_keys(ring: bytes) -> list[bytes]:
    """A key ring's keys, current first (a file written before rotation existed holds one)."""
    keys = [line.strip() for line in ring.splitlines() if line.strip()]
    if not keys:
        raise ValueError("the key ring holds no key")
    return keys


def write_ring(path: Path, keys: list[bytes]) -> None:
    """Replaces the key ring in one rename (0600, synced), so a crash leaves the old ring or the new."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b"\n".join(keys) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Vault:
    def __init__(self, store: Store, key: bytes) -> None:
        """`key` is the key ring (secret.key's contents): the first key encrypts, every key decrypts."""
        self._store = store
        keys = ring_keys(key)
        self._fernet = MultiFernet([Fernet(k) for k in keys])
        self._secret = keys[0]

    def signer(self, purpose: str) -> Callable[[bytes], str]:
        """An HMAC-SHA256 (hex) under a key derived from the vault's for `purpose` alone, so a value this
        coordinator signed (a dry run's ETag) cannot be forged without its data dir's secret.key."""
        derived = hmac.new(self._secret, f"nodus/{purpose}".encode(), hashlib.sha256).digest()
        return lambda message: hmac.new(derived, message, hashlib.sha256).hexdigest()

    @staticmethod
    def _key(project: str, name: str, version: int) -> str:
        return f"_secrets/{project}/{name}/{version:010d}"

    async def put(self, project: str, name: str, version: int, values: dict[str, str]) -> None:
        """Stores one version's values (base64 strings as the API received them)."""
        token = self._fernet.encrypt(orjson.dumps(values))
        await self._store.create(self._key(project, name, version), token)

    async def get(self, project: str, name: str, version: int) -> dict[str, str]:
        rec = await self._store.get(self._key(project, name, version))
        if rec is None:
            raise NodusError("NotFound", f'secret "{name}" version {version} not found', name=name, kind="secrets")
        try:
            return orjson.loads(self._fernet.decrypt(rec.value))
        except InvalidToken:
            raise NodusError("InternalError", f'secret "{name}" version {version} cannot be decrypted',
                             fix="the data dir's secret.key does not match the store; restore the original key") from None

    async def reencrypt(self) -> tuple[int, int]:
        """Re-encrypts every stored value under the current key (a compare-and-swap each, so a value
        written meanwhile is never lost); returns (values re-encrypted, values already under it)."""
        done = already = 0
        current = Fernet(self._secret)
        start_after: str | None = None
        while True:
            page = await self._store.list("_secrets/", limit=500, start_after=start_after)
            for rec in page.records:
                try:
                    current.decrypt(rec.value)
                    already += 1
                    continue
                except InvalidToken:
                    pass
                try:
                    token = self._fernet.rotate(rec.value)
                except InvalidToken:
                    raise NodusError("InternalError", f"{rec.key} cannot be decrypted with any key of the ring",
                                     fix="restore the secret.key this store was written with, then rotate") from None
                await self._store.update(rec.key, token, rec.revision)
                done += 1
            if not page.records or len(page.records) < 500:
                return done, already
            start_after = page.records[-1].key

    async def drop(self, project: str, name: str) -> None:
        result = await self._store.list(f"_secrets/{project}/{name}/")
        for rec in result.records:
            await self._store.delete(rec.key)
