"""The `nodus` CLI against a running coordinator: apply, get, delete, watch."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, Coordinator

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "job.yaml"


@pytest.fixture(scope="module")
def c(shared_coordinator: Coordinator) -> Coordinator:
    return shared_coordinator


def test_apply_creates_then_reports_unchanged_then_configured(c: Coordinator, tmp_path: Path) -> None:
    assert c.run("nodus", "apply", "-f", str(EXAMPLE)).stdout.strip() == "job.nodus.dev/hello created"
    assert c.run("nodus", "apply", "-f", str(EXAMPLE)).stdout.strip() == "job.nodus.dev/hello unchanged"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["parallelism"] = 3
    changed = tmp_path / "job.yaml"
    changed.write_text(yaml.safe_dump(doc))
    assert c.run("nodus", "apply", "-f", str(changed)).stdout.strip() == "job.nodus.dev/hello configured"
    shown = yaml.safe_load(c.run("nodus", "get", "job", "hello", "-o", "yaml").stdout)
    assert shown["spec"]["parallelism"] == 3 and shown["spec"]["backoffLimit"] == 6
    assert "\n  - |" in c.run("nodus", "get", "job", "hello", "-o", "yaml").stdout  # scripts stay readable


def test_apply_refusal_is_one_line_plus_fix(c: Coordinator, tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "cli-bad"
    doc["spec"]["completions"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = c.run("nodus", "apply", "-f", str(bad), check=False)
    assert out.returncode == 1
    first, second = out.stderr.splitlines()[:2]
    assert first.startswith("error: ") and "spec.completions: Invalid value: 0" in first
    assert second.startswith("  fix: ") and "spec.completions" in second


def test_get_prints_a_table_and_delete_removes(c: Coordinator, tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "cli-table"
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    c.run("nodus", "apply", "-f", str(path))
    lines = c.run("nodus", "get", "jobs").stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "PHASE", "COMPLETIONS"]
    row = next(line for line in lines if line.startswith("cli-table"))
    assert "0/3" in row
    wide = c.run("nodus", "get", "jobs", "-o", "wide").stdout.splitlines()[0]
    assert "REASON" in wide
    assert c.run("nodus", "get", "jobs", "-A").stdout.splitlines()[0].startswith("PROJECT")
    assert 'job.nodus.dev "cli-table" deleted' in c.run("nodus", "delete", "job", "cli-table").stdout
    assert c.run("nodus", "get", "job", "cli-table", check=False).returncode == 1


def test_watch_prints_changes(c: Coordinator, tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(c.kubeconfig), "NODUS_KUBECONFIG": str(c.kubeconfig), "PATH": str(BIN)}
    proc = subprocess.Popen([str(BIN / "nodus"), "watch", "jobs", "cli-watch"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"]["name"] = "cli-watch"
        path = tmp_path / "w.yaml"
        path.write_text(yaml.safe_dump(doc))
        deadline = time.monotonic() + 20
        seen: list[str] = []
        assert proc.stdout is not None
        c.run("nodus", "apply", "-f", str(path))
        c.run("nodus", "delete", "job", "cli-watch")
        while time.monotonic() < deadline and not any("(deleted)" in s for s in seen):
            seen.append(proc.stdout.readline())
        assert seen[0].split()[:2] == ["NAME", "PHASE"]
        assert seen[1].startswith("cli-watch ")
        assert any(s.startswith("cli-watch (deleted)") for s in seen)
    finally:
        proc.kill()
        proc.wait()


def test_operator_verbs_find_the_grpc_address_in_the_kubeconfig(c: Coordinator, tmp_path: Path) -> None:
    """No --coordinator and no $NODUS_COORDINATOR: the operator verbs reach the coordinator through the
    address its kubeconfig names (the gRPC port here is an ephemeral one, not 7070)."""
    cluster = yaml.safe_load(c.kubeconfig.read_text())["clusters"][0]["cluster"]
    assert cluster["extensions"] == [{"name": "nodus.dev/grpc", "extension": {"address": c.grpc}}]
    token = c.run("nodus", "token", "create", "--project", "default", "--role", "viewer",
                  env={"NODUS_COORDINATOR": ""}).stdout.strip()
    assert token and c.session(token).get(c.url("/apis/nodus.dev/v1/namespaces/default/jobs"), timeout=10).ok
    # A kubeconfig copied away from the data dir without the extension says which address it tried.
    del cluster["extensions"]
    copy = tmp_path / "elsewhere" / "kubeconfig"
    copy.parent.mkdir()
    config = yaml.safe_load(c.kubeconfig.read_text())
    config["clusters"][0]["cluster"] = cluster
    copy.write_text(yaml.safe_dump(config))
    refused = c.run("nodus", "--kubeconfig", str(copy), "token", "create", "--project", "default", "--role", "viewer",
                    check=False, env={"NODUS_COORDINATOR": ""})
    assert refused.returncode != 0 and "127.0.0.1:7070" in refused.stderr, refused.stderr
