"""GPU health (issue 16 item 6): the agent judges each GPU from its NVML readings, the node's GpusHealthy
condition names an unhealthy one, it gets no new work, and an attempt already running on it gets a
GpuUnhealthy warning in its status (and its Job a GpuHealthy=False condition) without being stopped.

The rules are checked on readings and through NVML's fake binding; end to end, real agents with
simulated GPUs report faults from `--simulate-gpu-faults FILE` (the readings a failing GPU gives)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agent_double import AgentProcess, wait_for
from conftest import BIN, Coordinator
from e2e import AGENT_ENV, attempts_of, create, joined, status, wait_status
from nodus.agent.gpu_health import GpuFault, HealthRules, judge
from nodus.agent.nvml import Nvml, SimulatedNvml, load_faults
from nodus.agent.settings import SimulatedGpus
from nodus.coordinator.controllers.gpu_warnings import warnings_for
from nodus.coordinator.controllers.job_status import gpu_condition
from nodus.coordinator.controllers.views import AttemptView
from nodus.coordinator.node_api import gpus_condition
from nodus.v1 import common_pb2
from test_agent_inventory import A10, H100, fake_pynvml

pytestmark = pytest.mark.timeout(240)


def gpu(**fields: Any) -> common_pb2.Gpu:
    g = common_pb2.Gpu(index=1, name="NVIDIA H100 80GB HBM3", uuid="GPU-1")
    for key, value in fields.items():
        if key == "xids":
            g.xid_events.extend(common_pb2.XidEvent(code=c) for c in value)
        elif key == "ecc":
            g.ecc.volatile_uncorrected = value
        elif key == "remap":
            g.remapped_rows.pending, g.remapped_rows.failure = value
        else:
            setattr(g, key, value)
    return g


def test_each_fault_names_the_gpu_and_the_fix() -> None:
    assert judge(gpu(temperature_c=60)) == ("", "")
    reason, message = judge(gpu(xids=[79]))
    assert reason == GpuFault.XID_ERROR.value and "GPU 1 reported Xid 79" in message
    assert judge(gpu(ecc=3))[0] == "UncorrectableEccErrors" and "3 uncorrectable" in judge(gpu(ecc=3))[1]
    assert judge(gpu(remap=(True, False)))[0] == "RowRemapPending"
    assert judge(gpu(remap=(False, True)))[0] == "RowRemapFailed"
    reason, message = judge(gpu(temperature_c=92))
    assert reason == "Overheating" and "92 °C" in message and "--gpu-max-temperature" in message
    assert judge(gpu(temperature_c=92), HealthRules(max_temperature_c=95)) == ("", "")
    # A program's own faults (an illegal address, 13 and 31) leave the GPU healthy; the device's first wins.
    assert judge(gpu(xids=[13, 31, 43])) == ("", "")
    assert judge(gpu(xids=[13, 48], ecc=2, temperature_c=99))[0] == "XidError"


def test_an_xid_from_nvml_marks_the_reading_unhealthy() -> None:
    nvml = Nvml(module=fake_pynvml([A10, A10]))
    assert all(not g.unhealthy_reason for g in nvml.read())
    nvml.record_xid(SimpleNamespace(device=nvml.handles[0], eventData=79))
    first, *rest = nvml.read()
    assert first.unhealthy_reason == "XidError" and "Xid 79" in first.unhealthy_message
    assert all(not g.unhealthy_reason for g in rest)
    nvml.mark_unhealthy("StaleCdiSpec", "the spec names a device that is gone")  # host-wide: ahead of its own
    assert {g.unhealthy_reason for g in nvml.read()} == {"StaleCdiSpec"}
    nvml.close()
    failed_remap = Nvml(module=fake_pynvml([H100]))  # the fake H100's row remapping failed
    assert [g.unhealthy_reason for g in failed_remap.read()] == ["RowRemapFailed"]
    failed_remap.close()


def test_simulated_faults_are_read_at_every_reading(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    nvml = SimulatedNvml(SimulatedGpus("H100", 2, 80 << 30), faults=faults)
    assert [g.unhealthy_reason for g in nvml.read()] == ["", ""]
    faults.write_text(json.dumps({"1": {"xidEvents": [{"code": 79}]}}))
    assert [g.unhealthy_reason for g in nvml.read()] == ["", "XidError"]
    assert nvml.read()[1].simulated and nvml.read()[1].uuid == "GPU-simulated-1"
    faults.write_text("{not json")  # the last good faults stay in force
    assert [g.unhealthy_reason for g in nvml.read()] == ["", "XidError"]
    faults.write_text(json.dumps({"0": {"temperatureC": 95}}))
    assert [g.unhealthy_reason for g in nvml.read()] == ["Overheating", ""]
    faults.unlink()
    assert [g.unhealthy_reason for g in nvml.read()] == ["", ""]
    for bad, word in (({"2": {}}, "index of a simulated GPU"), ({"0": {"temperature": 1}}, "GPU 0"),
                      ([1], "object")):
        faults.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=word):
            load_faults(faults, 2)


def test_the_flag_needs_simulated_gpus_and_a_file_that_parses(tmp_path: Path, coordinator: Coordinator) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text('{"5": {}}')
    token = tmp_path / "token"
    token.write_text("x")
    base = [str(BIN / "nodus-agent"), "--coordinator", coordinator.grpc, "--join-token-file", str(token),
            "--work-dir", str(tmp_path / "w")]
    out = subprocess.run([*base, "--simulate-gpu-faults", str(faults)], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--simulate-gpu-faults needs --simulate-gpus" in out.stderr
    out = subprocess.run([*base, "--simulate-gpus", "H100:2", "--simulate-gpu-faults", str(faults)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "'5' is not the index of a simulated GPU (0 to 1)" in out.stderr
    out = subprocess.run([*base, "--gpu-max-temperature", "500"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--gpu-max-temperature 500" in out.stderr


def _attempt(gpus: list[int], warnings: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "j-0-1", "namespace": "default"},
            "spec": {"node": "n1", "gpuIndexes": gpus, "job": "j"},
            "status": {"phase": "Running", **({"warnings": warnings} if warnings else {})}}


def test_the_warning_follows_the_gpus_the_attempt_holds() -> None:
    other = {"code": "Other", "message": "kept"}
    assert warnings_for(_attempt([0]), {0: "", 1: "XidError: Xid 79"}) == []
    (w,) = warnings_for(_attempt([1]), {1: "XidError: GPU 1 reported Xid 79"})
    assert w["code"] == "GpuUnhealthy" and 'GPU 1 on node "n1"' in w["message"] and "Xid 79" in w["message"]
    assert warnings_for(_attempt([1], [w, other]), {1: ""}) == [other]
    view = AttemptView.from_object(_attempt([1], [w]))
    conditions = gpu_condition([], [view], 100.0, 1)
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [("GpuHealthy", "False", "GpuUnhealthy")]
    assert "attempt j-0-1" in conditions[0]["message"]
    healed = gpu_condition(conditions, [AttemptView.from_object(_attempt([1]))], 200.0, 1)
    assert [(c["type"], c["status"]) for c in healed] == [("GpuHealthy", "True")]
    assert gpu_condition([], [AttemptView.from_object(_attempt([1]))], 1.0, 1) == []  # never had one: none


def test_the_node_condition_names_every_unhealthy_gpu() -> None:
    healthy = gpus_condition([gpu(index=0)])
    assert (healthy.type, healthy.status) == ("GpusHealthy", "True")
    bad = gpu(unhealthy_reason="Overheating", unhealthy_message="GPU 1 is at 95 °C")
    cond = gpus_condition([gpu(index=0), bad])
    assert (cond.status, cond.reason) == ("False", "Overheating")
    assert "GPU 1 (GPU-1): Overheating: GPU 1 is at 95 °C" in cond.message and "no new work" in cond.message


def _nodes(c: Coordinator) -> dict[str, dict[str, Any]]:
    listed = json.loads(c.run("nodus", "node", "ls", "-o", "json").stdout)
    return {n["name"]: n for n in listed}


def _gpus_healthy(node: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in node.get("conditions") or [] if c["type"] == "GpusHealthy")


def test_an_unhealthy_gpu_gets_no_new_work_and_its_running_attempt_a_warning(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold = ["python3", "-c", f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.1)"]
    one_gpu = {"gpu": {"count": 1}}
    faults = tmp_path / "faults-a.json"
    with Coordinator(tmp_path / "data").start() as c:
        a = AgentProcess(tmp_path / "a", c.grpc, c.join_token, node="gpu-a", env=AGENT_ENV,
                         extra_args=("--simulate-gpus", "A100:1", "--simulate-gpu-faults", str(faults))).start()
        b = AgentProcess(tmp_path / "b", c.grpc, c.join_token, node="gpu-b", env=AGENT_ENV,
                         extra_args=("--simulate-gpus", "A100:1")).start()
        with joined([a, b], c):
            assert _gpus_healthy(_nodes(c)["gpu-a"])["status"] == "True"
            create(c, "busy", command=hold, resources=one_gpu)
            wait_status(c, "busy", lambda s: s.get("phase") == "Running", what="the busy Job to run")
            (busy,) = attempts_of(c, "busy")
            assert busy["spec"]["node"] == "gpu-a", "equal nodes: the first by name"

            stamp = Timestamp()
            stamp.GetCurrentTime()
            faults.write_text(json.dumps({"0": {"xidEvents": [{"code": 79, "time": stamp.ToJsonString()}]}}))
            cond = wait_for(lambda: (x := _gpus_healthy(_nodes(c)["gpu-a"]))["status"] == "False" and x, 30,
                            interval=0.2, what="gpu-a's GpusHealthy condition to turn False")
            assert cond["reason"] == "XidError" and "GPU 0 (GPU-simulated-0)" in cond["message"]
            assert "no new work" in cond["message"]
            listed = c.run("nodus", "node", "ls").stdout
            assert "XidError" in listed, listed

            def warned() -> list[dict[str, Any]]:
                (attempt,) = attempts_of(c, "busy")
                return list((attempt.get("status") or {}).get("warnings") or [])
            (w,) = wait_for(warned, 30, interval=0.2, what="the running attempt's GpuUnhealthy warning")
            assert w["code"] == "GpuUnhealthy" and 'GPU 0 on node "gpu-a"' in w["message"] and "Xid 79" in w["message"]
            job_cond = wait_for(lambda: next((x for x in status(c, "busy").get("conditions") or []
                                              if x["type"] == "GpuHealthy" and x["status"] == "False"), None), 30,
                                interval=0.2, what="the Job's GpuHealthy=False condition")
            assert job_cond["reason"] == "GpuUnhealthy"
            assert status(c, "busy")["phase"] == "Running", "a warning stops nothing"

            # New work goes to the healthy node even though gpu-a's GPU is the one that would be freed first.
            gate.touch()
            wait_status(c, "busy", lambda s: s.get("phase") == "Succeeded", what="the busy Job to finish")
            create(c, "next", command=["true"], resources=one_gpu)
            wait_status(c, "next", lambda s: s.get("phase") == "Succeeded", what="the next Job to run")
            assert [x["spec"]["node"] for x in attempts_of(c, "next")] == ["gpu-b"]

            faults.unlink()  # the GPU reads healthy again: the node takes work again
            wait_for(lambda: _gpus_healthy(_nodes(c)["gpu-a"])["status"] == "True", 30, interval=0.2,
                     what="gpu-a's GpusHealthy condition to turn True again")
