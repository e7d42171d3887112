"""The pure OCI bundle builder: Kubernetes' override rules, the pod's namespaces, ids, mounts and limits."""
from __future__ import annotations

from typing import Any

import pytest

from nodus.agent.oci.bundle import (ID_BASE, ID_RANGE, ID_SLOTS, BundleError, ContainerRequest, Device, IdRange,
                                    ImageConfig, Limits, Mount, PodNamespaces, attempt_mounts, merged_env,
                                    process_args, resolve_process, resolve_user, runtime_spec)

IMAGE = ImageConfig.from_oci({"config": {"Entrypoint": ["/bin/serve"], "Cmd": ["--port", "80"],
                                         "Env": ["PATH=/opt/bin:/bin", "MODE=image", "KEEP=1"],
                                         "WorkingDir": "/app", "User": "1000"}})
NS = PodNamespaces("/a/run/ns/user", "/a/run/ns/net", "/a/run/ns/ipc")
PASSWD = "root:x:0:0:root:/root:/bin/sh\ntrainer:x:1001:1002::/home/trainer:/bin/sh\n"
GROUP = "root:x:0:\nvideo:x:44:trainer\n"


def spec(request: ContainerRequest = ContainerRequest("main"), **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(hostname="a-1", ids=IdRange.for_slot(3), namespaces=NS, cgroups_path="/nodus/a-1/main")
    args.update(kw)
    return runtime_spec(resolve_process(request, IMAGE), "/a/run/containers/main/rootfs", **args)


def test_image_defaults_when_the_request_overrides_nothing() -> None:
    p = resolve_process(ContainerRequest("main"), IMAGE)
    assert p.args == ("/bin/serve", "--port", "80")
    assert p.cwd == "/app" and (p.uid, p.gid) == (1000, 1000)


def test_command_replaces_entrypoint_and_drops_cmd() -> None:
    assert process_args(ContainerRequest("main", command=("python", "train.py")), IMAGE) == ("python", "train.py")
    assert process_args(ContainerRequest("main", command=("python",), args=("-V",)), IMAGE) == ("python", "-V")


def test_args_replace_cmd_and_keep_entrypoint() -> None:
    assert process_args(ContainerRequest("main", args=("--port", "9000")), IMAGE) == ("/bin/serve", "--port", "9000")
    assert process_args(ContainerRequest("main", args=()), IMAGE) == ("/bin/serve",)


def test_nothing_to_run_names_the_field() -> None:
    with pytest.raises(BundleError, match=r"sidecar\.command: the image has no entrypoint or cmd"):
        process_args(ContainerRequest("sidecar"), ImageConfig())


def test_env_merges_over_the_image_env() -> None:
    env = merged_env(IMAGE.env, {"MODE": "job", "NEW": "x"})
    assert env == ("PATH=/opt/bin:/bin", "MODE=job", "KEEP=1", "NEW=x")
    assert merged_env((), {})[0].startswith("PATH=/usr/local/sbin")


def test_working_dir_overrides_and_must_be_absolute() -> None:
    assert resolve_process(ContainerRequest("main", working_dir="/work"), IMAGE).cwd == "/work"
    assert resolve_process(ContainerRequest("main"), ImageConfig(cmd=("sh",))).cwd == "/"
    with pytest.raises(BundleError, match=r"main\.workingDir"):
        resolve_process(ContainerRequest("main", working_dir="work"), IMAGE)


def test_users_by_number_and_by_name() -> None:
    assert resolve_user("") == (0, 0)
    assert resolve_user("1001", PASSWD) == (1001, 1002)
    assert resolve_user("trainer:video", PASSWD, GROUP) == (1001, 44)
    assert resolve_user("7:8") == (7, 8)
    with pytest.raises(BundleError, match="'ghost' is not in the image's /etc/passwd"):
        resolve_user("ghost", PASSWD)
    with pytest.raises(BundleError, match="group 'gpu'"):
        resolve_user("trainer:gpu", PASSWD, GROUP)
    assert resolve_process(ContainerRequest("main", user="0"), IMAGE).uid == 0


def test_each_slot_is_its_own_host_id_range() -> None:
    a, b = IdRange.for_slot(0), IdRange.for_slot(1)
    assert a.host(0) == ID_BASE and b.host(0) == ID_BASE + ID_RANGE
    assert a.host(ID_RANGE - 1) < b.host(0)
    assert IdRange.for_slot(ID_SLOTS - 1).host(ID_RANGE - 1) < 2**32 - 1
    with pytest.raises(BundleError, match="idSlot"):
        IdRange.for_slot(ID_SLOTS)
    s = spec()
    assert s["linux"]["uidMappings"] == [{"containerID": 0, "hostID": ID_BASE + 3 * ID_RANGE, "size": ID_RANGE}]
    assert s["linux"]["gidMappings"] == s["linux"]["uidMappings"]


def test_pod_namespaces_joined_by_path_and_the_rest_private() -> None:
    ns = {n["type"]: n.get("path") for n in spec()["linux"]["namespaces"]}
    assert ns == {"pid": None, "mount": None, "uts": None, "cgroup": None,
                  "user": NS.user, "network": NS.network, "ipc": NS.ipc}


def test_a_gang_pod_stays_on_the_nodes_network_with_the_nodes_sys_read_only() -> None:
    host = spec(namespaces=PodNamespaces("/a/run/ns/user", None, "/a/run/ns/ipc"))
    kinds = {n["type"]: n.get("path") for n in host["linux"]["namespaces"]}
    assert "network" not in kinds  # runc leaves the container in the node's network namespace
    assert kinds["user"] == "/a/run/ns/user" and kinds["ipc"] == "/a/run/ns/ipc"
    [sys_mount] = [m for m in host["mounts"] if m["destination"] == "/sys"]
    assert sys_mount["type"] == "bind" and sys_mount["source"] == "/sys" and "ro" in sys_mount["options"]
    [own] = [m for m in spec()["mounts"] if m["destination"] == "/sys"]
    assert own["type"] == "sysfs"  # a pod with its own network namespace mounts its own sysfs


def test_attempt_mounts_are_bound_inputs_and_secrets_read_only() -> None:
    mounts = attempt_mounts("/a/state", "/a/inputs", "/a/outputs", "/a/run/progress.jsonl",
                            {"/nodus/secrets/token": "/a/secrets/token"})
    binds = {m["destination"]: m for m in spec(mounts=mounts)["mounts"] if m["type"] == "bind"}
    assert set(binds) == {"/nodus/state", "/nodus/inputs", "/nodus/outputs", "/nodus/progress",
                          "/nodus/secrets/token"}
    read_only = {d for d, m in binds.items() if "ro" in m["options"]}
    assert read_only == {"/nodus/inputs", "/nodus/secrets/token"}
    assert binds["/nodus/state"]["source"] == "/a/state"


def test_bad_mounts_are_refused() -> None:
    with pytest.raises(BundleError, match="mountPath: 'data' must be an absolute path"):
        spec(mounts=[Mount("data", "/x")])
    with pytest.raises(BundleError, match="two mounts share a path"):
        spec(mounts=[Mount("/data", "/x"), Mount("/data", "/y")])


def test_limits_become_cgroup_resources() -> None:
    r = spec(limits=Limits(memory_bytes=256 << 20, cpu_millis=1500, pids=128))["linux"]["resources"]
    assert r["memory"] == {"limit": 256 << 20, "swap": 256 << 20}
    assert r["cpu"] == {"quota": 150_000, "period": 100_000}
    assert r["pids"] == {"limit": 128}
    assert set(spec()["linux"]["resources"]) == {"devices"}


def test_devices_denied_except_the_assigned_ones() -> None:
    gpu = Device("/dev/nvidia0", "c", 195, 0)
    s = spec(devices=[gpu])
    assert s["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]
    assert s["linux"]["devices"][0]["path"] == "/dev/nvidia0"


def test_the_process_is_confined() -> None:
    s = spec()
    assert s["process"]["noNewPrivileges"] is True and s["process"]["terminal"] is False
    assert "CAP_SYS_ADMIN" not in s["process"]["capabilities"]["bounding"]
    assert s["root"] == {"path": "/a/run/containers/main/rootfs", "readonly": False}
    assert s["linux"]["cgroupsPath"] == "/nodus/a-1/main"
    assert "/proc/kcore" in s["linux"]["maskedPaths"]


def test_a_user_outside_the_pod_range_is_refused() -> None:
    with pytest.raises(BundleError, match="user: uid 70000 is outside"):
        spec(ContainerRequest("main", user="70000"))
