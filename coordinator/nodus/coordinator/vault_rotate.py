"""`nodus-coordinator vault rotate`: a new Secret encryption key, every value re-encrypted under it.

Run with the coordinator stopped (every replica, on a shared PostgreSQL store), since a running one
holds the key ring it started with. The steps leave every value readable at each point a crash
could stop them: (1) the ring becomes [new, old…] (one rename), (2) each value is re-encrypted
under the new key (one compare-and-swap each), (3) the ring becomes [new]. A run that finds a ring
of several keys was interrupted after (1): it resumes with the ring's first key rather than adding
another (docs/adr/0046-tokens-rate-limits-audit.md).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from cryptography.fernet import Fernet

from .errors import NodusError
from .store.base import Store
from .store.opening import open_store
from .vault import Vault, ring_keys, write_ring


def _running(data_dir: Path) -> str:
    """The REST address of a coordinator that answers on the data dir's endpoints.json, or ""."""
    try:
        http = str(orjson.loads((data_dir / "endpoints.json").read_bytes())["http"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    parts = urlsplit(http)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 443), timeout=1):
            return http
    except OSError:
        return ""


async def rotate(data_dir: Path, store: Store) -> tuple[int, int, int]:
    """Rotates DATA_DIR/secret.key over `store`; returns (values re-encrypted, values already under
    the new key, old keys dropped)."""
    path = data_dir / "secret.key"
    keys = ring_keys(path.read_bytes())
    if len(keys) == 1:  # a fresh rotation; several keys: an interrupted one, resumed with its new key
        keys = [Fernet.generate_key(), *keys]
        write_ring(path, keys)
    vault = Vault(store, b"\n".join(keys))
    done, already = await vault.reencrypt()
    write_ring(path, keys[:1])
    return done, already, len(keys) - 1


async def _run(data_dir: Path, store_url: str) -> tuple[int, int, int]:
    store = await open_store(store_url, data_dir)
    try:
        return await rotate(data_dir, store)
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="nodus-coordinator vault rotate",
                                description="Add a new Secret encryption key to DATA_DIR/secret.key, re-encrypt "
                                            "every Secret value under it, then drop the old keys. Stop the "
                                            "coordinator first; start it again afterwards.")
    p.add_argument("--data-dir", default=os.environ.get("NODUS_DATA_DIR", "/var/lib/nodus/coordinator"),
                   help="the coordinator's data dir (default $NODUS_DATA_DIR, else /var/lib/nodus/coordinator)")
    p.add_argument("--store-url", default=os.environ.get("NODUS_STORE_URL", ""),
                   help="postgresql://… when the coordinator runs with --store-url (default: SQLite in the data dir)")
    args = p.parse_args(argv)
    data_dir = Path(args.data_dir)
    if not (data_dir / "secret.key").exists():
        raise SystemExit(f"vault rotate: {data_dir / 'secret.key'} does not exist: pass the coordinator's --data-dir")
    address = _running(data_dir)
    if address:
        raise SystemExit(f"vault rotate: a coordinator answers at {address} on this data dir: stop it (every "
                         "replica), rotate, then start it again")
    try:
        done, already, dropped = asyncio.run(_run(data_dir, args.store_url))
    except NodusError as e:
        raise SystemExit(f"vault rotate: {e.message}; {e.effective_fix}") from None
    print(f"vault key rotated: {done} Secret values re-encrypted ({already} already under the new key), "
          f"{dropped} old key(s) dropped from {data_dir / 'secret.key'}")
