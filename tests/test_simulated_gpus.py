"""Simulated GPUs (`nodus-agent --simulate-gpus MODEL:COUNT[:MEMORY]`) and the offering check at
registration: a real agent that fits its offering joins with its GPUs shown simulated in NodeService's
listing (grpcurl); one that does not is refused with every difference named; without a price book any
offering id is accepted as before."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import yaml
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_double import AgentProcess, wait_for
from conftest import BIN, Coordinator, GrpcAddress
from e2e import start_agent
from nodus.agent.nvml import SimulatedNvml
from nodus.agent.settings import SimulatedGpus
from nodus.agent.x509 import new_key
from nodus.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from test_grpcurl import grpcurl

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pricebook.yaml"
DEV_OFFERING = "h100-sxm-80g-x1-dev"


def test_the_flag_is_parsed_and_the_gpus_are_marked_simulated() -> None:
    assert SimulatedGpus.parse("H100:8:80Gi") == SimulatedGpus("H100", 8, 80 << 30)
    assert SimulatedGpus.parse("L4:1:24G") == SimulatedGpus("L4", 1, 24 * 10**9)
    assert SimulatedGpus.parse("A100:2") == SimulatedGpus("A100", 2, 0)
    for bad, word in (("H100", "MODEL:COUNT"), ("H100:0", "COUNT"), ("H100:x:80Gi", "COUNT"),
                      ("H100:8:lots", "MEMORY"), (":8", "MODEL:COUNT")):
        with pytest.raises(ValueError, match=word):
            SimulatedGpus.parse(bad)
    nvml = SimulatedNvml(SimulatedGpus("H100", 2, 80 << 30))
    gpus = nvml.read()
    assert [(g.index, g.name, g.memory_bytes, g.simulated) for g in gpus] == [
        (0, "H100", 80 << 30, True), (1, "H100", 80 << 30, True)]
    assert len(nvml.handles) == 2 and len({g.uuid for g in gpus}) == 2
    nvml.close()


def _book_with_a_dev_offering(path: Path) -> Path:
    """The example book plus one H100 x1 offering whose host part this test machine fits."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    dev = dict(doc["offerings"][1], id=DEV_OFFERING, vcpu=1, memory="1Gi")
    doc["offerings"].append(dev)
    doc["pricebookVersion"] = "2026-12-01-dev"
    path.write_text(yaml.safe_dump(doc))
    return path


def _register(c: Coordinator, node: str, offering: str, gpus: int) -> grpc.RpcError:
    inventory = common_pb2.NodeInventory(
        hostname=node, offering=offering, runtimes=[common_pb2.RUNTIME_PROCESS],
        host=common_pb2.HostInventory(cpus=psutil.cpu_count() or 1, memory_bytes=psutil.virtual_memory().total),
        gpus=[common_pb2.Gpu(index=i, name="NVIDIA A100-SXM4-40GB", memory_bytes=40 << 30, simulated=True)
              for i in range(gpus)])
    with c.node_channel(node, new_key()) as channel:  # enrolled, as nodus-agent is before it registers
        with pytest.raises(grpc.RpcError) as raised:
            agent_pb2_grpc.AgentServiceStub(channel).Register(
                agent_pb2.RegisterRequest(node_name=node, inventory=inventory), timeout=10)
    return raised.value


def _reason(error: Any) -> str:
    status = rpc_status.from_call(error)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in status.details)
    return str(info.reason)


def test_a_node_joins_as_an_offering_it_fits_or_is_refused(tmp_path: Path) -> None:
    book = _book_with_a_dev_offering(tmp_path / "pricebook.yaml")
    with Coordinator(tmp_path / "data").start(extra_args=("--price-book", str(book))) as c:
        with start_agent(c, tmp_path / "fits", node="sim-fits",
                         extra_args=("--simulate-gpus", "H100:1:80Gi", "--offering", DEV_OFFERING)):
            nodes = json.loads(grpcurl(c, "nodus.v1.NodeService/ListNodes", {}, token=c.token).stdout)["nodes"]
            (node,) = [n for n in nodes if n["name"] == "sim-fits"]
            assert node["inventory"]["offering"] == DEV_OFFERING
            assert [(g["name"], g["memory_bytes"], g["simulated"]) for g in node["inventory"]["gpus"]] == [
                ("H100", str(80 << 30), True)]

            refused = AgentProcess(tmp_path / "short", c.grpc, c.join_token, node="sim-short",
                                   extra_args=("--simulate-gpus", "H100:4:80Gi", "--offering", "h100-sxm-80g-x8-us"),
                                   env={"NODUS_LOG_LEVEL": "DEBUG"})
            refused.start()
            try:
                wait_for(lambda: "OfferingMismatch" in refused.log(), 30, what="the refusal in the agent's log")
                wait_for(lambda: refused.log().count("reconnecting in") >= 3, 30, what="three refused retries")
                log = refused.log()
                # Said once, not once per retry (each refusal carries its own requestId).
                assert log.count("OfferingMismatch") == 1, log
                assert "GPUs: the node has 4, offering h100-sxm-80g-x8-us has 8" in log
                assert "vCPU: the node has" in log and "registered node" not in log
                nodes = json.loads(grpcurl(c, "nodus.v1.NodeService/ListNodes", {}, token=c.token).stdout)["nodes"]
                assert [n["name"] for n in nodes] == ["sim-fits"]

                # The operator corrects the offering in a new version; the retrying agent joins by itself.
                fixed = yaml.safe_load(book.read_text())
                fixed["pricebookVersion"] = "2026-12-01-dev2"
                x8 = next(o for o in fixed["offerings"] if o["id"] == "h100-sxm-80g-x8-us")
                x8.update(vcpu=1, memory="1Gi")
                x8["accelerator"]["gpusPerNode"] = 4
                (tmp_path / "fixed.yaml").write_text(yaml.safe_dump(fixed))
                c.run("nodus", "pricebook", "apply", "-f", str(tmp_path / "fixed.yaml"))
                wait_for(lambda: "registered node" in refused.log(), 30, what="the corrected node to register")
            finally:
                refused.reap()

        wrong_family = _register(c, "a100-host", DEV_OFFERING, gpus=1)
        assert wrong_family.code() == grpc.StatusCode.INVALID_ARGUMENT and _reason(wrong_family) == "OfferingMismatch"
        assert "GPU family: the node has A100, offering h100-sxm-80g-x1-dev has H100" in wrong_family.details()
        assert "GPU memory: the node's smallest GPU has 40.0Gi" in wrong_family.details()
        unknown = _register(c, "unknown-host", "tpu-v5-x4-us", gpus=0)
        assert _reason(unknown) == "OfferingMismatch" and "does not sell" in unknown.details()
        assert "cpu-2-8g-us" in unknown.details()


