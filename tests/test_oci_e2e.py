"""Issue 11's image Jobs end to end: a real coordinator, a real `nodus-agent --runtime oci` and a real registry
on loopback (tests/registry.py builds the images offline). A Job with an image runs as runc containers
through the agent and is driven with kubectl and the `nodus` CLI as a customer drives it.

The agent's work dir is traversable by the pods' uids (pytest's own tmp dirs are 0700 at the top, and runc
resolves the rootfs and bind sources as the pod's root), and whatever a failed test left of a pod (containers,
layers, namespaces) is removed after it.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from agent_double import AgentProcess, wait_for
from conftest import Coordinator
from e2e import AGENT_ENV, NS, attempts_of, create, joined, patch_state, settled, wait_status
from nodus.agent.clock import SystemClock
from nodus.agent.runtime import OciRuntime, Refused
from nodus.v1 import agent_pb2
from nodus.agent.oci import disk
from nodus.agent.oci.mounts import unmount_layer
from nodus.agent.oci.slots import IdSlots
from nodus.agent.runtime.oci import SPARE_PODS
from nodus.agent.oci.runc import Runc
from nodus.agent.statefile import read_json
from registry import Registry, build_busybox_layout, build_python_layout, push

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("runc", "skopeo", "umoci", "docker-registry"))
                       or os.geteuid() != 0, reason="needs runc, skopeo, umoci, docker-registry and root"),
]

PROGRAM = r"""
import json, os, time
print("path", os.environ["PATH"], "ld", os.environ.get("LD_LIBRARY_PATH"), flush=True)
out = os.environ["NODUS_OUTPUTS_DIR"]
with open(os.path.join(out, "result.txt"), "w") as f:
    f.write("made inside the image\n")
with open(os.path.join(os.environ["NODUS_STATE_DIR"], "model.bin"), "wb") as f:
    f.write(b"weights" * 1000)
for k in range(1, 6):
    with open(os.environ["NODUS_PROGRESS"], "a") as f:
        f.write(json.dumps({"stage": "train", "units": {"completed": k, "total": 5}}) + "\n")
    print("step", k, "uid", os.getuid(), flush=True)
    time.sleep(0.2)
"""


def traversable_dir(prefix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o711)
    return d


@contextlib.contextmanager
def agent_hosts(prefix: str, works: str = "n*") -> Iterator[Path]:
    """A traversable top dir for agents' work dirs (those `works` matches under it: n0, n1, ...): their pods
    cleaned after, and the dir removed unless something is still mounted under it."""
    top = traversable_dir(prefix)
    try:
        yield top
    finally:
        for n in top.glob(works):
            clean_pods(n)
        with open("/proc/self/mountinfo") as f:
            mounted = any(str(top) in line for line in f)
        if not mounted:
            shutil.rmtree(top, ignore_errors=True)  # never through a mount that is still there


def clean_pods(work: Path) -> None:
    """Whatever of the agent's pods still exists: containers, writable layers, namespace mounts."""
    runc = Runc(work / "runc")
    if (work / "runc").exists():
        for state in runc.list():
            runc.delete(state.id, force=True)
    for pod_dir in work.glob("attempts/*/run/pod"):
        for layer in pod_dir.glob("containers/*"):
            unmount_layer(layer)
        disk.remove(pod_dir)
    IdSlots(work / "ids").unbind_all()  # the pods' namespaces and the agent's spares (ADR 0111)


def state_dir(work: Path, job: str) -> Path:
    """The state directory of the Job's attempt on the agent (found by its spec.json's NODUS_JOB)."""
    def find() -> Path | None:
        for spec in work.glob("attempts/*/run/spec.json"):
            if ((read_json(spec) or {}).get("env") or {}).get("NODUS_JOB") == job:
                return spec.parent.parent / "state"
        return None
    return wait_for(find, 60, what=f"the attempt of {job} on the agent")


