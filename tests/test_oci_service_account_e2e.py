"""A ServiceAccount's token inside a container (ADR 0055): a real coordinator, a real `nodus-agent --runtime
oci` and a real registry on loopback. The image Job's program finds $NODUS_TOKEN_FILE and $NODUS_CA_FILE at
/nodus/secrets/nodus.serviceaccount/ inside its pod, readable by the image's user, holding the token and the
coordinator's CA; the token is revoked once the attempt ends. $NODUS_API_SERVER is not set: the coordinator
listens on loopback, which the pod's own network namespace cannot reach, and no --attempt-api-server names
an address it could (ADR 0065; tests/test_service_account_e2e.py covers the flag)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from agent_double import wait_for
from conftest import Coordinator
from e2e import NS, create, joined, settled
from registry import Registry
from test_oci_e2e import images, oci_agent, pytestmark, work  # noqa: F401 - the image fixtures and the skip

PROGRAM = r"""
import os, sys
token_file, ca_file = os.environ["NODUS_TOKEN_FILE"], os.environ["NODUS_CA_FILE"]
print("files", token_file, ca_file, "server", os.environ.get("NODUS_API_SERVER", "unset"), flush=True)
ok = (token_file == "/nodus/secrets/nodus.serviceaccount/token"
      and ca_file == "/nodus/secrets/nodus.serviceaccount/ca.crt"
      and open(token_file).read().startswith("nodus_")
      and "BEGIN CERTIFICATE" in open(ca_file).read())
sys.exit(0 if ok else 7)
"""


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("oci-sa") / "data").start(
            extra_args=("--insecure-registry", oci_registry.host)) as coordinator:
        yield coordinator


def test_the_token_is_at_the_same_path_inside_the_container(c: Coordinator, images: dict[str, str],
                                                            oci_registry: Registry, work: Path) -> None:
    r = c.session().post(c.url(f"{NS}/serviceaccounts"), json={
        "apiVersion": "nodus.dev/v1", "kind": "ServiceAccount", "metadata": {"name": "in-pod"},
        "spec": {"role": "viewer"}})
    assert r.status_code == 201, r.text
    with joined([oci_agent(c, work, oci_registry, node="oci-sa-n0").start()], c):
        create(c, "oci-sa", backoffLimit=0, image=images["python"], command=["python3", "-c", PROGRAM],
               serviceAccountName="in-pod")
        st = settled(c, "oci-sa", 180)
        logs = c.run("nodus", "logs", "oci-sa", check=False).stdout
        assert st["phase"] == "Succeeded", (st, logs)
        assert "server unset" in logs, "a pod is not told a loopback address it cannot reach"

    def revoked() -> bool:
        listed = json.loads(c.run("nodus", "token", "ls", "--project", "default", "--all", "-o", "json").stdout)
        mine = [t for t in listed if t["subject"] == "system:serviceaccount:default:in-pod"]
        return bool(mine) and all(t.get("revoke_time") for t in mine)
    wait_for(revoked, 30, what="the ended attempt's token to be revoked")
