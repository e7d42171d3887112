"""GPUs through CDI: a spec resolved into bundle values, a stale spec found before an attempt, and a real
runc container that sees only its assigned (test) device nodes. The nodes are made here with mknod as
copies of /dev/null's and /dev/zero's numbers, so no GPU is needed."""
from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_oci_runc import Node, node, rootfs, sh, traversable_dir  # noqa: F401 - node and rootfs are fixtures

from nodus.agent.oci.bundle import (ContainerRequest, Device, Hook, IdRange, ImageConfig, PodNamespaces, resolve_process,
                                    runtime_spec)
from nodus.agent.oci.cdi import (STALE_REASON, AssignedGpu, CdiError, ContainerEdits, DeviceNode, all_edits,
                                 check_host, driver_edits, gpu_injection, inject, load_specs, parse_spec, resolve,
                                 stale, with_gpus)

DRIVER = "535.104.05"
GPUS = (AssignedGpu(0, "GPU-aaaa"), AssignedGpu(1, "GPU-bbbb"), AssignedGpu(2, "GPU-cccc"))
NULL, ZERO = os.stat("/dev/null").st_rdev, os.stat("/dev/zero").st_rdev
FUSE = os.makedev(10, 229)
LOOP_CONTROL = os.makedev(10, 237)
"""/dev/fuse's and /dev/loop-control's numbers: not among runc's default devices, so only an allow rule lets them be."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def make_node(path: Path, rdev: int) -> Path:
    os.mknod(path, 0o666 | stat.S_IFCHR, rdev)
    path.chmod(0o666)  # the umask would otherwise keep the pod's users out
    return path


@pytest.fixture
def host() -> Iterator[Path]:
    """A fake host: dev/ with three GPU nodes and nvidiactl, lib/ with the driver's libcuda, cdi/ for specs."""
    root = traversable_dir("nodus-cdi-host-")
    (root / "dev").mkdir()
    (root / "lib").mkdir()
    (root / "cdi").mkdir()
    if os.geteuid() == 0:
        for i, rdev in enumerate((FUSE, ZERO, LOOP_CONTROL)):
            make_node(root / "dev" / f"nvidia{i}", rdev)
        make_node(root / "dev" / "nvidiactl", NULL)
    lib = root / "lib" / f"libcuda.so.{DRIVER}"
    lib.write_text("not really libcuda\n")
    lib.chmod(0o644)
    (root / "lib" / "libcuda.so.1").symlink_to(lib.name)
    (root / "lib" / "libunrelated.so.1").write_text("")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def spec_doc(host: Path, version: str = DRIVER, gpus: tuple[AssignedGpu, ...] = GPUS) -> dict[str, Any]:
    """What `nvidia-ctk cdi generate` writes, over the fake host's paths."""
    def device(g: AssignedGpu) -> dict[str, Any]:
        return {"deviceNodes": [{"path": f"/dev/nvidia{g.index}", "hostPath": str(host / "dev" / f"nvidia{g.index}")}]}
    return {
        "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
        "devices": [*({"name": g.uuid, "containerEdits": device(g)} for g in gpus),
                    *({"name": str(g.index), "containerEdits": device(g)} for g in gpus)],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": str(host / "dev" / "nvidiactl")}],
            "mounts": [{"hostPath": str(host / "lib" / f"libcuda.so.{version}"),
                        "containerPath": f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}",
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
            "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true", "create-symlinks"]}],
        },
    }


def write_spec(host: Path, doc: dict[str, Any], name: str = "nvidia.json", where: str = "cdi") -> Path:
    path = host / where / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


# -- pure: parsing and resolving ---------------------------------------------------------------------

