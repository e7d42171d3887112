"""Secret values, encrypted at rest.

Secret objects in the keyspace carry only key names and versions; each version's values live under
`_secrets/<project>/<name>/<version>` encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under a key
kept in DATA_DIR/secret.key (mode 0600). Values never leave the coordinator through the resource
API; only attempts receive them (the agent issue delivers them over the agent stream).
"""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Callable

import orjson
from cryptography.fernet import Fernet, InvalidToken

from .errors import NodusError
from .store.base import Store


def load_or_create_key(path: Path) -> bytes:
    if path.exists():
        return path.read_bytes().strip()
    key = Fernet.generate_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    return key


class Vault:
    def __init__(self, store: Store, key: bytes) -> None:
        self._store = store
        self._fernet = Fernet(key)
        self._secret = key

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

    async def drop(self, project: str, name: str) -> None:
        result = await self._store.list(f"_secrets/{project}/{name}/")
        for rec in result.records:
            await self._store.delete(rec.key)
