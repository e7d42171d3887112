"""`nodus-coordinator vault rotate`: a new Secret encryption key, every value re-encrypted under it,
old keys kept until that is done; the values read back identical after the rotation and a restart
(docs/adr/0046-tokens-rate-limits-audit.md)."""
from __future__ import annotations

import asyncio
import base64
import subprocess
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from conftest import BIN, Coordinator
from nodus.coordinator.errors import NodusError
from nodus.coordinator.store.sqlite import SqliteStore
from nodus.coordinator.vault import Vault, load_or_create_key, ring_keys, write_ring
from nodus.coordinator.vault_rotate import rotate

SECRETS = "/apis/nodus.dev/v1/namespaces/default/secrets"
VALUE = "NODUS-TEST-SECRET-vault-7d21"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "creds"}, "data": data}


def vault_rotate(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "nodus-coordinator"), "vault", "rotate", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)


def read_back(data_dir: Path, version: int) -> dict[str, str]:
    async def read() -> dict[str, str]:
        store = await SqliteStore.open(data_dir / "store.db")
        try:
            return await Vault(store, (data_dir / "secret.key").read_bytes()).get("default", "creds", version)
        finally:
            await store.close()
    return asyncio.run(read())


def test_rotation_through_the_daemon_and_a_restart(coordinator: Coordinator) -> None:
    c = coordinator
    s = c.session()
    first = {"TOKEN": b64(VALUE + "-1"), "OTHER": b64(VALUE + "-other")}
    assert s.post(c.url(SECRETS), json=secret(first)).status_code == 201
    second = {**first, "TOKEN": b64(VALUE + "-2")}
    r = s.put(c.url(SECRETS + "/creds"), json={**secret(second), "metadata": s.get(c.url(SECRETS + "/creds")).json()["metadata"]})
    assert r.status_code == 200 and r.json()["status"]["version"] == 2, r.text

    running = vault_rotate(c.data_dir)
    assert running.returncode != 0 and "stop it" in running.stderr
    old_key = (c.data_dir / "secret.key").read_bytes().strip()

    c.stop()
    done = vault_rotate(c.data_dir)
    assert done.returncode == 0, done.stderr
    assert "2 Secret values re-encrypted (0 already under the new key), 1 old key(s) dropped" in done.stdout
    [new_key] = ring_keys((c.data_dir / "secret.key").read_bytes())
    assert new_key != old_key
    assert read_back(c.data_dir, 1) == first and read_back(c.data_dir, 2) == second

    # The restarted daemon decrypts them: the same values again make no new version, a change does.
    c.start()
    s = c.session()
    meta = s.get(c.url(SECRETS + "/creds")).json()["metadata"]
    same = s.put(c.url(SECRETS + "/creds"), json={**secret(second), "metadata": meta})
    assert same.status_code == 200 and same.json()["status"]["version"] == 2, same.text
    third = {**second, "OTHER": b64(VALUE + "-3")}
    changed = s.put(c.url(SECRETS + "/creds"), json={**secret(third), "metadata": same.json()["metadata"]})
    assert changed.status_code == 200 and changed.json()["status"]["version"] == 3, changed.text
    c.stop()
    assert read_back(c.data_dir, 3) == third and read_back(c.data_dir, 1) == first


def test_an_interrupted_rotation_resumes_with_its_new_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        old = load_or_create_key(tmp_path / "secret.key")
        store = await SqliteStore.open(tmp_path / "store.db")
        try:
            vault = Vault(store, old)
            for i in range(3):
                await vault.put("p", f"s{i}", 1, {"K": b64(f"{VALUE}-{i}")})
            # Stopped after step 1 and one value: the ring is [new, old], s0 is under the new key.
            new = Fernet.generate_key()
            write_ring(tmp_path / "secret.key", [new, old])
            rec = await store.get("_secrets/p/s0/0000000001")
            assert rec is not None
            await store.update(rec.key, Fernet(new).encrypt(Fernet(old).decrypt(rec.value)), rec.revision)

            assert await rotate(tmp_path, store) == (2, 1, 1)
            assert ring_keys((tmp_path / "secret.key").read_bytes()) == [new]
            only_new = Vault(store, new)
            assert [await only_new.get("p", f"s{i}", 1) for i in range(3)] == [
                {"K": b64(f"{VALUE}-{i}")} for i in range(3)]
            with pytest.raises(NodusError) as e:
                await Vault(store, old).get("p", "s1", 1)
            assert "cannot be decrypted" in e.value.message
        finally:
            await store.close()
    asyncio.run(scenario())