def test_assigned_gpus_resolve_by_uuid_with_the_specs_common_edits_and_visible_devices(host: Path) -> None:
    spec = parse_spec(spec_doc(host), "nvidia.json")
    edits, source = resolve([spec], [GPUS[2], GPUS[0]])
    assert source == "nvidia.json"
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia2", "/dev/nvidia0"]
    assert [m.destination for m in edits.mounts] == [f"/usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER}"]
    assert edits.mounts[0].read_only and edits.hooks[0].hook_name == "createContainer"
    out = inject(edits, [GPUS[2], GPUS[0]], source, stat=lambda p: os.stat("/dev/null"))
    assert out.env["NVIDIA_VISIBLE_DEVICES"] == out.env["CUDA_VISIBLE_DEVICES"] == "GPU-cccc,GPU-aaaa"
    assert out.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert {(d.path, d.major, d.minor) for d in out.devices} == {
        (p, os.major(NULL), os.minor(NULL)) for p in ("/dev/nvidiactl", "/dev/nvidia2", "/dev/nvidia0")}
    assert type(out).from_json(json.loads(json.dumps(out.to_json()))) == out  # as spec.json carries it


def test_a_gpu_only_named_by_index_resolves_and_an_unknown_one_is_refused_naming_it(host: Path) -> None:
    doc = spec_doc(host)
    doc["devices"] = [d for d in doc["devices"] if not d["name"].startswith("GPU-")]
    spec = parse_spec(doc, "nvidia.json")
    edits, _ = resolve([spec], [AssignedGpu(1, "GPU-new")])
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia1"]
    with pytest.raises(CdiError, match=r"nvidia.com/gpu=GPU-zzzz \(index 7\) is in no CDI spec.*nvidia-ctk"):
        resolve([spec], [AssignedGpu(7, "GPU-zzzz")])
    with pytest.raises(CdiError, match=r"device node /gone/nvidia1: No such file or directory; regenerate"):
        inject(ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia1", "/gone/nvidia1"),)), [GPUS[1]], "x")


def test_run_cdi_overrides_etc_cdi_and_other_kinds_are_ignored(host: Path) -> None:
    write_spec(host, spec_doc(host), where="etc")
    newer = spec_doc(host)
    newer["devices"] = [{"name": "GPU-aaaa", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia9"}]}}]
    write_spec(host, newer, where="run")
    write_spec(host, {"kind": "vendor.com/fpga", "devices": [{}]}, "fpga.json", where="run")  # not ours: not judged
    specs = load_specs([host / "etc", host / "run", host / "missing"])
    assert [Path(s.source).parent.name for s in specs] == ["etc", "run"]
    edits, _ = resolve(specs, [GPUS[0]])
    assert "/dev/nvidia9" in [n.path for n in edits.device_nodes]
    assert "/dev/nvidia0" not in [n.path for n in edits.device_nodes]


def test_a_yaml_spec_loads_and_bad_fields_are_named(host: Path) -> None:
    (host / "cdi" / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-aaaa\n  containerEdits:\n"
        "    deviceNodes:\n    - path: /dev/nvidia0\n")
    [spec] = load_specs([host / "cdi"])
    assert spec.devices["GPU-aaaa"].device_nodes == (DeviceNode("/dev/nvidia0"),)
    for doc, match in (({"kind": "nvidia.com/gpu"}, "cdiVersion is missing"),
                       ({"cdiVersion": "0.6.0", "kind": "gpu"}, "kind 'gpu' is not vendor/class"),
                       ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{}]}, r"devices\[0\].name"),
                       ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                         "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]},
                        r"devices\[0\].containerEdits.deviceNodes\[0\].path must be an absolute path"),
                       ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
                         "containerEdits": {"hooks": [{"hookName": "onBoot", "path": "/x"}]}},
                        r"hooks\[0\].hookName 'onBoot' is not one of")):
        with pytest.raises(CdiError, match=match):
            parse_spec(doc, "bad.json")