@pytest.fixture(scope="module")
def images(oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The Python and busybox images pushed to the registry: name -> pinned reference."""
    root = tmp_path_factory.mktemp("images")
    python = push(build_python_layout(root / "python"), oci_registry, "e2e/python", "v1")
    busybox = push(build_busybox_layout(root / "busybox"), oci_registry, "e2e/busybox", "v1")
    return {"python": f"{oci_registry.host}/e2e/python:v1", "python_digest": python,
            "busybox": f"{oci_registry.host}/e2e/busybox:v1", "busybox_digest": busybox}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory, oci_registry: Registry,
      private_oci_registry: Registry) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("oci-e2e") / "data").start(extra_args=(
            "--insecure-registry", oci_registry.host, "--insecure-registry", private_oci_registry.host)) as coordinator:
        yield coordinator


def oci_agent(c: Coordinator, work: Path, *registries: Registry, node: str = "oci-n0") -> AgentProcess:
    """Each test's agent is a fresh host (a new work dir, a new key) under the module's one node name: as
    an operator does for a reinstalled host, the name is re-admitted first (ADR 0039)."""
    c.run("nodus", "node", "readmit", node, check=False)  # "not enrolled" for the module's first agent
    env = {**AGENT_ENV, "LD_LIBRARY_PATH": "/opt/node-only/lib"}  # the node's, never the image's
    insecure = [arg for r in registries for arg in ("--insecure-registry", r.host)]
    return AgentProcess(work, c.grpc, c.join_token, node=node, env=env,
                        extra_args=("--advertise-address", "127.0.0.1", "--runtime", "oci", *insecure))


@pytest.fixture
def work() -> Iterator[Path]:
    with agent_hosts("nodus-oci-e2e-", works="agent") as top:
        yield top / "agent"


def test_an_image_job_runs_to_completion_with_outputs_logs_and_progress(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-python", backoffLimit=0, image=images["python"], command=["python3", "-c", PROGRAM],
               outputs=[{"name": "model", "path": "/nodus/state/model.bin"}])
        st = settled(c, "oci-python", 180)
        assert st["phase"] == "Succeeded", st
        assert st["image"]["digest"] == images["python_digest"]
        shown = c.run("kubectl", "get", "job", "oci-python", "-o", "jsonpath={.status.image.digest}").stdout
        assert shown == images["python_digest"]
        assert st["progress"]["units"] == {"completed": 5, "total": 5} and st["progress"]["stage"] == "train"
        log = c.run("nodus", "logs", "oci-python").stdout
        assert "step 5 uid 0" in log  # root inside the image (a uid of the pod's slot on the host)
        assert "path /usr/bin:/bin ld None\n" in log  # the image's environment, not the agent's
        committed = {o["name"]: o for o in st["outputs"] if o["index"] == 0}
        assert set(committed) == {"model", "outputs"}
        for name, entry in committed.items():
            dest = tmp_path / f"{name}.download"
            c.run("nodus", "outputs", "get", "oci-python", name, "-o", str(dest))
            data = dest.read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size"], name
        assert (tmp_path / "model.download").read_bytes() == b"weights" * 1000
        [attempt] = attempts_of(c, "oci-python")
        pull = attempt["status"]["imagePull"]
        assert pull["bytesDone"] == pull["bytesTotal"] > 0
        assert Runc(work / "runc").list() == []  # the pod's containers are deleted with the attempt


# The Nodus SDK from inside the image (which installs nothing of Nodus): progress through
# nodus.progress, and the checkpoint handshake through nodus.handshake. The count reaches the state
# dir only through the handshake's save, so a resumed run that starts from it proves the handshake
# (not a freeze) took the checkpoint.
SDK_PROGRAM = r"""
import os, time
import nodus
from nodus import handshake, progress
path = os.path.join(os.environ["NODUS_STATE_DIR"], "counter")
n = int(open(path).read()) if os.path.exists(path) else 0
print("sdk", list(nodus.__path__), "pythonpath", os.environ["PYTHONPATH"], "start", n, flush=True)
def save(seq):
    with open(path, "w") as f:
        f.write(str(n))
    print("saved", seq, n, flush=True)
assert handshake.on_checkpoint(save)
while n < 40:
    n += 1
    progress.report(stage="count", completed=n, total=40)
    time.sleep(0.1)
print("reached", n, flush=True)
"""


def test_the_sdk_works_inside_an_image_progress_and_the_checkpoint_handshake(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-sdk", backoffLimit=0, image=images["python"], command=["python3", "-c", SDK_PROGRAM],
               env=[{"name": "NODUS_CHECKPOINT_SIGNAL", "value": "1"}, {"name": "PYTHONPATH", "value": "/opt/mine"}])
        st = wait_status(c, "oci-sdk", lambda s: ((s.get("progress") or {}).get("units") or {}).get("completed", 0) >= 8,
                         180, "the image's program to report 8 units through nodus.progress")
        assert st["progress"]["stage"] == "count"
        patch_state(c, "oci-sdk", "Suspended")
        st = wait_status(c, "oci-sdk", lambda s: s.get("phase") == "Suspended" and not s.get("active"), 120,
                         "Suspended through a checkpoint")
        suspended_at = st["progress"]["units"]["completed"]
        [first] = attempts_of(c, "oci-sdk")
        assert [k["reason"] for k in first["status"]["checkpoints"]] == ["Suspend"], first["status"]
        patch_state(c, "oci-sdk", "Running")
        st = settled(c, "oci-sdk", 180)
        assert st["phase"] == "Succeeded", st
        assert st["checkpoint"]["restoredFromSeq"] == 1
        first_log = c.run("nodus", "logs", "oci-sdk", "--attempt", "1").stdout
        log = c.run("nodus", "logs", "oci-sdk").stdout
        # the SDK is the agent's read-only copy at /nodus/sdk, after the Job's own PYTHONPATH
        assert "/nodus/sdk/nodus'] pythonpath /opt/mine:/nodus/sdk start 0" in first_log, first_log
        saved = [ln.split() for ln in first_log.splitlines() if ln.startswith("saved ")]
        assert len(saved) == 1 and saved[0][1] == "1" and 8 <= int(saved[0][2]) <= suspended_at, first_log
        assert f"pythonpath /opt/mine:/nodus/sdk start {saved[0][2]}" in log, "the resumed run restored the save"
        assert "reached 40" in log


def test_kill_9_of_the_agent_during_a_container_re_adopts_it_and_it_runs_once(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    script = ("echo started >> /nodus/state/runs; while [ ! -e /nodus/state/go ]; do sleep 0.1; done; "
              "cat /nodus/state/runs; echo finished")
    with joined([oci_agent(c, work, oci_registry).start()], c) as [agent]:
        create(c, "oci-readopt", backoffLimit=0, image=images["busybox"], command=["sh", "-c", script])
        wait_status(c, "oci-readopt", lambda s: s.get("phase") == "Running", 120, "the container to run")
        state = state_dir(work, "oci-readopt")
        wait_for(lambda: (state / "runs").exists(), 60, what="the container to start")
        assert agent.signal(signal.SIGKILL) == -signal.SIGKILL
        assert [s.status for s in Runc(work / "runc").list()] == ["running"]  # the container outlives the agent
        agent.start()
        wait_for(lambda: "re-adopted attempt" in agent.log(), 60, what="the restarted agent to re-adopt")
        (state / "go").touch()
        st = settled(c, "oci-readopt", 120)
        assert st["phase"] == "Succeeded", st
        assert len(attempts_of(c, "oci-readopt")) == 1
        log = c.run("nodus", "logs", "oci-readopt").stdout
        assert log.count("started") == 1 and "finished" in log
        assert Runc(work / "runc").list() == []


def test_a_memory_limit_below_use_reports_oomkilled(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-oom", backoffLimit=0, image=images["busybox"], resources={"memory": "32Mi"},
               command=["sh", "-c", "x=aaaaaaaa; while true; do x=$x$x; done"])
        st = settled(c, "oci-oom", 120)
        assert st["phase"] == "Failed", st
        [attempt] = attempts_of(c, "oci-oom")
        assert attempt["status"]["reason"] == "OOMKilled", attempt["status"]


DISK_FILLER = r"""
import errno
with open("/small", "wb") as f:
    f.write(b"0" * (8 << 20))
print("small fits", flush=True)
try:
    with open("/big", "wb") as f:
        f.write(b"0" * (64 << 20))
except OSError as e:
    print("big refused", errno.errorcode[e.errno], flush=True)
    raise SystemExit(4)
"""


def test_the_disk_floor_limits_the_containers_writable_layer(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-disk", backoffLimit=0, image=images["python"], resources={"disk": "32Mi"},
               command=["python3", "-c", DISK_FILLER])
        st = settled(c, "oci-disk", 120)
        assert st["phase"] == "Failed", st
        [attempt] = attempts_of(c, "oci-disk")
        assert attempt["status"]["exitCode"] == 4, attempt["status"]
        log = c.run("nodus", "logs", "oci-disk").stdout
        assert "small fits" in log and "big refused ENOSPC" in log, log
        assert not list(work.glob("attempts/*/run/pod/layers.ext4")), "the pod's filesystem went with it"


def read_as(uid: int, path: Path) -> str:
    """What a process of host uid `uid` (a pod's root) gets reading `path`: its text or the error's name."""
    code = ("import os, sys\nos.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
            "try:\n    print(open(sys.argv[2]).read(), end='')\n"
            "except OSError as e:\n    print(type(e).__name__, end='')")
    return subprocess.run([sys.executable, "-c", code, str(uid), str(path)], capture_output=True, text=True,
                          check=True, timeout=30).stdout


def test_a_second_attempt_on_the_node_cannot_read_the_first_ones_files_or_secrets(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    hold = ("echo private > /nodus/state/secret.txt; chmod 600 /nodus/state/secret.txt; "
            "while [ ! -e /nodus/state/go ]; do sleep 0.1; done")
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "oci-first-db"},
              "stringData": {"password": "hunter2"}}
    assert c.session().post(c.url(f"{NS}/secrets"), json=secret).status_code == 201
    with joined([oci_agent(c, work, oci_registry).start()], c):
        states = []
        for name in ("oci-first", "oci-second"):
            create(c, name, backoffLimit=0, image=images["busybox"], command=["sh", "-c", hold],
                   **({"secrets": [{"name": "oci-first-db"}]} if name == "oci-first" else {}))
            wait_status(c, name, lambda s: s.get("phase") == "Running", 120, f"{name} to run")
            states.append(state_dir(work, name))
            wait_for(lambda: (states[-1] / "secret.txt").exists(), 60, what=f"{name}'s file")
        first, second = (os.stat(s / "secret.txt") for s in states)
        # each pod's root is a host uid of its own slot, never host root
        assert first.st_uid != second.st_uid and min(first.st_uid, second.st_uid) >= 1 << 20
        assert read_as(second.st_uid, states[0] / "secret.txt") == "PermissionError"
        assert read_as(first.st_uid, states[0] / "secret.txt") == "private\n"  # the check can tell
        # the first Job's Secret, as the agent wrote it for its pod: the second pod's root cannot read it
        password = states[0].parent / "run" / "secrets" / "oci-first-db" / "password"
        assert read_as(second.st_uid, password) == "PermissionError"
        assert read_as(first.st_uid, password) == "hunter2"
        for s in states:
            (s / "go").touch()
        for name in ("oci-first", "oci-second"):
            assert settled(c, name, 120)["phase"] == "Succeeded"


def config_digest(layout: Path) -> str:
    index = orjson.loads((layout / "index.json").read_bytes())
    manifest = layout / "blobs" / "sha256" / index["manifests"][0]["digest"].removeprefix("sha256:")
    return str(orjson.loads(manifest.read_bytes())["config"]["digest"])


def test_a_blob_served_corrupted_fails_the_attempt_as_the_images_fault_and_nothing_runs(
        c: Coordinator, oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    layout = build_busybox_layout(tmp_path / "bad", {"Env": ["PATH=/bin", "NODUS_TEST=corrupted"]})
    push(layout, oci_registry, "e2e/corrupted", "v1")
    create(c, "oci-corrupted", backoffLimit=0, image=f"{oci_registry.host}/e2e/corrupted:v1",
           command=["sh", "-c", "echo must not run"])  # admitted (pinned) while no node runs images
    oci_registry.corrupt_blob(config_digest(layout))
    with joined([oci_agent(c, work, oci_registry).start()], c):
        st = settled(c, "oci-corrupted", 120)
        assert st["phase"] == "Failed", st
        [attempt] = attempts_of(c, "oci-corrupted")
        assert attempt["status"]["reason"] == "ImagePullFailed", attempt["status"]
        assert "ImageDigestMismatch" in attempt["status"]["message"] and "e2e/corrupted" in attempt["status"]["message"]
        assert "must not run" not in c.run("nodus", "logs", "oci-corrupted", check=False).stdout


def test_a_pull_the_node_has_no_room_for_is_lost_capacity(images: dict[str, str], oci_registry: Registry,
                                                          work: Path) -> None:
    runtime = OciRuntime(work, image_cache=work / "images", disk_budget=1024, clock=SystemClock(), zygote=False,
                         insecure_registries=[oci_registry.host])
    pinned = images["busybox"].replace(":v1", "@" + images["busybox_digest"])
    a = agent_pb2.Assignment(attempt_id="no-room", image=pinned, command=["true"])
    layout = runtime.layout(a.attempt_id)
    layout.make()
    with pytest.raises(Refused) as refused:
        runtime.pull(a, layout)
    assert (refused.value.phase, refused.value.reason) == ("LOST", "ImagePullNodeFault")
    assert "ImageDiskFull" in str(refused.value)
    assert runtime.images_in_use() == {images["busybox_digest"]}  # it counted from before its pull


def test_a_pod_whose_supervisor_died_is_cleaned_up_and_the_attempt_replaced(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    script = 'echo "run $NODUS_ATTEMPT_NUMBER"; [ "$NODUS_ATTEMPT_NUMBER" = 1 ] && sleep 600; echo done'
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-orphan", backoffLimit=0, image=images["busybox"], command=["sh", "-c", script])
        wait_status(c, "oci-orphan", lambda s: s.get("phase") == "Running", 120, "the container to run")
        state = state_dir(work, "oci-orphan")
        run = state.parent / "run"
        wait_for(lambda: [s for s in Runc(work / "runc").list() if s.status == "running"], 60,
                 what="the container to run")
        pod_id = state.parent.name
        slot = IdSlots(work / "ids").slot_of(pod_id)
        assert slot is not None  # its id slot is held
        ipc = IdSlots(work / "ids").namespaces(slot) / "ipc"
        # a mark in the pod's IPC namespace: namespaces bound later (a spare's, a pod's) must not have it
        subprocess.run(["nsenter", f"--ipc={ipc}", "--", "ipcmk", "-Q"], check=True, capture_output=True)
        os.kill(int((read_json(run / "status.json") or {})["supervisor_pid"]), signal.SIGKILL)
        st = settled(c, "oci-orphan", 120)
        assert st["phase"] == "Succeeded", st  # the replacement (attempt 2) ran to its end
        first = attempts_of(c, "oci-orphan")[0]
        assert (first["status"]["phase"], first["status"]["reason"]) == ("Lost", "AgentFault"), first["status"]
        assert not [s.id for s in Runc(work / "runc").list() if s.id.startswith(pod_id)]
        assert IdSlots(work / "ids").slot_of(pod_id) is None  # the slot is free again
        wait_for(lambda: len(IdSlots(work / "ids").spares()) == SPARE_PODS or None, 60, what="the agent's spares")
        with open("/proc/self/mountinfo") as f:
            assert not [line for line in f if str(run / "pod") in line], "a mount of the dead pod was left"
        for bound in (work / "ids").glob("ns/*/ipc"):
            queues = subprocess.run(["nsenter", f"--ipc={bound}", "--", "ipcs", "-q"], capture_output=True,
                                    text=True, check=True).stdout
            assert "0x" not in queues, f"the dead pod's IPC namespace is still bound at {bound}"


def test_an_image_attempt_takes_a_spare_pod_made_after_the_one_before_and_a_stop_removes_the_spares(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    """ADR 0111: once an image attempt is gone the agent holds spare pods' namespaces; the next image attempt's
    pod takes one (its containers run in the spare's network namespace), and the agent's stop removes them."""
    slots = IdSlots(work / "ids")
    hold = "while [ ! -e /nodus/state/go ]; do sleep 0.1; done"
    agent = oci_agent(c, work, oci_registry).start()
    with joined([agent], c):
        create(c, "oci-spare-1", backoffLimit=0, image=images["busybox"], command=["true"])
        assert settled(c, "oci-spare-1", 120)["phase"] == "Succeeded"
        wait_for(lambda: len(slots.spares()) == SPARE_PODS or None, 60, what="the agent's spare pods")
        spares = slots.spares()
        made = {slot: os.stat(slots.namespaces(slot) / "net").st_ino for slot in spares}
        create(c, "oci-spare-2", backoffLimit=0, image=images["busybox"], command=["sh", "-c", hold])
        state = state_dir(work, "oci-spare-2")
        [container] = wait_for(lambda: [s for s in Runc(work / "runc").list() if s.status == "running"], 60,
                               what="the second Job's container")
        slot = slots.slot_of(state.parent.name)
        assert slot in spares, (slot, spares)  # a spare's slot, not a fresh one
        assert os.stat(f"/proc/{container.pid}/ns/net").st_ino == made[slot]  # in the spare's made namespace
        (state / "go").touch()
        assert settled(c, "oci-spare-2", 120)["phase"] == "Succeeded"
        wait_for(lambda: len(slots.spares()) == SPARE_PODS or None, 60, what="the spares topped up")
    assert slots.spares() == []  # the agent's stop removed them
    with open("/proc/self/mountinfo") as f:
        assert not [line for line in f if str(work / "ids") in line], "a spare's namespace was left bound"


def test_asking_for_the_oci_runtime_without_runc_fails_at_start_naming_it(c: Coordinator, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("skopeo", "umoci"):
        (bin_dir / tool).symlink_to(str(shutil.which(tool)))
    agent = AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="no-runc", env={"PATH": str(bin_dir)},
                         extra_args=("--runtime", "oci"))
    agent.start()
    assert agent.proc.wait(60) != 0
    assert "--runtime oci" in agent.log() and "runc is missing" in agent.log() and "install" in agent.log()
    agent.proc = None


FETCH = r"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:8080/etc/motd", timeout=10).read().decode(), end="")
"""


def test_a_sidecar_with_its_own_image_serves_the_main_container_on_localhost(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-sidecar", backoffLimit=0, image=images["python"], command=["python3", "-c", FETCH],
               sidecars=[{"name": "web", "image": images["busybox"], "startupTimeout": "30s",
                          "command": ["sh", "-c", "mkdir -p /srv/etc && { [ -e /usr/bin/python3 ] && echo python "
                                      "image || echo busybox image; } > /srv/etc/motd && "
                                      "exec httpd -f -p 127.0.0.1:8080 -h /srv"]}])
        st = settled(c, "oci-sidecar", 180)
        assert st["phase"] == "Succeeded", st
        assert st["sidecarImages"][0]["digest"] == images["busybox_digest"]
        log = c.run("nodus", "logs", "oci-sidecar").stdout
        assert "busybox image" in log and "python image" not in log, log  # the sidecar ran its own image


# A sidecar that, told to stop, appends its name to /nodus/outputs/order (shared by every container of the
# pod) and leaves; it is ready once it has made its ready file.
STOP_RECORDER = (": > \"$NODUS_READY_FILE\"; trap 'echo {name} >> /nodus/outputs/order; exit 0' TERM; "
                 "while true; do sleep 0.05; done")


def outputs_tree(c: Coordinator, job: str, dest: Path) -> dict[str, bytes]:
    """The Job's committed /nodus/outputs (a tar.zst), downloaded with the CLI: path -> content."""
    import io
    import tarfile

    import zstandard
    c.run("nodus", "outputs", "get", job, "outputs", "-o", str(dest))
    with zstandard.ZstdDecompressor().stream_reader(dest.open("rb")) as raw:
        with tarfile.open(fileobj=io.BytesIO(raw.read()), mode="r:") as tar:
            return {m.name.lstrip("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                    for m in tar.getmembers() if m.isfile()}


def test_image_sidecars_stop_in_reverse_after_main_and_a_failing_init_container_fails_the_job_naming_it(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    with joined([oci_agent(c, work, oci_registry).start()], c):
        create(c, "oci-stop-order", backoffLimit=0, image=images["busybox"],
               command=["sh", "-c", "echo main >> /nodus/outputs/order"],
               sidecars=[{"name": name, "startupTimeout": "30s", "command": ["sh", "-c", STOP_RECORDER.format(name=name)]}
                         for name in ("first", "second")])
        create(c, "oci-init-fails", backoffLimit=0, image=images["busybox"],
               command=["sh", "-c", "echo main ran; touch /nodus/outputs/main-ran"],
               initCommand={"command": ["sh", "-c", "echo 'preflight: no GPU driver'; exit 4"]})
        st = settled(c, "oci-stop-order", 180)
        assert st["phase"] == "Succeeded", st
        # main ended first, then the sidecars in the reverse of their start order
        assert outputs_tree(c, "oci-stop-order", tmp_path / "order.tar.zst")["order"] == b"main\nsecond\nfirst\n"
        st = settled(c, "oci-init-fails", 180)
        assert st["phase"] == "Failed", st
        attempt = attempts_of(c, "oci-init-fails")[0]["status"]
        assert (attempt["phase"], attempt["reason"]) == ("Failed", "InitFailed"), attempt
        assert "preflight: no GPU driver" in attempt["message"] and "preflight: no GPU driver" in st["message"], st
        shown = c.run("kubectl", "get", "job", "oci-init-fails", "-o", "jsonpath={.status.message}").stdout
        assert "preflight: no GPU driver" in shown
        assert "main ran" not in c.run("nodus", "logs", "oci-init-fails").stdout  # main never started


def test_a_private_image_is_pulled_with_the_jobs_pull_secret(
        c: Coordinator, private_oci_registry: Registry, work: Path, tmp_path: Path) -> None:
    reg = private_oci_registry
    push(build_busybox_layout(tmp_path / "private", {"Env": ["PATH=/bin", "WHO=private"]}), reg, "e2e/private", "v1")
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "e2e-regcred"},
              "stringData": {"username": reg.username, "password": reg.password}}
    assert c.session().post(c.url(f"{NS}/secrets"), json=secret).status_code == 201
    with joined([oci_agent(c, work, reg).start()], c):
        create(c, "oci-private", backoffLimit=0, image=f"{reg.host}/e2e/private:v1", imagePullSecrets=["e2e-regcred"],
               command=["sh", "-c", "echo image of $WHO"])
        st = settled(c, "oci-private", 120)
        assert st["phase"] == "Succeeded", st
        assert "image of private" in c.run("nodus", "logs", "oci-private").stdout


class DefaultAgent(AgentProcess):
    """An agent started with no --runtime at all, as an operator's unit file would."""

    def argv(self) -> list[str]:
        argv = super().argv()
        at = argv.index("--runtime")
        return argv[:at] + argv[at + 2:]


def test_by_default_a_node_with_runc_runs_image_jobs_and_image_less_ones(
        c: Coordinator, images: dict[str, str], oci_registry: Registry, work: Path) -> None:
    agent = DefaultAgent(work, c.grpc, c.join_token, node="auto-n0", env=AGENT_ENV,
                         extra_args=("--advertise-address", "127.0.0.1", "--insecure-registry", oci_registry.host))
    assert "--runtime" not in agent.argv()
    with joined([agent.start()], c):
        create(c, "auto-image", backoffLimit=0, image=images["busybox"], command=["sh", "-c", "echo in the image"])
        create(c, "auto-plain", backoffLimit=0, command=[sys.executable, "-c", "import sys; print('on the host', "
                                                          "sys.executable)"])
        for name, said in (("auto-image", "in the image"), ("auto-plain", f"on the host {sys.executable}")):
            st = settled(c, name, 120)
            assert st["phase"] == "Succeeded", st
            assert said in c.run("nodus", "logs", name).stdout
        assert [a["spec"]["node"] for a in attempts_of(c, "auto-image")] == ["auto-n0"]


def test_a_bad_image_disk_budget_is_refused_naming_the_flag(c: Coordinator, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path / "work", c.grpc, c.join_token, node="bad-budget",
                         extra_args=("--image-disk-budget", "lots"))
    agent.start()
    assert agent.proc.wait(60) != 0
    assert "--image-disk-budget" in agent.log() and "20Gi" in agent.log()
    agent.proc = None