def test_without_a_price_book_any_offering_id_joins(coordinator: Coordinator, tmp_path: Path) -> None:
    with start_agent(coordinator, tmp_path / "a", node="free",
                     extra_args=("--simulate-gpus", "H100:4", "--offering", "h100-sxm-80g-x8-us")):
        nodes = json.loads(grpcurl(coordinator, "nodus.v1.NodeService/ListNodes", {},
                                   token=coordinator.token).stdout)["nodes"]
        assert [(n["name"], n["inventory"]["offering"], len(n["inventory"]["gpus"])) for n in nodes] == [
            ("free", "h100-sxm-80g-x8-us", 4)]


def test_nodus_up_with_a_price_book_and_simulated_gpus(tmp_path: Path) -> None:
    book = _book_with_a_dev_offering(tmp_path / "pricebook.yaml")
    data = tmp_path / "up"
    up = subprocess.Popen([str(BIN / "nodus"), "up", "--data-dir", str(data), "--http-listen", "127.0.0.1:0",
                           "--grpc-listen", "127.0.0.1:0", "--price-book", str(book), "--offering", DEV_OFFERING,
                           "--simulate-gpus", "H100:1:80Gi"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        agent_log = data / "agent.log"
        wait_for(lambda: agent_log.exists() and "registered node" in agent_log.read_text(), 60,
                 what="nodus up's agent to register")
        c = Coordinator(data / "coordinator")
        endpoints = json.loads((c.data_dir / "endpoints.json").read_text())
        c.grpc = GrpcAddress(endpoints["grpc"], c.data_dir / "tls" / "ca.crt")  # nodus up's gRPC is TLS
        c.token = yaml.safe_load(c.kubeconfig.read_text())["users"][0]["user"]["token"]
        assert json.loads(grpcurl(c, "nodus.v1.PriceBookService/GetPriceBook", {}, token=c.token).stdout)[
            "version"] == "2026-12-01-dev"
        (node,) = json.loads(grpcurl(c, "nodus.v1.NodeService/ListNodes", {}, token=c.token).stdout)["nodes"]
        assert node["inventory"]["offering"] == DEV_OFFERING and node["inventory"]["gpus"][0]["simulated"] is True
    finally:
        up.send_signal(signal.SIGTERM)
        printed = up.communicate(timeout=30)[0].decode()
    # What it printed: the endpoints, the admin token and the next commands to type.
    assert f"REST  {endpoints['http']}   gRPC  {endpoints['grpc']}" in printed, printed
    assert f"admin token: {c.token}" in printed and f"export KUBECONFIG={c.kubeconfig}" in printed, printed
    assert "nodus apply -f examples/job.yaml" in printed and "nodus logs -f" in printed, printed


@pytest.mark.slow
def test_a_gang_with_gpus_per_node_reserves_each_members_gpus(tmp_path: Path) -> None:
    """distributed.gpusPerNode without resources.gpu.count: every member reserves that many GPUs of its
    node and its program sees exactly them in CUDA_VISIBLE_DEVICES (it used to reserve none)."""
    from e2e import attempts_of, create, ended, fleet

    marks = tmp_path / "marks"
    marks.mkdir()
    with Coordinator(tmp_path / "data").start(extra_args=("--gang-probe-bytes", "1Mi")) as c, \
            fleet(c, tmp_path / "agents", 2, "gpu", "--simulate-gpus", "A100:4", "--offering", "a100-x4"):
        create(c, "per-node", command=["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {marks}/rank-$NODUS_RANK; '
                                                   'echo done > "$NODUS_OUTPUTS_DIR/done.txt"'],
               distributed={"nodes": 2, "gpusPerNode": 2})
        status = ended(c, "per-node")["status"]
        assert status["phase"] == "Succeeded", status
        assert status["topology"]["gpusPerNode"] == 2 and status["topology"]["totalGPUs"] == 4, status["topology"]
        seen = {r: (marks / f"rank-{r}").read_text().strip().split(",") for r in (0, 1)}
        assert all(len(devices) == 2 and all(devices) for devices in seen.values()), seen
        members = attempts_of(c, "per-node")
        assert [a["spec"]["resources"]["gpu"]["count"] for a in members] == [2, 2], members
        outputs = status.get("outputs") or []
        assert outputs and all(o["rank"] == 0 for o in outputs), outputs  # rank 0's outputs say their rank