def test_hooks_go_to_runc_under_their_hook_point_and_hostpath_devices_are_bound() -> None:
    process = resolve_process(ContainerRequest("main", command=("true",)), ImageConfig())
    devices = [Device("/dev/nvidia0", "c", 195, 0, host_path="/host/dev/nvidia0"),
               Device("/dev/nvidiactl", "c", 195, 255)]
    spec = runtime_spec(process, "/rootfs", hostname="h", ids=IdRange.for_slot(0),
                        namespaces=PodNamespaces("/u", "/n", "/i"), cgroups_path="/c",
                        devices=devices, hooks=[Hook("createContainer", "/usr/bin/nvidia-cdi-hook",
                                                     ("nvidia-cdi-hook", "update-ldcache"))])
    assert spec["hooks"] == {"createContainer": [{"path": "/usr/bin/nvidia-cdi-hook",
                                                  "args": ["nvidia-cdi-hook", "update-ldcache"]}]}
    assert [d["path"] for d in spec["linux"]["devices"]] == ["/dev/nvidiactl"]
    bound = [m for m in spec["mounts"] if m["destination"] == "/dev/nvidia0"]
    assert bound == [{"destination": "/dev/nvidia0", "type": "bind", "source": "/host/dev/nvidia0",
                      "options": ["bind", "rprivate", "nosuid"]}]
    allowed = [(r["major"], r["minor"]) for r in spec["linux"]["resources"]["devices"] if r["allow"]]
    assert allowed == [(195, 0), (195, 255)]


@needs_root
def test_without_a_spec_the_gpus_own_nodes_the_control_nodes_and_the_driver_libraries_are_used(host: Path) -> None:
    edits = driver_edits([GPUS[1]], DRIVER, dev=str(host / "dev"), library_dirs=[str(host / "lib")])
    assert [(n.path, n.source) for n in edits.device_nodes] == [
        ("/dev/nvidia1", str(host / "dev/nvidia1")), ("/dev/nvidiactl", str(host / "dev/nvidiactl"))]
    lib = str(host / "lib" / f"libcuda.so.{DRIVER}")
    assert sorted((m.destination, m.source) for m in edits.mounts) == [
        (str(host / "lib/libcuda.so.1"), lib), (lib, lib)]
    assert all(m.read_only for m in edits.mounts)
    assert driver_edits([GPUS[1]], "550.1", dev=str(host / "dev"), library_dirs=[str(host / "lib")]).mounts == ()
    out = gpu_injection([GPUS[1]], DRIVER, dirs=[host / "cdi"], dev=str(host / "dev"))
    assert out.source == "driver" and out.env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    assert [(d.path, d.major, d.minor) for d in out.devices][0] == ("/dev/nvidia1", os.major(ZERO), os.minor(ZERO))


# -- staleness ----------------------------------------------------------------------------------------

@needs_root
def test_a_matching_spec_is_not_stale_and_a_missing_node_mount_or_other_driver_is(host: Path) -> None:
    write_spec(host, spec_doc(host))
    assert check_host(DRIVER, [host / "cdi"]) == ""
    (host / "dev" / "nvidia1").unlink()
    message = check_host(DRIVER, [host / "cdi"])
    assert f"device node {host}/dev/nvidia1 does not exist" in message
    assert "is stale" in message and "nvidia-ctk cdi generate" in message
    assert f"is driver {DRIVER}, the host runs 550.54.14" in check_host("550.54.14", [host / "cdi"])
    (host / "lib" / f"libcuda.so.{DRIVER}").unlink()
    [spec] = load_specs([host / "cdi"])
    assert f"mount source {host}/lib/libcuda.so.{DRIVER} does not exist" in stale(all_edits([spec]), DRIVER)
    assert STALE_REASON == "StaleCdiSpec"


@needs_root
def test_a_node_whose_numbers_changed_or_a_plain_file_is_stale(host: Path) -> None:
    edits = ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0", str(host / "dev/nvidia0"), "c", 195, 0),
                                         DeviceNode("/dev/x", str(host / "lib/libunrelated.so.1"))))
    assert stale(edits) == [f"device node {host}/dev/nvidia0 is 10:229, the spec says 195:0",
                            f"{host}/lib/libunrelated.so.1 is not a device node"]


# -- real runc ----------------------------------------------------------------------------------------

