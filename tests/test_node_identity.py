"""A per-node identity (issue 15, item 2), with real coordinators and real agents: the join token
enrols a node once (AgentService.Enrol over TLS), the node's certificate authenticates every later
call on the agent port (mTLS) and is renewed before it expires, across a coordinator restart; an
enrolled name cannot be taken with the join token; operators list, revoke and re-admit nodes and
rotate the join token (NodeService, grpcurl and `nodus`)."""
from __future__ import annotations

import json
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from conftest import Coordinator
from agent_double import AgentProcess, restart_ports, wait_for
from e2e import AGENT_ENV, attempts_of, create, joined

from nodus.agent.x509 import new_key
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2, node_pb2, node_pb2_grpc

NS = "nodus.v1.NodeService"
LOOP = ["python3", "-c", "import time\nwhile True: time.sleep(0.2)"]


def reason(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, error
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in status.details)
    return str(info.reason)


def nodes(c: Coordinator) -> dict[str, node_pb2.Node]:
    with c.channel() as channel:
        listed = node_pb2_grpc.NodeServiceStub(channel).ListNodes(
            node_pb2.ListNodesRequest(), metadata=(("authorization", f"Bearer {c.token}"),), timeout=10)
    return {n.name: n for n in listed.nodes}


def grpcurl(c: Coordinator, method: str, body: dict[str, Any]) -> dict[str, Any]:
    out = c.run("grpcurl", *c.grpcurl_tls(), "-H", f"authorization: Bearer {c.token}", "-d", json.dumps(body),
                c.grpc, f"{NS}/{method}")
    return dict(json.loads(out.stdout or "{}"))


def agent(c: Coordinator, root: Path, node: str, *extra: str) -> AgentProcess:
    return AgentProcess(root / node, c.grpc, c.join_token, node=node, env=AGENT_ENV, extra_args=extra)


def register_with(channel: grpc.Channel, node: str) -> agent_pb2.RegisterResponse:
    inventory = common_pb2.NodeInventory(hostname=node, runtimes=[common_pb2.RUNTIME_PROCESS],
                                         host=common_pb2.HostInventory(cpus=2, memory_bytes=1 << 30))
    return agent_pb2_grpc.AgentServiceStub(channel).Register(
        agent_pb2.RegisterRequest(node_name=node, inventory=inventory), timeout=10)


def test_an_agent_enrols_once_keeps_a_private_key_and_renews_across_a_coordinator_restart(tmp_path: Path) -> None:
    port = restart_ports()
    args = ("--node-certificate-lifetime", "12s")
    c = Coordinator(tmp_path / "data").start(grpc_port=port, extra_args=args)
    a = agent(c, tmp_path, "id-n0").start()
    try:
        with joined([a], c):
            assert "enrolled node id-n0" in a.log()
            identity = a.work_dir / "identity"
            assert stat.S_IMODE((identity / "node.key").stat().st_mode) == 0o600
            assert stat.S_IMODE(identity.stat().st_mode) == 0o700
            first = nodes(c)["id-n0"]
            assert first.enrolled and not first.revoked
            # Renewed at two thirds of its life, on the same stream's node: the expiry moves on.
            wait_for(lambda: nodes(c)["id-n0"].certificate_expire_time.seconds > first.certificate_expire_time.seconds,
                     30, interval=0.3, what="the certificate to be renewed")
            # (the agent logs it once its X.509 helper has read the new certificate, just after)
            wait_for(lambda: "renewed the certificate of node id-n0" in a.log(), 10, interval=0.1,
                     what="the agent to take the renewed certificate")
            # The X.509 work (key, CSRs, reading the certificate) ran in short-lived children: the
            # daemon itself never mapped cryptography's library (~8 MB of an idle agent's RSS).
            maps = Path(f"/proc/{a.proc.pid}/maps").read_text()
            assert "python3" in maps  # the agent's own interpreter, not a wrapper
            assert "cryptography" not in maps
            c.stop()
            c.start(grpc_port=port, extra_args=args)
            # Back on the same ports: the agent reconnects with its certificate (no new enrolment) and
            # renews again past the expiry of every certificate it held before the restart.
            before = nodes(c)["id-n0"].certificate_expire_time.seconds
            wait_for(lambda: nodes(c)["id-n0"].certificate_expire_time.seconds > before + 5, 40, interval=0.3,
                     what="a renewal after the restart")
            wait_for(lambda: nodes(c)["id-n0"].phase == node_pb2.NODE_PHASE_READY, 30, interval=0.2,
                     what="the node to be Ready again")
            assert a.log().count("enrolled node id-n0") == 1
            create(c, "after-renewals", command=["python3", "-c", "print('ok')"])
            wait_for(lambda: any(x["status"].get("phase") == "Succeeded" for x in attempts_of(c, "after-renewals")),
                     60, interval=0.2, what="a Job on the renewed node")
    finally:
        c.stop()


