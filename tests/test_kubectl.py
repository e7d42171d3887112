"""A real kubectl (the venv's, v1.37) against a running coordinator: what a user sees and types.

Every test shares one module-scoped coordinator and uses its own object names. Long-running commands
(`get -w`, `wait`) run as subprocesses whose output is polled; no test sleeps for a fixed time.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from conftest import BIN, Coordinator, job


# ---- helpers -------------------------------------------------------------------------------------

def kubectl(c: Coordinator, *args: str, check: bool = True, input: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return c.run("kubectl", *args, check=check, input=input, timeout=timeout)


def create(c: Coordinator, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl(c, "create", "-f", "-", input=yaml.safe_dump(obj))


def get_json(c: Coordinator, kind: str, name: str) -> dict[str, Any]:
    return json.loads(kubectl(c, "get", kind, name, "-o", "json").stdout)


def refused(c: Coordinator, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs a kubectl command that must fail and returns its result."""
    result = kubectl(c, *args, check=False, input=input)
    assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded:\n{result.stdout}"
    return result


class Background:
    """A kubectl process left running (watch, wait) whose stdout and stderr are polled from files."""

    def __init__(self, c: Coordinator, tmp_path: Path, *args: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "HOME": str(c.data_dir.parent)}
        self.out_path, self.err_path = tmp_path / "bg.out", tmp_path / "bg.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([str(BIN / "kubectl"), *args], stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    def until(self, ready: Callable[[], bool], what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\nstdout:\n{self.out}\nstderr:\n{self.err}")
            if self.proc.poll() is not None and not ready():
                raise AssertionError(f"kubectl exited {self.proc.returncode} before {what}\n"
                                     f"stdout:\n{self.out}\nstderr:\n{self.err}")
            time.sleep(0.05)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def background(shared_coordinator: Coordinator, tmp_path: Path) -> Iterator[Callable[..., Background]]:
    started: list[Background] = []

    def start(*args: str) -> Background:
        sub = tmp_path / str(len(started))
        sub.mkdir()
        bg = Background(shared_coordinator, sub, *args)
        started.append(bg)
        return bg

    try:
        yield start
    finally:
        for bg in started:
            bg.stop()


def rows(output: str, name: str) -> list[list[str]]:
    """The table rows whose first column is `name`, split into cells."""
    return [line.split() for line in output.splitlines() if line.split()[:1] == [name]]


# ---- discovery -----------------------------------------------------------------------------------

def test_api_resources_lists_the_nodus_kinds(shared_coordinator: Coordinator) -> None:
    out = kubectl(shared_coordinator, "api-resources").stdout
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    table = {line.split()[0]: line.split() for line in lines}
    expected = {"jobs": ("nodus.dev/v1", "Job"), "sweeps": ("nodus.dev/v1", "Sweep"),
                "secrets": ("nodus.dev/v1", "Secret"),
                "trainingjobs": ("nodus.dev/v1beta1", "TrainingJob"),
                "trainingruntimes": ("nodus.dev/v1beta1", "TrainingRuntime")}
    for plural, (group_version, kind) in expected.items():
        assert plural in table, out
        cells = table[plural]
        assert cells[-1] == kind and cells[-2] == "true" and cells[-3] == group_version, out

    names = kubectl(shared_coordinator, "api-resources", "--api-group=nodus.dev", "-o", "name").stdout.split()
    assert {"jobs.nodus.dev", "sweeps.nodus.dev", "secrets.nodus.dev", "trainingjobs.nodus.dev",
            "trainingruntimes.nodus.dev"} <= set(names)


# ---- create, get, apply --------------------------------------------------------------------------

