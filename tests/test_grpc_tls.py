"""TLS on the gRPC port (issue 15, item 1): a real coordinator serves gRPC over TLS with the serving
certificate its DATA_DIR/tls CA signed, and agents, `nodus` and grpcurl verify it; plaintext only
with --grpc-insecure, and only on loopback."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest
import yaml
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import BIN, Coordinator
from e2e import start_agent
from agent_double import wait_for

from nodus.v1 import node_pb2, node_pb2_grpc


def health(channel: grpc.Channel) -> int:
    return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def test_a_plaintext_connection_to_the_tls_port_is_refused(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    with grpc.insecure_channel(c.grpc) as plain:
        with pytest.raises(grpc.RpcError) as refused:
            health(plain)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with c.channel() as verified:
        assert health(verified) == health_pb2.HealthCheckResponse.SERVING
    result = c.run("grpcurl", "-plaintext", c.grpc, "list", check=False)
    assert result.returncode != 0, result.stdout


def test_the_serving_certificate_names_loopback_and_is_signed_by_the_data_dirs_ca(
        shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    assert c.grpc_ca == c.data_dir / "tls" / "ca.crt"
    cert = x509.load_pem_x509_certificate((c.data_dir / "tls" / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    port = c.grpc.rpartition(":")[2]
    with grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(c.data_dir.joinpath(
            "tls", "ca.crt").read_bytes())) as by_name:
        assert health(by_name) == health_pb2.HealthCheckResponse.SERVING
    # Another CA's clients do not trust it.
    other = Coordinator(c.data_dir.parent / "other-data").start()
    try:
        with grpc.secure_channel(c.grpc, grpc.ssl_channel_credentials(other.data_dir.joinpath(
                "tls", "ca.crt").read_bytes())) as wrong:
            with pytest.raises(grpc.RpcError) as refused:
                health(wrong)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        other.stop()


def test_grpcurl_with_the_data_dirs_ca_and_the_nodus_cli_make_operator_calls(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    ca = str(c.data_dir / "tls" / "ca.crt")
    listed = c.run("grpcurl", "-cacert", ca, "-H", f"authorization: Bearer {c.token}", c.grpc,
                   "nodus.v1.ProjectService/ListProjects")
    assert {"default", "nodus"} <= {p["name"] for p in json.loads(listed.stdout)["projects"]}
    nodes = c.run("grpcurl", "-cacert", ca, "-H", f"authorization: Bearer {c.token}", c.grpc,
                  "nodus.v1.NodeService/ListNodes")
    assert "nodes" in json.loads(nodes.stdout) or json.loads(nodes.stdout) == {}
    # `nodus` verifies the port with the kubeconfig's CA, as kubectl verifies REST.
    token = c.grpc_token("default", "viewer")
    assert token.startswith("nodus_")


def test_an_agent_without_the_ca_says_how_to_fix_it_and_one_with_it_joins(
        shared_coordinator: Coordinator, tmp_path: Path) -> None:
    c = shared_coordinator
    (tmp_path / "token").write_text(c.join_token + "\n")
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [str(BIN / "nodus-agent"), "--coordinator", str(c.grpc), "--node", "tls-no-ca", "--work-dir",
             str(tmp_path / "work"), "--join-token-file", str(tmp_path / "token"), "--runtime", "process",
             "--cgroups", "false", "--reconnect-base", "0.05", "--reconnect-max", "0.2"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "--coordinator-ca" in log.read_text() or agent.poll() is not None, 30,
                 what="the agent to name --coordinator-ca")
        text = log.read_text()
        assert "ERROR" in text and "not trusted" in text, text[-2000:]
        assert "registered node" not in text
    finally:
        agent.kill()
        agent.wait()
    with start_agent(c, tmp_path / "good", node="tls-with-ca") as a:
        assert "--coordinator-ca" in a.argv()
        with c.channel() as channel:
            listed = node_pb2_grpc.NodeServiceStub(channel).ListNodes(
                node_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)
        assert "tls-with-ca" in {n.name for n in listed.nodes}


def test_grpc_insecure_is_refused_off_loopback_with_the_flag_named(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "nodus-coordinator"), "--data-dir", str(tmp_path / "data"), "--http-listen", "127.0.0.1:0",
         "--grpc-listen", "0.0.0.0:0", "--grpc-insecure"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--grpc-insecure" in result.stderr and "loopback" in result.stderr and "0.0.0.0:0" in result.stderr


def test_grpc_insecure_on_loopback_serves_plaintext_and_says_so_to_clients(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start(extra_args=("--grpc-insecure",)) as c:
        assert c.grpc_ca is None
        with grpc.insecure_channel(c.grpc) as plain:
            assert health(plain) == health_pb2.HealthCheckResponse.SERVING
        # The kubeconfig says so, and `nodus` then speaks plaintext.
        cluster = yaml.safe_load(c.kubeconfig.read_text())["clusters"][0]["cluster"]
        assert cluster["extensions"][0]["extension"] == {"address": c.grpc, "insecure": True}
        assert c.grpc_token("default", "viewer").startswith("nodus_")
        with start_agent(c, tmp_path / "work", node="plain-n0") as a:
            assert "--coordinator-insecure" in a.argv()


def test_a_restart_on_a_new_host_name_reissues_the_serving_certificate_from_the_same_ca(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Coordinator(data).start().stop()
    ca_before = (data / "tls" / "ca.crt").read_bytes()
    with Coordinator(data).start(host="127.0.0.2") as c:
        assert (data / "tls" / "ca.crt").read_bytes() == ca_before
        cert = x509.load_pem_x509_certificate((data / "tls" / "tls.crt").read_bytes())
        ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.IPAddress)
        assert "127.0.0.2" in {str(ip) for ip in ips}
        with c.channel() as channel:  # the re-issued certificate verifies under the old CA
            assert health(channel) == health_pb2.HealthCheckResponse.SERVING