def test_the_join_token_cannot_take_an_enrolled_name_nor_skip_enrolment(coordinator: Coordinator,
                                                                       tmp_path: Path) -> None:
    c = coordinator
    with joined([agent(c, tmp_path, "taken").start()], c):
        # Another holder of the join token, with its own key, asks for the same name.
        with pytest.raises(grpc.RpcError) as refused:
            c.enrol("taken", new_key())
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert reason(refused.value) == "NodeEnrolled"
        assert '"taken"' in (refused.value.details() or "") and "nodus node readmit taken" in (
            refused.value.details() or "")
        # A real agent under the taken name is refused too, and says so.
        thief = agent(c, tmp_path / "other-host", "taken").start()
        try:
            wait_for(lambda: "NodeEnrolled" in thief.log(), 30, what="the second agent to be refused")
            assert "registered node" not in thief.log()
        finally:
            thief.reap()
        # Register with the join token on the TLS port (no certificate) is refused: enrol first.
        with c.channel() as channel:
            with pytest.raises(grpc.RpcError) as plain:
                agent_pb2_grpc.AgentServiceStub(channel).Register(
                    agent_pb2.RegisterRequest(node_name="taken"), timeout=10,
                    metadata=(("authorization", f"Bearer {c.join_token}"),))
        assert plain.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason(plain.value) == "NodeCertificateRequired"
        # A certificate names its node: another name in the request is refused.
        with c.node_channel("honest", new_key()) as mine:
            with pytest.raises(grpc.RpcError) as other:
                register_with(mine, "taken")
            assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert register_with(mine, "honest").epoch == 1
        # The agent port takes nothing without a client certificate of this CA.
        with pytest.raises(grpc.RpcError) as anonymous:
            with grpc.secure_channel(c.agent_address, grpc.ssl_channel_credentials(c.grpc_ca.read_bytes()
                                                                                      if c.grpc_ca else None)) as ch:
                register_with(ch, "anon")
        assert anonymous.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_revoked_node_is_cut_off_its_attempt_replaced_and_readmission_lets_it_back(tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data").start(extra_args=("--lease-duration", "4s", "--heartbeat-interval", "1s"))
    try:
        first = agent(c, tmp_path, "rv-n0").start()
        with joined([first], c):
            create(c, "survivor", command=LOOP)
            placed = wait_for(lambda: next((x for x in attempts_of(c, "survivor")
                                            if x.get("status", {}).get("phase") == "Running"), None),
                              60, interval=0.2, what="the attempt to run")
            assert placed["spec"]["node"] == "rv-n0"
            with joined([agent(c, tmp_path, "rv-n1").start()], c):
                revoked = grpcurl(c, "RevokeNode", {"name": "rv-n0", "message": "stolen laptop"})
                assert revoked["revoked"] is True and revoked["enrolled"] is True
                wait_for(lambda: "refused the node certificate" in first.log(), 20,
                         what="the revoked agent to be refused")
                # Its lease runs out: NotReady, the attempt Lost, and a replacement runs on the other node.
                wait_for(lambda: nodes(c)["rv-n0"].phase == node_pb2.NODE_PHASE_NOT_READY, 30, interval=0.2,
                         what="the revoked node to be NotReady")
                replacement = wait_for(lambda: next((x for x in attempts_of(c, "survivor")
                                                     if x["spec"].get("node") == "rv-n1"
                                                     and x.get("status", {}).get("phase") == "Running"), None),
                                       60, interval=0.2, what="the replacement on rv-n1")
                assert replacement["spec"]["number"] > placed["spec"]["number"]
                assert nodes(c)["rv-n0"].revoked
                # Its enrolment is refused too, until an operator re-admits it.
                assert "NodeRevoked" in first.log()
                listed = c.run("nodus", "node", "ls").stdout
                assert "rv-n0" in listed and "Revoked" in listed
                out = c.run("nodus", "node", "readmit", "rv-n0").stdout
                assert "re-admitted" in out
                wait_for(lambda: nodes(c)["rv-n0"].phase == node_pb2.NODE_PHASE_READY and nodes(c)["rv-n0"].enrolled
                         and not nodes(c)["rv-n0"].revoked, 60, interval=0.3, what="the re-admitted node to enrol")
                c.run("kubectl", "delete", "jobs.nodus.dev", "survivor")
    finally:
        c.stop()


def test_rotating_the_join_token_keeps_enrolled_nodes_and_refuses_the_old_token(coordinator: Coordinator,
                                                                                tmp_path: Path) -> None:
    c = coordinator
    old = c.join_token
    with joined([agent(c, tmp_path, "rot-n0").start()], c) as [a]:
        out = c.run("nodus", "join-token", "rotate")
        new = out.stdout.strip()
        assert new.startswith("nodusjoin_") and new != old and "1 old join token(s) retired" in out.stderr
        assert c.join_token == new  # DATA_DIR/join-token holds the new one
        with pytest.raises(grpc.RpcError) as refused:
            c.enrol("rot-late", new_key(), token=old)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert c.enrol("rot-late", new_key(), token=new).node_name == "rot-late"
        # The enrolled node stays connected and runs work.
        create(c, "after-rotation", command=["python3", "-c", "print('still here')"])
        wait_for(lambda: any(x["spec"].get("node") == "rot-n0" and x["status"].get("phase") == "Succeeded"
                             for x in attempts_of(c, "after-rotation")), 60, interval=0.2,
                 what="a Job on the enrolled node after the rotation")
        assert nodes(c)["rot-n0"].phase == node_pb2.NODE_PHASE_READY
        assert "refused" not in a.log()
        # A new host with the new token joins.
        with joined([AgentProcess(tmp_path / "rot-n1", c.grpc, new, node="rot-n1", env=AGENT_ENV).start()], c):
            registered_names = set(nodes(c))
            assert {"rot-n0", "rot-n1"} <= registered_names


def test_agents_notice_a_wiped_coordinator_say_what_to_do_and_enrol_with_the_token_file_they_reread(
        tmp_path: Path) -> None:
    port = restart_ports()
    c = Coordinator(tmp_path / "data").start(grpc_port=port)
    a = agent(c, tmp_path, "wipe-n0").start()
    try:
        with joined([a], c):
            old_token = c.join_token
            c.stop()
            shutil.rmtree(c.data_dir)  # a new coordinator at the same address: new CA, new join token
            c.start(grpc_port=port)
            assert c.join_token != old_token
            # The agent's certificate names a CA the coordinator no longer has: it enrols again with the
            # join token it holds, which this coordinator refuses, and says what the operator does.
            wait_for(lambda: "issued by a CA this coordinator no longer has" in a.log(), 30,
                     what="the agent to notice the coordinator's new CA")
            wait_for(lambda: "re-reads it and enrols without a restart" in a.log(), 30,
                     what="the agent to say the old join token is refused and what to do")
            assert f"in {a.token_file}" in a.log()
            assert "wipe-n0" not in nodes(c)
            # The operator puts the new coordinator's join token in the file; the running agent enrols.
            a.token_file.write_text(c.join_token + "\n")
            wait_for(lambda: "wipe-n0" in nodes(c) and nodes(c)["wipe-n0"].enrolled
                     and nodes(c)["wipe-n0"].phase == node_pb2.NODE_PHASE_READY, 60, interval=0.3,
                     what="the agent to enrol with the new join token")
            assert a.log().count("enrolled node wipe-n0") == 2
            create(c, "after-wipe", command=["python3", "-c", "print('ok')"])
            wait_for(lambda: any(x["status"].get("phase") == "Succeeded" for x in attempts_of(c, "after-wipe")),
                     60, interval=0.2, what="a Job on the re-enrolled node")
    finally:
        c.stop()


def test_an_expired_node_certificate_re_enrols_with_the_rotated_token_the_operator_puts_in_its_file(
        tmp_path: Path) -> None:
    c = Coordinator(tmp_path / "data").start(extra_args=("--node-certificate-lifetime", "10s"))
    a = agent(c, tmp_path, "exp-n0").start()
    try:
        with joined([a], c):
            a.reap()  # the host is down while its certificate expires and the join token is rotated
            new = c.run("nodus", "join-token", "rotate").stdout.strip()
            cert = a.work_dir / "identity" / "node.crt"
            expiry = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc.timestamp()
            wait_for(lambda: time.time() > expiry + 1, 30, interval=0.3, what="the certificate to expire")
            a.start()
            wait_for(lambda: "refused the join token" in a.log() and "re-reads it" in a.log(), 30,
                     what="the agent to say the old join token is refused")
            a.token_file.write_text(new + "\n")
            wait_for(lambda: a.log().count("enrolled node exp-n0") == 2, 30, what="the agent to enrol again")
            wait_for(lambda: nodes(c)["exp-n0"].phase == node_pb2.NODE_PHASE_READY, 30, interval=0.2,
                     what="the re-enrolled node to be Ready")
            assert "read a new join token from" in a.log()
    finally:
        c.stop()
