"""`nodus.client` from a notebook's point of view, against a real coordinator and agent: submit a Job
(a dict or a YAML file), watch its progress to the end from one watch, read its log, download its
output (verified against the committed sha256), and see a refusal as an error naming the field and fix."""
from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml
import zstandard

from conftest import Coordinator
from e2e import start_agent
from nodus.client import Nodus, NodusClientError

PROGRAM = """
import json, os, time
for step in range(1, 6):
    time.sleep(0.3)
    with open(os.environ["NODUS_PROGRESS"], "a") as f:
        f.write(json.dumps({"stage": "count", "units": {"completed": step, "total": 5}}) + "\\n")
with open(os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "answer.txt"), "w") as f:
    f.write("42\\n")
print("counted to 5")
"""


def test_a_notebook_submits_watches_reads_the_log_and_downloads(coordinator: Coordinator, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({
        "apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "nb"},
        "spec": {"command": ["python3", "-c", PROGRAM], "resources": {"cpu": "1", "memory": "256Mi"}}}))
    nodus = Nodus(coordinator.kubeconfig)
    assert nodus.project == "default"
    with start_agent(coordinator, tmp_path / "agent"):
        submitted = nodus.submit(spec_file)
        assert submitted.name == "nb" and not submitted.done
        seen = list(nodus.watch("nb"))
        final = seen[-1]
        assert final.succeeded and final.phase == "Succeeded", final
        assert final.units_completed == 5 and final.units_total == 5
        assert [s.units_completed for s in seen] == sorted(s.units_completed for s in seen), "progress only grows"
        assert len(seen) >= 3, "the watch reports the changes on the way, not only the end"
        assert nodus.wait("nb").succeeded, "waiting on an ended Job returns at once"
        assert "counted to 5" in nodus.logs("nb")

        archive = nodus.download("nb", "outputs", tmp_path / "outputs.tar.zst")
        with zstandard.open(archive, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            members = {m.name.lstrip("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                       for m in tar if m.isfile()}
        assert members == {"answer.txt": b"42\n"}

        assert [j.name for j in nodus.list()] == ["nb"]
        nodus.delete("nb")
        with pytest.raises(NodusClientError) as gone:
            nodus.get("nb")
        assert 'jobs.nodus.dev "nb" not found' in gone.value.message


def test_a_refused_job_raises_with_the_field_and_the_fix(coordinator: Coordinator) -> None:
    nodus = Nodus(coordinator.kubeconfig)
    with pytest.raises(NodusClientError) as refused:
        nodus.submit({"metadata": {"name": "bad"}, "spec": {"command": ["true"], "completions": 0}})
    assert "spec.completions" in refused.value.message and refused.value.fix
    with pytest.raises(NodusClientError) as wrong_kind:
        nodus.submit({"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "s"}})
    assert "submit takes a Job" in wrong_kind.value.message
    estimate = nodus.submit({"metadata": {"name": "priced"}, "spec": {"command": ["true"]}}, dry_run=True)
    assert estimate.name == "priced"
    with pytest.raises(NodusClientError):
        nodus.get("priced")  # a dry run creates nothing