def test_create_then_get_as_table_json_and_across_namespaces(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    out = create(c, job("kc-create", completions=4, parallelism=2))
    assert out.stdout.strip() == "job.nodus.dev/kc-create created"

    table = kubectl(c, "get", "jobs").stdout
    header = table.splitlines()[0].split()
    assert header[:3] == ["NAME", "PHASE", "COMPLETIONS"] and "AGE" in header, table
    (row,) = rows(table, "kc-create")
    assert row[header.index("COMPLETIONS")] == "0/4", table

    obj = get_json(c, "job", "kc-create")
    assert obj["apiVersion"] == "nodus.dev/v1" and obj["kind"] == "Job"
    assert obj["metadata"]["name"] == "kc-create" and obj["metadata"]["namespace"] == "default"
    assert obj["metadata"]["resourceVersion"] and obj["metadata"]["uid"]
    assert obj["spec"]["completions"] == 4 and obj["spec"]["parallelism"] == 2
    assert obj["spec"]["command"] == ["python3", "-c", "print('hi')"]
    assert obj["spec"]["backoffLimit"] == 6, "defaults are written into the stored object"

    everywhere = kubectl(c, "get", "jobs", "-A").stdout
    assert everywhere.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"], everywhere
    assert any(line.split()[:2] == ["default", "kc-create"] for line in everywhere.splitlines()), everywhere

    # The short name and the fully qualified resource name reach the same object.
    assert "kc-create" in kubectl(c, "get", "nj", "kc-create").stdout
    assert "kc-create" in kubectl(c, "get", "jobs.nodus.dev", "kc-create", "-o", "name").stdout

    again = refused(c, "create", "-f", "-", input=yaml.safe_dump(job("kc-create")))
    assert "AlreadyExists" in again.stderr and '"kc-create" already exists' in again.stderr, again.stderr


def test_apply_creates_then_is_unchanged_then_configured(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    manifest = job("kc-apply", completions=4, parallelism=2)
    assert kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout.strip() == \
        "job.nodus.dev/kc-apply created"
    first = get_json(c, "job", "kc-apply")
    assert "kubectl.kubernetes.io/last-applied-configuration" in first["metadata"]["annotations"]

    assert kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout.strip() == \
        "job.nodus.dev/kc-apply unchanged"
    assert get_json(c, "job", "kc-apply")["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    manifest["spec"]["parallelism"] = 3
    assert kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout.strip() == \
        "job.nodus.dev/kc-apply configured"
    after = get_json(c, "job", "kc-apply")
    assert after["spec"]["parallelism"] == 3
    assert after["metadata"]["generation"] == first["metadata"]["generation"] + 1


# ---- watch ---------------------------------------------------------------------------------------

def test_get_watch_prints_the_updated_row(shared_coordinator: Coordinator, background: Any) -> None:
    c = shared_coordinator
    create(c, job("kc-watch", completions=4, parallelism=2))
    watch = background("get", "jobs", "-w", "--request-timeout=30s")
    watch.until(lambda: len(rows(watch.out, "kc-watch")) == 1, "the initial row")
    assert watch.out.splitlines()[0].split()[:3] == ["NAME", "PHASE", "COMPLETIONS"]

    kubectl(c, "patch", "job", "kc-watch", "--type", "merge", "-p", '{"spec":{"parallelism":3}}')
    watch.until(lambda: len(rows(watch.out, "kc-watch")) >= 2, "the updated row")
    update = rows(watch.out, "kc-watch")[1]
    assert update[2] == "0/4", watch.out  # the watch event is printed as a table row too
    assert watch.proc.poll() is None, "the watch stays open"


def test_get_watch_custom_columns_shows_the_new_value(shared_coordinator: Coordinator, background: Any) -> None:
    c = shared_coordinator
    create(c, job("kc-watch-col", completions=4, parallelism=2))
    watch = background("get", "jobs", "kc-watch-col", "-w", "--request-timeout=30s",
                       "-o", "custom-columns=NAME:.metadata.name,PAR:.spec.parallelism")
    watch.until(lambda: ["kc-watch-col", "2"] in rows(watch.out, "kc-watch-col"), "the initial row")
    kubectl(c, "patch", "job", "kc-watch-col", "--type", "merge", "-p", '{"spec":{"parallelism":4}}')
    watch.until(lambda: ["kc-watch-col", "4"] in rows(watch.out, "kc-watch-col"), "the updated row")


def test_get_watch_events_show_modified_and_deleted(shared_coordinator: Coordinator, background: Any) -> None:
    c = shared_coordinator
    create(c, job("kc-watch-ev"))
    watch = background("get", "jobs", "-w", "--output-watch-events", "--request-timeout=30s")

    def events() -> list[str]:
        return [line.split()[0] for line in watch.out.splitlines() if line.split()[1:2] == ["kc-watch-ev"]]

    watch.until(lambda: events() == ["ADDED"], "the initial ADDED row")
    kubectl(c, "label", "job", "kc-watch-ev", "stage=two")
    watch.until(lambda: "MODIFIED" in events(), "the MODIFIED row")
    kubectl(c, "delete", "job", "kc-watch-ev", timeout=30)
    watch.until(lambda: events()[-1:] == ["DELETED"], "the DELETED row")


# ---- patch ---------------------------------------------------------------------------------------

def test_patch_merge_and_json(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    create(c, job("kc-patch", completions=8, parallelism=2))
    out = kubectl(c, "patch", "job", "kc-patch", "--type", "merge", "-p", '{"spec":{"parallelism":5}}')
    assert out.stdout.strip() == "job.nodus.dev/kc-patch patched"
    assert get_json(c, "job", "kc-patch")["spec"]["parallelism"] == 5

    out = kubectl(c, "patch", "job", "kc-patch", "--type", "json",
                  "-p", '[{"op":"replace","path":"/spec/parallelism","value":7}]')
    assert out.stdout.strip() == "job.nodus.dev/kc-patch patched"
    before = get_json(c, "job", "kc-patch")
    assert before["spec"]["parallelism"] == 7

    # A patch that changes nothing keeps the resourceVersion, so kubectl says so.
    out = kubectl(c, "patch", "job", "kc-patch", "--type", "merge", "-p", '{"spec":{"parallelism":7}}')
    assert out.stdout.strip() == "job.nodus.dev/kc-patch patched (no change)"
    assert get_json(c, "job", "kc-patch")["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # A merge patch with an unknown field is refused under kubectl's fieldValidation=Strict.
    bad = refused(c, "patch", "job", "kc-patch", "--type", "merge", "-p", '{"spec":{"paralelism":3}}')
    assert "spec.paralelism" in bad.stderr, bad.stderr

    missing = refused(c, "patch", "job", "kc-no-such-job", "--type", "merge", "-p", '{"spec":{"parallelism":3}}')
    assert "NotFound" in missing.stderr and '"kc-no-such-job" not found' in missing.stderr, missing.stderr


def test_strategic_merge_patch_fails_clearly(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    create(c, job("kc-strategic", completions=4, parallelism=2))
    result = refused(c, "patch", "job", "kc-strategic", "-p", '{"spec":{"parallelism":3}}')
    assert "strategic-merge-patch+json" in result.stderr and "not supported" in result.stderr, result.stderr
    assert "panic" not in result.stderr
    assert get_json(c, "job", "kc-strategic")["spec"]["parallelism"] == 2


# ---- delete and wait -----------------------------------------------------------------------------

def test_delete_removes_the_job(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    create(c, job("kc-delete"))
    out = kubectl(c, "delete", "job", "kc-delete", timeout=30)
    assert 'job.nodus.dev "kc-delete" deleted' in out.stdout
    gone = refused(c, "get", "job", "kc-delete")
    assert 'Error from server (NotFound): jobs.nodus.dev "kc-delete" not found' in gone.stderr, gone.stderr
    assert "kc-delete" not in kubectl(c, "get", "jobs", "-o", "name").stdout
    again = refused(c, "delete", "job", "kc-delete")
    assert "NotFound" in again.stderr


def test_wait_for_delete_returns_once_deleted(shared_coordinator: Coordinator, background: Any) -> None:
    c = shared_coordinator
    create(c, job("kc-wait-del"))
    # -v=6 logs each response; the watch request shows the wait is in place before the delete.
    wait = background("wait", "--for=delete", "job/kc-wait-del", "--timeout=20s", "-v=6")
    wait.until(lambda: "watch=true" in wait.err, "the wait's watch")
    assert wait.proc.poll() is None, f"wait returned before the delete:\n{wait.out}\n{wait.err}"

    kubectl(c, "delete", "job", "kc-wait-del", "--wait=false")
    assert wait.wait(20) == 0, wait.err
    assert "job.nodus.dev/kc-wait-del condition met" in wait.out


def test_wait_for_jsonpath_after_patch(shared_coordinator: Coordinator, background: Any) -> None:
    c = shared_coordinator
    create(c, job("kc-wait-jp", completions=5, parallelism=1))
    wait = background("wait", "--for=jsonpath={.spec.parallelism}=3", "job/kc-wait-jp", "--timeout=20s", "-v=6")
    wait.until(lambda: "watch=true" in wait.err, "the wait's watch")
    assert wait.proc.poll() is None, f"wait returned before the patch:\n{wait.out}\n{wait.err}"

    kubectl(c, "patch", "job", "kc-wait-jp", "--type", "merge", "-p", '{"spec":{"parallelism":3}}')
    assert wait.wait(20) == 0, wait.err
    assert "job.nodus.dev/kc-wait-jp condition met" in wait.out


def test_wait_honours_the_name(shared_coordinator: Coordinator) -> None:
    """Another job already at parallelism 3 must not satisfy a wait for this one."""
    c = shared_coordinator
    create(c, job("kc-wait-other", completions=5, parallelism=3))
    create(c, job("kc-wait-this", completions=5, parallelism=1))
    result = kubectl(c, "wait", "--for=jsonpath={.spec.parallelism}=3", "job/kc-wait-this", "--timeout=1s",
                     check=False)
    assert result.returncode != 0, result.stdout
    assert "timed out" in result.stderr, result.stderr


# ---- explain -------------------------------------------------------------------------------------

def test_explain_job_spec_completions(shared_coordinator: Coordinator) -> None:
    out = kubectl(shared_coordinator, "explain", "job.spec.completions").stdout
    assert "KIND:       Job" in out and "GROUP:      nodus.dev" in out, out
    assert "FIELD: completions <integer>" in out, out
    assert "how many indexes must succeed" in out and "1–10000" in out, out


def test_explain_trainingjob_spec(shared_coordinator: Coordinator) -> None:
    out = kubectl(shared_coordinator, "explain", "trainingjob.spec").stdout
    assert "KIND:       TrainingJob" in out and "VERSION:    v1beta1" in out, out
    assert "FIELD: spec <Object>" in out and "FIELDS:" in out, out


# ---- validation ----------------------------------------------------------------------------------

def test_invalid_object_names_the_field(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    result = refused(c, "create", "-f", "-", input=yaml.safe_dump(job("kc-bad", completions=0)))
    assert "spec.completions: Invalid value: 0" in result.stderr, result.stderr
    assert 'The Job "kc-bad" is invalid' in result.stderr and "must be between 1 and 10000" in result.stderr
    assert "error validating data" not in result.stderr, "validation is the server's, not kubectl's"
    assert "NotFound" in refused(c, "get", "job", "kc-bad").stderr

    applied = refused(c, "apply", "-f", "-", input=yaml.safe_dump(job("kc-bad", completions=0)))
    assert "spec.completions: Invalid value: 0" in applied.stderr, applied.stderr


def test_several_violations_are_all_listed(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    bad = job("kc-bad-many", completions=0, parallelism=0, backoffLimit=1000)
    result = refused(c, "create", "-f", "-", input=yaml.safe_dump(bad))
    causes = [line for line in result.stderr.splitlines() if line.startswith("* ")]
    assert "* spec.completions: Invalid value: 0: must be between 1 and 10000" in causes, result.stderr
    assert any(line.startswith("* spec.parallelism: Invalid value: 0") for line in causes), result.stderr
    assert any(line.startswith("* spec.backoffLimit: Invalid value: 1000") for line in causes), result.stderr
    assert len(causes) == 3, result.stderr


def test_unknown_field_is_refused_by_its_path(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    typo = job("kc-typo")
    typo["spec"]["comand"] = ["python3"]
    result = refused(c, "create", "-f", "-", input=yaml.safe_dump(typo))
    assert "spec.comand" in result.stderr and "Unknown field" in result.stderr, result.stderr
    result = refused(c, "apply", "-f", "-", input=yaml.safe_dump(typo))
    assert "spec.comand" in result.stderr, result.stderr

    nested = job("kc-typo-nested", placement={"profle": "Cost"})
    result = refused(c, "create", "-f", "-", input=yaml.safe_dump(nested))
    assert "spec.placement.profle" in result.stderr, result.stderr
    assert "NotFound" in refused(c, "get", "job", "kc-typo").stderr


def test_immutable_change_is_refused(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    create(c, job("kc-immutable", completions=4))
    result = refused(c, "patch", "job", "kc-immutable", "--type", "merge", "-p", '{"spec":{"completions":5}}')
    assert "spec.completions" in result.stderr and "immutable" in result.stderr, result.stderr
    assert get_json(c, "job", "kc-immutable")["spec"]["completions"] == 4

    manifest = job("kc-immutable", completions=4)
    manifest["spec"]["command"] = ["python3", "-c", "print('changed')"]
    result = refused(c, "apply", "-f", "-", input=yaml.safe_dump(manifest))
    assert "spec.command" in result.stderr and "immutable" in result.stderr, result.stderr


def test_max_cost_may_only_be_raised(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    create(c, job("kc-maxcost", maxCostUSD="10.00"))
    result = refused(c, "patch", "job", "kc-maxcost", "--type", "merge", "-p", '{"spec":{"maxCostUSD":"5.00"}}')
    assert "spec.maxCostUSD" in result.stderr and "may only be raised" in result.stderr, result.stderr
    assert get_json(c, "job", "kc-maxcost")["spec"]["maxCostUSD"] == "10.00"

    out = kubectl(c, "patch", "job", "kc-maxcost", "--type", "merge", "-p", '{"spec":{"maxCostUSD":"25.50"}}')
    assert out.stdout.strip() == "job.nodus.dev/kc-maxcost patched"
    assert get_json(c, "job", "kc-maxcost")["spec"]["maxCostUSD"] == "25.50"


# ---- secrets -------------------------------------------------------------------------------------

def test_secret_value_is_never_shown(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    value, other = "NODUS-TEST-SECRET-kc-value-8d1f2a", "NODUS-TEST-SECRET-kc-other-77c0e1"
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "kc-secret"},
              "stringData": {"HF_TOKEN": value}}
    out = kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(secret))
    assert out.stdout.strip() == "secret.nodus.dev/kc-secret created"

    shown = kubectl(c, "get", "secret", "kc-secret", "-o", "json").stdout
    assert value not in shown, shown
    obj = json.loads(shown)
    assert obj["kind"] == "Secret" and obj["apiVersion"] == "nodus.dev/v1"
    assert "stringData" not in obj and "data" not in obj, shown
    assert obj["status"]["keys"] == ["HF_TOKEN"]
    last_applied = obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert value not in last_applied
    assert value not in kubectl(c, "get", "secret", "kc-secret", "-o", "yaml").stdout
    assert value not in kubectl(c, "get", "secrets", "-A", "-o", "json").stdout

    # A new value makes a new version; still nothing of either value shows.
    secret["stringData"]["HF_TOKEN"] = other
    kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(secret))
    shown = kubectl(c, "get", "secret", "kc-secret", "-o", "json").stdout
    assert value not in shown and other not in shown, shown
    assert json.loads(shown)["status"]["version"] == 2


def test_secret_data_base64_is_never_shown(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    encoded = "Tk9EVVMtVEVTVC1TRUNSRVQta2MtYnl0ZXMtOTFl"  # base64 of "NODUS-TEST-SECRET-kc-bytes-91e"
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "kc-secret-data"},
              "data": {"KEY": encoded}}
    kubectl(c, "apply", "-f", "-", input=yaml.safe_dump(secret))
    shown = kubectl(c, "get", "secret", "kc-secret-data", "-o", "json").stdout
    assert encoded not in shown and "NODUS-TEST-SECRET-kc-bytes-91e" not in shown, shown
    assert json.loads(shown)["status"]["keys"] == ["KEY"]


def test_the_gang_example_is_accepted_and_its_gang_defaults_are_stored(shared_coordinator: Coordinator) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "gang.yaml"
    out = kubectl(shared_coordinator, "apply", "--dry-run=server", "-f", str(example), "-o", "json")
    stored = json.loads(out.stdout)
    dist = stored["spec"]["distributed"]
    assert dist == {"nodes": 2, "launcher": "Torchrun", "startupTimeout": "10m0s", "maxAssemblyRetries": 2,
                    "network": "Regional", "transport": "Auto"}, dist
