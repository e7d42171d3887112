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


def test_a_pod_reaches_the_api_at_the_attempt_api_server(images: dict[str, str], oci_registry: Registry,
                                                         work: Path, tmp_path: Path) -> None:
    """ADR 0065 from inside a runc pod: the coordinator listens on every address and is started with
    --attempt-api-server naming the host's own address; a pod with an Open egress (its routed veth) is
    told that URL, and reads its own Job through it with its token and the CA (the certificate names it)."""
    import os

    import netns
    from agent_double import AgentProcess, free_port
    from e2e import AGENT_ENV
    from test_oci_egress_e2e import free_range
    from test_service_account_e2e import READER, _host_address

    port = free_port()
    told = f"https://{_host_address()}:{port}"
    with Coordinator(tmp_path / "data").start(http_port=port, host="0.0.0.0", extra_args=(
            "--insecure-registry", oci_registry.host, "--attempt-api-server", told)) as far:
        r = far.session().post(far.url(f"{NS}/serviceaccounts"), json={
            "apiVersion": "nodus.dev/v1", "kind": "ServiceAccount", "metadata": {"name": "reader"},
            "spec": {"role": "viewer"}})
        assert r.status_code == 201, r.text
        agent = AgentProcess(work, far.grpc, far.join_token, node="oci-sa-far",
                             env={**AGENT_ENV, "LD_LIBRARY_PATH": "/opt/node-only/lib"},
                             extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci",
                                         "--insecure-registry", oci_registry.host, "--egress-range", free_range(),
                                         "--egress-interface-prefix", f"{netns.PREFIX}{os.getpid()}-s",
                                         "--egress-uplink", "lo"))  # forwarding stays off but for lo
        with joined([agent.start()], far):
            create(far, "far", backoffLimit=0, image=images["python"], command=["python3", "-c", READER, told],
                   serviceAccountName="reader", network={"egress": {"policy": "Open"}})
            st = settled(far, "far", 180)
            logs = far.run("nodus", "logs", "far", check=False).stdout
        assert st["phase"] == "Succeeded", (st, logs)
        assert f"server {told}" in logs and "read far" in logs, logs