@needs_root
def test_a_container_sees_and_opens_only_its_assigned_test_devices(node: Node, host: Path) -> None:
    write_spec(host, spec_doc(host))
    out = gpu_injection([GPUS[0], GPUS[1]], DRIVER, dirs=[host / "cdi"])
    assert out.source == str(host / "cdi" / "nvidia.json")
    pod = node.pod("gpu")
    script = ("exec 3<>/dev/nvidia0 && echo opened0; exec 3<&-; head -c 4 /dev/nvidia1 | od -An -tx1; "
              "test -e /dev/nvidia2 || echo no2; test -e /dev/nvidiactl && echo ctl; "
              "cat /usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05; echo $NVIDIA_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES")
    request = with_gpus(sh(script, env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}), out)
    assert request.env["NVIDIA_DRIVER_CAPABILITIES"] == "all"  # the Job's own env wins over the spec's
    proc = pod.start("main", request, ImageConfig(cmd=("sh",), env=("PATH=/bin",)), node.rootfs, log := node.log(),
                     (*out.mounts,), devices=out.devices)
    os.close(log)
    assert proc.wait(30) == 0, node.text()
    assert node.text().split("\n")[:6] == ["opened0", " 00 00 00 00", "no2", "ctl", "not really libcuda",
                                          "GPU-aaaa,GPU-bbbb GPU-aaaa,GPU-bbbb"]
    allowed = Path("/sys/fs/cgroup/devices", pod.cgroup_parent, "main", "devices.list")
    if allowed.exists():  # cgroup v1: the container's device cgroup, which stays until runc delete
        rules = allowed.read_text().split("\n")
        assert "c 10:229 rwm" in rules and "a *:* rwm" not in rules
        assert not [r for r in rules if r.startswith("c 10:237 ")]  # GPU 2's node is not allowed


# -- placement ----------------------------------------------------------------------------------------

def test_placement_skips_unhealthy_gpus_and_says_why_when_nothing_else_fits() -> None:
    from nodus.coordinator.scheduler import Amount, Gpu, NodeView, Request, place

    why = f"{STALE_REASON}: device node /dev/nvidia1 does not exist"
    stale_node = NodeView("a-stale", True, False, frozenset({"oci"}), Amount(8000, 1 << 34, 1 << 36, 2),
                          (Gpu(0, "NVIDIA H100", 80 << 30, unhealthy=why),
                           Gpu(1, "NVIDIA H100", 80 << 30, unhealthy=why)))
    good_node = NodeView("b-good", True, False, frozenset({"oci"}), Amount(8000, 1 << 34, 1 << 36, 1),
                         (Gpu(0, "NVIDIA H100", 80 << 30),))
    request = Request.of({"gpu": {"count": 1}}, "registry.local/train@sha256:" + "0" * 64)
    assert place(request, [stale_node, good_node], []).node == "b-good"
    refused = place(request, [stale_node], [])
    assert refused.node is None
    assert refused.explain == f"no node fits: a-stale: gpu: wants 1 × any, 0 free (2 unhealthy: {why})"


def heartbeat(agent: Any, nvml: Any) -> None:
    """One heartbeat with the agent's GPU readings, waited for until the coordinator renewed the lease."""
    from nodus.v1 import agent_pb2

    agent.send(heartbeat=agent_pb2.Heartbeat(gpus=nvml.read()))
    agent.expect("lease_renewal")


