"""The audit log through the real daemon: every write over REST and gRPC is one JSON line in
DATA_DIR/audit.log (who by token id, verb, resource, project, name, outcome, time, requestId), reads
are not, a Secret's values and the tokens' secrets never appear, the file rotates by size, and
`nodus-coordinator audit query` answers an operator's question across the rotations
(docs/adr/0046-tokens-rate-limits-audit.md)."""
from __future__ import annotations

import base64
import json
import stat
import subprocess
from typing import Any, Iterator

import grpc
import pytest

from agent_double import wait_for
from conftest import BIN, Coordinator, job
from nodus.v1 import project_pb2, project_pb2_grpc, resource_pb2, resource_pb2_grpc

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
SECRETS = "/apis/nodus.dev/v1/namespaces/default/secrets"
MARKER = "NODUS-TEST-SECRET-audit-3f9c"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("audit") / "data").start(
            extra_args=("--audit-log-max-size", "8Ki", "--audit-log-backups", "3")) as c:
        yield c


def entries(c: Coordinator) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted(c.data_dir.glob("audit.log*"), reverse=True):  # .3, .2, .1, then the live one
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def query(c: Coordinator, *args: str) -> list[dict[str, Any]]:
    """`nodus-coordinator audit query --data-dir DATA_DIR ARGS`: the entries it prints."""
    out = subprocess.run([str(BIN / "nodus-coordinator"), "audit", "query", "--data-dir", str(c.data_dir), *args],
                         capture_output=True, text=True, timeout=30, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_every_write_is_recorded_once_without_bodies(c: Coordinator) -> None:
    editor = c.grpc_token("default", "editor")
    editor_id = editor.split("_")[1]
    viewer = c.grpc_token("default", "viewer")
    s = c.session(editor)
    created = s.post(c.url(JOBS), json=job("audited"))
    assert created.status_code == 201, created.text
    assert s.get(c.url(JOBS + "/audited")).status_code == 200  # a read: not audited
    refused = c.session(viewer).post(c.url(JOBS), json=job("not-allowed"))
    assert refused.status_code == 403
    secret = s.post(c.url(SECRETS), json={"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "s"},
                                          "stringData": {"TOKEN": MARKER},
                                          "data": {"B64": base64.b64encode(MARKER.encode()).decode()}})
    assert secret.status_code == 201, secret.text
    deleted = s.delete(c.url(JOBS + "/audited"))
    assert deleted.status_code == 200
    with c.channel() as channel:
        admin = (("authorization", f"Bearer {c.token}"),)
        minted = project_pb2_grpc.ProjectServiceStub(channel).CreateToken(
            project_pb2.CreateTokenRequest(project="default", role="viewer"), metadata=admin)
        with pytest.raises(grpc.RpcError):
            resource_pb2_grpc.ResourceServiceStub(channel).Delete(
                resource_pb2.DeleteRequest(kind="Job", project="default", name="never-there"),
                metadata=(("authorization", f"Bearer {editor}"),))

    # A refused gRPC call's line is written as its status goes out, so the client can see the refusal first.
    def written() -> list[dict[str, Any]] | None:
        got = entries(c)
        return got if any(e["name"] == "never-there" for e in got) else None
    log = wait_for(written, 15, interval=0.1, what="the refused gRPC delete's audit line")
    mine = [e for e in log if e["tokenId"] == editor_id]
    assert [(e["transport"], e["verb"], e["resource"], e["name"], e["code"]) for e in mine] == [
        ("rest", "create", "jobs", "audited", "201"),
        ("rest", "create", "secrets", "s", "201"),
        ("rest", "delete", "jobs", "audited", "200"),
        ("grpc", "delete", "Job", "never-there", "NOT_FOUND"),
    ]
    assert all(e["project"] == "default" and e["requestId"].startswith("req_") and e["time"].endswith("Z")
               and e["subject"] == f"token:{editor_id}" for e in mine)
    assert created.headers["X-Request-Id"] in {e["requestId"] for e in mine}
    assert any(e["verb"] == "create" and e["code"] == "403" and e["name"] == "" for e in log)  # the viewer's
    assert any(e["transport"] == "grpc" and e["verb"] == "createtoken" and e["code"] == "OK"
               and e["resource"] == "CreateTokenRequest" and e["project"] == "default" for e in log)
    text = "".join(p.read_text() for p in c.data_dir.glob("audit.log*"))
    for secret_text in (MARKER, base64.b64encode(MARKER.encode()).decode(), editor.split("_", 2)[2],
                        minted.secret.split("_", 2)[2], c.token.split("_", 2)[2]):
        assert secret_text not in text
    assert stat.S_IMODE((c.data_dir / "audit.log").stat().st_mode) == 0o600

    # An operator's query, while the coordinator runs: the editor's writes, then only the refused ones.
    asked = query(c, "--token", editor_id)
    assert [(e["verb"], e["name"]) for e in asked] == [(e["verb"], e["name"]) for e in mine]
    assert [e["code"] for e in query(c, "--token", editor_id, "--refused")] == ["NOT_FOUND"]
    first = mine[1]["time"]
    assert [e["name"] for e in query(c, "--token", editor_id, "--since", first)] == ["s", "audited", "never-there"]
    assert query(c, "--project", "default", "--verb", "createtoken")
    bad = subprocess.run([str(BIN / "nodus-coordinator"), "audit", "query", "--data-dir", str(c.data_dir),
                          "--since", "yesterday"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "is not an RFC 3339 time" in bad.stderr


def test_the_audit_log_rotates_by_size(c: Coordinator) -> None:
    s = c.session()
    for i in range(60):  # ~200 bytes a line: past 8Ki
        assert s.post(c.url(JOBS), json=job(f"rot-{i}")).status_code == 201
    rotated = sorted(p.name for p in c.data_dir.glob("audit.log.*"))
    assert rotated and set(rotated) <= {"audit.log.1", "audit.log.2", "audit.log.3"}
    assert all(p.stat().st_size <= 8 * 1024 for p in c.data_dir.glob("audit.log*"))
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in c.data_dir.glob("audit.log*"))
    names = {e["name"] for e in entries(c)}
    assert "rot-59" in names
    # The query reads the rotations oldest first: what is kept of the burst comes back in order.
    kept = [int(e["name"][4:]) for e in query(c, "--verb", "create") if e["name"].startswith("rot-")]
    assert kept == sorted(kept) and kept[-1] == 59 and len(kept) > 1