def test_a_stale_spec_marks_the_nodes_gpus_unhealthy_and_the_job_goes_to_the_other_node(
        coordinator: Any, host: Path) -> None:
    """Real coordinator, two agents' streams (test_agent_service.FakeAgent) carrying the readings of the
    agent's own SimulatedNvml after its check against a spec that names a device the host lacks."""
    from e2e import create
    from test_agent_service import FakeAgent

    from nodus.v1 import node_pb2, node_pb2_grpc

    from nodus.agent.nvml import SimulatedNvml
    from nodus.agent.oci.cdi import check_gpus
    from nodus.agent.settings import SimulatedGpus

    sim = (AssignedGpu(0, "GPU-simulated-0"),)
    write_spec(host, spec_doc(host / "gone", gpus=sim))
    nvmls = {name: SimulatedNvml(SimulatedGpus("H100", 1, 80 << 30)) for name in ("node-a", "node-b")}
    message = check_gpus(nvmls["node-a"], [host / "cdi"])
    assert f"device node {host}/gone/dev/nvidia0 does not exist" in message
    [gpu] = nvmls["node-a"].read()
    assert (gpu.unhealthy_reason, gpu.unhealthy_message) == (STALE_REASON, message)
    assert check_gpus(nvmls["node-b"], [host / "empty"]) == "" and not nvmls["node-b"].read()[0].unhealthy_reason

    agents = {}
    for name, nvml in nvmls.items():
        agent = FakeAgent(coordinator, name)
        agent.inventory.gpus.extend(SimulatedNvml(SimulatedGpus("H100", 1, 80 << 30)).read())  # healthy at join
        agent.register()
        agent.connect()
        agent.expect("full_state")
        heartbeat(agent, nvml)  # the check before attempts found the spec stale after the node joined
        agents[name] = agent
    try:
        # Operators see it as NodeService shows the node (grpcurl, nodus): the GPU's reason and message.
        with coordinator.channel() as channel:
            listed = node_pb2_grpc.NodeServiceStub(channel).GetNode(
                node_pb2.GetNodeRequest(name="node-a"), metadata=(("authorization", f"Bearer {coordinator.token}"),),
                timeout=10)
        [shown] = listed.inventory.gpus
        assert (shown.unhealthy_reason, shown.unhealthy_message) == (STALE_REASON, message)
        create(coordinator, "on-b", resources={"gpu": {"count": 1}})
        assert agents["node-b"].expect("assignment").gpu_indexes == [0]
        assert not agents["node-a"].pending("assignment")

        # The operator regenerates the spec; the next check and heartbeat make node-a's GPU usable again.
        write_spec(host, spec_doc(host, gpus=sim))
        if os.geteuid() == 0:  # the fixture's device nodes exist only where it could mknod
            assert check_gpus(nvmls["node-a"], [host / "cdi"]) == ""
            heartbeat(agents["node-a"], nvmls["node-a"])
            create(coordinator, "on-a", resources={"gpu": {"count": 1}})
            assert agents["node-a"].expect("assignment").gpu_indexes == [0]
    finally:
        for agent in agents.values():
            agent.close()


@needs_root
def test_a_spec_left_from_the_previous_driver_marks_the_probed_gpus_unhealthy(host: Path) -> None:
    """A driver update: NVML (the fake binding of test_agent_inventory) reports 550.54.15, the spec still mounts
    535's libcuda. The GPUs are real NVML ones here, with their UUIDs resolving the devices."""
    from test_agent_inventory import A10, H100, fake_pynvml

    from nodus.agent.nvml import Nvml
    from nodus.agent.oci.cdi import check_gpus

    nvml = Nvml(fake_pynvml([H100, A10]))
    probed = tuple(AssignedGpu(g.index, g.uuid) for g in nvml.read())
    write_spec(host, spec_doc(host, gpus=probed))
    message = check_gpus(nvml, [host / "cdi"])
    assert f"libcuda.so.{DRIVER} is driver {DRIVER}, the host runs 550.54.15" in message
    assert {(g.unhealthy_reason, g.unhealthy_message) for g in nvml.read()} == {(STALE_REASON, message)}

    (host / "lib" / "libcuda.so.550.54.15").write_text("the new driver's libcuda\n")
    write_spec(host, spec_doc(host, version="550.54.15", gpus=probed))  # nvidia-ctk cdi generate, again
    assert check_gpus(nvml, [host / "cdi"]) == ""
    # The spec is healed; what the GPUs' own readings say is back: the fake H100's row remapping failed.
    assert [g.unhealthy_reason for g in nvml.read()] == ["RowRemapFailed", ""]
    out = gpu_injection(probed[1:], nvml.driver_version, dirs=[host / "cdi"])
    assert out.env["CUDA_VISIBLE_DEVICES"] == probed[1].uuid == "GPU-a10" and [d.path for d in out.devices] == [
        "/dev/nvidiactl", "/dev/nvidia1"]
    nvml.close()
