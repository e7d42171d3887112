"""Real runc: a pod's containers from a busybox rootfs built here (no registry), each cleaned up even on failure."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodus.agent.cgroups import DEFAULT_FS, Cgroup
from nodus.agent.oci import disk
from nodus.agent.checkpointing import Hold
from nodus.agent.layout import AttemptLayout
from nodus.agent.oci.bundle import ContainerRequest, IdRange, ImageConfig, Limits, Mount
from nodus.agent.oci.mounts import unmount_layer
from nodus.agent.oci.namespaces import remove_namespaces
from nodus.agent.oci.pod import ContainerProcess, Pod, listening_ports, pod_safe_id, remove_cgroup_dirs
from nodus.agent.oci.slots import IdSlots
from nodus.agent.oci.runc import (ContainerExists, ContainerNotFound, ContainerStatus, Runc, RuncMissing,
                                  become_subreaper)
from nodus.agent.statefile import read_json, write_json

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
APPLETS = ("sh", "echo", "cat", "id", "pwd", "sleep", "httpd", "wget", "env", "touch", "mkdir", "ls", "true", "dd")
IMAGE = ImageConfig(cmd=("sh",), env=("PATH=/bin",))

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("runc") is None or not os.path.exists(BUSYBOX) or os.geteuid() != 0,
                       reason="needs runc, busybox-static and root"),
]


@dataclass
class Node:
    """One test's agent side: a runc root, id slots, the pods made, a log file."""

    root: Path
    runc: Runc
    slots: IdSlots
    rootfs: Path
    cgroup_parent: str
    pods: list[Pod] = field(default_factory=list)

    def pod(self, name: str, disk_bytes: int = 0, pod_id: str = "") -> Pod:
        pod = Pod(pod_id or f"{name}-{uuid.uuid4().hex[:6]}", self.root / "pods" / name, self.runc, self.slots,
                  f"{self.cgroup_parent}/{name}", disk_bytes=disk_bytes)
        self.pods.append(pod)
        return pod

    def log(self, name: str = "attempt.log") -> int:
        return os.open(self.root / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def text(self, name: str = "attempt.log") -> str:
        return (self.root / name).read_text()

    def dirs(self, pod: Pod, *names: str) -> dict[str, Path]:
        out = {}
        for n in names:
            d = self.root / "attempt" / pod.pod_id / n
            d.mkdir(parents=True)
            pod.own(d)
            out[n] = d
        return out


def traversable_dir(prefix: str) -> Path:
    """A fresh directory every pod uid may pass through (pytest's own tmp dirs are 0700 at the top)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o711)
    return d


@pytest.fixture(scope="module")
def rootfs() -> Iterator[Path]:
    """A read-only image tree: busybox, its applets, a user and a page for httpd."""
    top = traversable_dir("nodus-oci-image-")
    root = top / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\ntrainer:x:1001:1002::/:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\ntrainer:x:1002:\n")
    (root / "www").mkdir()
    (root / "www/index.html").write_text("hello from the sidecar\n")
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() or p.name == "busybox" else 0o644)
    (root / "home/trainer").mkdir(parents=True)
    os.chown(root / "home/trainer", 1001, 1002)  # the image's own user owns its home
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def node(rootfs: Path) -> Iterator[Node]:
    become_subreaper()  # detached containers' inits become this process's children, as the supervisor's do
    top = traversable_dir("nodus-oci-node-")
    n = Node(top, Runc(top / "runc"), IdSlots(top / "ids"), rootfs, f"nodus-test/{uuid.uuid4().hex[:8]}")
    try:
        yield n
    finally:
        try:
            for state in n.runc.list():
                n.runc.delete(state.id, force=True)
            for pod in n.pods:
                pod.close()
            for pod_dir in top.glob("attempts/*/run/pod"):  # a supervisor's pod, if the test killed it
                for layer in pod_dir.glob("containers/*"):
                    unmount_layer(layer)
                disk.remove(pod_dir)
                n.slots.release(pod_safe_id(pod_dir.parent.parent.name))  # its namespaces with its slot
            remove_cgroup_dirs(n.cgroup_parent)
            assert not [c for c in DEFAULT_FS.iterdir() if (c / n.cgroup_parent).exists()], "a test cgroup was left"
            with open("/proc/self/mountinfo") as f:
                assert not [line for line in f if str(top) in line], "a mount of the test was left behind"
        finally:
            with open("/proc/self/mountinfo") as f:
                mounted = any(str(top) in line for line in f)
            if not mounted:
                shutil.rmtree(top, ignore_errors=True)  # never through a mount that is still there


def run(node: Node, pod: Pod, name: str, request: ContainerRequest, image: ImageConfig = IMAGE,
        mounts: tuple[Mount, ...] = (), limits: Limits = Limits()) -> ContainerProcess:
    log = node.log()
    try:
        return pod.start(name, request, image, node.rootfs, log, mounts, limits)
    finally:
        os.close(log)


def sh(script: str, **kw: object) -> ContainerRequest:
    return ContainerRequest("main", command=("sh", "-c", script), **kw)  # type: ignore[arg-type]


def test_a_container_runs_to_completion_with_its_exit_code(node: Node) -> None:
    pod = node.pod("a")
    proc = run(node, pod, "main", sh("echo hello from main; id -u; echo to stderr >&2; exit 3"))
    assert proc.wait(30) == 3
    assert node.text().splitlines() == ["hello from main", "0", "to stderr"]
    assert node.runc.state(pod.container_id("main")).status == ContainerStatus.STOPPED


def test_env_args_working_dir_and_user_override_the_image(node: Node) -> None:
    image = ImageConfig(entrypoint=("sh", "-c"), cmd=("echo image cmd",), env=("PATH=/bin", "FOO=image", "BAR=keep"),
                        working_dir="/", user="trainer")
    pod = node.pod("b")
    request = ContainerRequest("main", args=('echo "$FOO $BAR $(pwd) $(id -u):$(id -g)"',), env={"FOO": "job"},
                               working_dir="/www")
    assert run(node, pod, "main", request, image).wait(30) == 0
    assert node.text().splitlines() == ["job keep /www 1001:1002"]
    assert run(node, pod, "defaults", ContainerRequest("defaults"), image).wait(30) == 0
    assert node.text().splitlines()[-1] == "image cmd"


def test_the_image_tree_is_the_pods_own_through_the_id_map_and_stays_unchanged(node: Node, rootfs: Path) -> None:
    pod = node.pod("j")
    root = run(node, pod, "root", sh("ls -ln /etc/group; echo 'extra:x:7:' >> /etc/group && echo appended"))
    assert root.wait(30) == 0, node.text()
    owner = node.text().split()[2:4]
    assert owner == ["0", "0"] and "appended" in node.text()  # the image's root files are the pod root's
    assert "extra" not in (rootfs / "etc/group").read_text()  # the write went to the container's own layer
    trainer = run(node, pod, "trainer", ContainerRequest("trainer", command=("sh", "-c", "echo hi > /home/trainer/f"),
                                                         user="trainer"))
    assert trainer.wait(30) == 0, node.text()
    assert not (rootfs / "home/trainer/f").exists()


def test_a_read_only_input_cannot_be_written_and_outputs_can(node: Node) -> None:
    pod = node.pod("c")
    d = node.dirs(pod, "inputs", "outputs")
    (d["inputs"] / "data.txt").write_text("input\n")
    mounts = (Mount("/nodus/inputs", str(d["inputs"]), read_only=True), Mount("/nodus/outputs", str(d["outputs"])))
    script = "cat /nodus/inputs/data.txt; echo x > /nodus/inputs/data.txt || exit 9"
    assert run(node, pod, "main", sh(script), mounts=mounts).wait(30) == 9
    assert "Read-only file system" in node.text()
    assert (d["inputs"] / "data.txt").read_text() == "input\n"
    assert run(node, pod, "writer", sh("echo result > /nodus/outputs/out.txt"), mounts=mounts).wait(30) == 0
    out = d["outputs"] / "out.txt"
    assert out.read_text() == "result\n" and out.stat().st_uid == pod.ids.host(0)


def test_a_memory_limit_below_use_reports_oom_killed(node: Node) -> None:
    pod = node.pod("d")
    proc = run(node, pod, "main", sh("x=aaaaaaaa; while true; do x=$x$x; done"), limits=Limits(memory_bytes=32 << 20))
    assert proc.wait(60) == 128 + signal.SIGKILL
    assert pod.oom_killed("main")
    calm = run(node, pod, "calm", sh("true"), limits=Limits(memory_bytes=32 << 20))
    assert calm.wait(30) == 0 and not pod.oom_killed("calm")


def test_a_sidecar_serves_the_main_container_on_localhost(node: Node) -> None:
    pod = node.pod("e")
    sidecar = run(node, pod, "web", ContainerRequest("web", command=("httpd", "-f", "-p", "8080", "-h", "/www")))
    deadline = time.monotonic() + 20
    while 8080 not in listening_ports(sidecar.pid):
        assert sidecar.poll() is None, node.text()
        assert time.monotonic() < deadline, "the sidecar never listened on 8080"
        sidecar.wait(0.05)
    netns = os.stat(f"/proc/{sidecar.pid}/ns/net").st_ino
    assert netns == os.stat(pod.namespaces.network).st_ino != os.stat("/proc/self/ns/net").st_ino  # the pod's own
    main = run(node, pod, "main", sh("wget -q -O - http://127.0.0.1:8080/"))
    assert main.wait(30) == 0, node.text()
    assert "hello from the sidecar" in node.text()
    assert pod.stop_all({"web": sidecar, "main": main}, grace=2) == ["main", "web"]
    assert pod.find() == {}


def test_sidecars_stop_in_reverse_order(node: Node) -> None:
    pod = node.pod("f")
    d = node.dirs(pod, "outputs")
    mounts = (Mount("/nodus/outputs", str(d["outputs"])),)
    procs = {}
    for name in ("first", "second", "third"):
        script = (f"trap 'echo {name} >> /nodus/outputs/order; exit 0' TERM; touch /nodus/outputs/ready-{name}; "
                  "while true; do sleep 0.05; done")
        procs[name] = run(node, pod, name, ContainerRequest(name, command=("sh", "-c", script)), mounts=mounts)
    deadline = time.monotonic() + 20
    while not all((d["outputs"] / f"ready-{n}").exists() for n in procs):
        assert time.monotonic() < deadline, node.text()
        procs["first"].wait(0.05)
    assert pod.stop_all(procs, grace=10) == ["third", "second", "first"]
    assert (d["outputs"] / "order").read_text().split() == ["third", "second", "first"]
    assert [p.returncode for p in procs.values()] == [0, 0, 0]


CALLER = """
import os, sys, time
from pathlib import Path
from typing import Any
from nodus.agent.oci.bundle import ContainerRequest, ImageConfig
from nodus.agent.oci.pod import Pod
from nodus.agent.oci.slots import IdSlots
from nodus.agent.statefile import read_json, write_json
from nodus.agent.oci.runc import Runc
root, pod_id, rootfs, cgroup = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
pod = Pod(pod_id, root / "pods" / "g", Runc(root / "runc"), IdSlots(root / "ids"), cgroup)
log = os.open(root / "attempt.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
proc = pod.start("main", ContainerRequest("main", command=("sleep", "300")), ImageConfig(env=("PATH=/bin",)), rootfs, log)
print(proc.pid, flush=True)
time.sleep(300)
"""


def test_the_container_outlives_its_caller_and_is_found_again_from_runc_state(node: Node) -> None:
    pod_id = f"g-{uuid.uuid4().hex[:6]}"
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(node.root), pod_id, str(node.rootfs),
                               f"{node.cgroup_parent}/g"], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        pid = int(caller.stdout.readline())
    finally:
        caller.kill()  # SIGKILL: nothing of the caller's runs after this
        caller.wait()
    again = node.pod("g", pod_id=pod_id)  # a restarted caller: same pod id, directory, slot and runc root
    assert again.ids == IdRange.for_slot(0) and node.slots.spares() == []  # its slot, its namespaces kept
    states = again.find()
    assert list(states) == [f"{pod_id}-main"]
    state = states[f"{pod_id}-main"]
    assert state.status == ContainerStatus.RUNNING and state.pid == pid
    os.kill(pid, 0)  # alive
    again.stop("main", ContainerProcess.of(state.id, pid), grace=1)
    assert again.find() == {}


@pytest.mark.skipif(disk.available() is not None, reason=f"no loop-mounted ext4 here: {disk.available()}")
def test_a_disk_floor_limits_the_writable_layers_and_goes_with_the_pod(node: Node) -> None:
    pod = node.pod("disk", disk_bytes=32 << 20)
    script = ("dd if=/dev/zero of=/small bs=1M count=8 2>/dev/null && echo small fits; "
              "dd if=/dev/zero of=/big bs=1M count=64; echo big rc=$?")
    assert run(node, pod, "main", sh(script)).wait(60) == 0
    out = node.text()
    assert "small fits" in out and "No space left on device" in out and "big rc=1" in out, out
    layers = pod.directory / "containers"
    assert os.path.ismount(layers), "the layers live on the pod's own filesystem"
    pod.close()
    assert not os.path.ismount(layers) and not (pod.directory / disk.IMAGE).exists()


def test_a_second_pod_cannot_read_the_first_pods_files(node: Node) -> None:
    first, second = node.pod("h1"), node.pod("h2")
    assert first.ids.host(0) != second.ids.host(0)
    for pod in (first, second):  # its layers are closed to host users and to the other pod
        st = pod.directory.stat()
        assert (st.st_uid, st.st_mode & 0o077) == (pod.ids.host(0), 0)
    d = node.dirs(first, "outputs")
    wrote = run(node, first, "main", sh("umask 077; echo s3cret > /nodus/outputs/secret; mkdir -p /private; "
                                        "echo mine > /private/file"),
                mounts=(Mount("/nodus/outputs", str(d["outputs"])),))
    assert wrote.wait(30) == 0
    assert (d["outputs"] / "secret").stat().st_uid == first.ids.host(0)
    layer = first.directory / "containers" / "main" / "upper"
    read = run(node, second, "main", sh("cat /other/secret || exit 7"),
               mounts=(Mount("/other", str(d["outputs"]), read_only=True), Mount("/layer", str(layer), read_only=True)))
    assert read.wait(30) == 7
    assert "Permission denied" in node.text() and "s3cret" not in node.text()


def test_id_slots_are_exclusive_and_survive_a_restart(tmp_path: Path) -> None:
    slots = IdSlots(tmp_path / "ids")
    assert slots.claim("a") == 0 and slots.claim("b") == 1 and slots.claim("a") == 0
    assert IdSlots(tmp_path / "ids").slot_of("b") == 1
    slots.release("a")
    assert slots.claim("c") == 0


def test_runc_failures_are_typed(node: Node) -> None:
    with pytest.raises(ContainerNotFound, match="container does not exist"):
        node.runc.state("nope")
    pod = node.pod("i")
    run(node, pod, "main", sh("true")).wait(30)
    with pytest.raises(ContainerExists):
        run(node, pod, "main", sh("true"))
    with pytest.raises(RuncMissing, match="not installed"):
        Runc(node.root / "runc", binary="/nonexistent/runc").list()


def attempt(node: Node, name: str, spec: dict[str, object]) -> AttemptLayout:
    """An attempt laid out as the agent does, with a spec.json that names the busybox image."""
    layout = AttemptLayout(node.root / "attempts" / name)
    layout.make()
    (layout.secrets / "token").mkdir(parents=True)
    (layout.secrets / "token" / "value").write_text("s3cret")
    (layout.secrets / "token" / "value").chmod(0o400)
    oci = {"rootfs": str(node.rootfs), "image_config": {"config": {"Env": ["PATH=/bin"]}},
           "runc_root": str(node.root / "runc"), "id_slots": str(node.root / "ids"), "args": None}
    env = {"PATH": "/bin", "NODUS_OUTPUTS_DIR": str(layout.outputs), "HOME": str(layout.root), "TMPDIR": str(layout.tmp)}
    write_json(layout.spec, {"attempt_id": name, "env": env,
                             "cgroup_root": node.cgroup_parent, "stop_grace": 5, "oci": oci, **spec})
    return layout


def supervisor(layout: AttemptLayout) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "nodus.agent.supervisor", str(layout.root)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def supervise(node: Node, name: str, spec: dict[str, object]) -> tuple[dict[str, Any], str]:
    """Runs `python -m nodus.agent.supervisor` on an attempt to its end; its status.json and log."""
    layout = attempt(node, name, spec)
    proc = supervisor(layout)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    return read_json(layout.status) or {}, layout.log.read_text()


def test_the_supervisor_runs_init_sidecar_and_main_as_containers_of_one_pod(node: Node) -> None:
    status, log = supervise(node, "sup-a", {
        "init": {"command": ["sh", "-c", "echo init ran as $(id -u) home $HOME tmp $TMPDIR; echo t > $TMPDIR/t"]},
        "sidecars": [{"name": "web", "command": ["httpd", "-f", "-p", "8080", "-h", "/www"], "startup_timeout": 20}],
        "command": ["sh", "-c", "wget -q -O - http://127.0.0.1:8080/ && cat /nodus/secrets/token/value > "
                    "$NODUS_OUTPUTS_DIR/result && touch /nodus/secrets/token/value || echo secrets are read-only"],
    })
    assert status["phase"] == "SUCCEEDED", (status["message"], log)
    assert status["exit_code"] == 0
    assert "[init] init ran as 0 home / tmp /tmp" in log and "hello from the sidecar" in log
    assert (node.root / "attempts/sup-a/run/tmp/t").read_text() == "t\n"
    assert "secrets are read-only" in log
    assert (node.root / "attempts/sup-a/outputs/result").read_text() == "s3cret"
    assert node.runc.list() == []  # every container of the pod deleted when the attempt ended
    ids = node.root / "ids"  # no slot held, no namespace of it left (their directories removed with them)
    assert not ids.exists() or ([p for p in ids.iterdir() if p.name.isdigit()] == [] and list(ids.glob("ns/*")) == [])


def test_the_supervisor_reports_a_container_oom_kill_as_oomkilled(node: Node) -> None:
    status, log = supervise(node, "sup-b", {"resources": {"memory_bytes": 32 << 20},
                                            "command": ["sh", "-c", "x=aaaaaaaa; while true; do x=$x$x; done"]})
    assert (status["phase"], status["reason"], status["oom_killed"]) == ("FAILED", "OOMKilled", True), (status, log)
    assert status["exit_code"] == 137


def test_the_checkpoint_hold_freezes_the_pod_and_a_cancel_stops_it_with_its_grace(node: Node) -> None:
    script = ("trap 'echo got TERM > $NODUS_OUTPUTS_DIR/term; exit 0' TERM; touch $NODUS_OUTPUTS_DIR/ready; "
              "while true; do sleep 0.05; done")
    layout = attempt(node, "sup-c", {"command": ["sh", "-c", script]})
    proc = supervisor(layout)
    try:
        deadline = time.monotonic() + 30
        while not (layout.outputs / "ready").exists() or (read_json(layout.status) or {}).get("phase") != "RUNNING":
            assert proc.poll() is None and time.monotonic() < deadline, layout.log.read_text()
            time.sleep(0.05)
        status = read_json(layout.status) or {}
        attempt_cgroup = Cgroup.locate(node.cgroup_parent, "sup-c")
        hold = Hold(layout, 1, opted_in=False, main_pid=int(status["main_pid"]), cgroup=attempt_cgroup)
        hold.acquire()
        try:
            assert hold.method == "freeze"
            container = Cgroup.locate(f"{node.cgroup_parent}/sup-c", "1-main")
            state = container.paths["freezer"] / "freezer.state"
            frozen_by = time.monotonic() + 10  # v1 freezes asynchronously: FREEZING, then FROZEN
            while state.read_text().strip() != "FROZEN":
                assert time.monotonic() < frozen_by, state.read_text()
                time.sleep(0.02)
        finally:
            hold.release()
        write_json(layout.cancel, {"reason": "Cancelled", "grace_seconds": 10})
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    status = read_json(layout.status) or {}
    assert (status["phase"], status["reason"]) == ("CANCELLED", "Cancelled"), (status, err)
    assert (layout.outputs / "term").read_text() == "got TERM\n"  # SIGTERM reached it, within its grace
    assert node.runc.list() == []


def test_a_failing_init_container_and_a_command_missing_from_the_image_fail_the_attempt_naming_them(
        node: Node) -> None:
    status, log = supervise(node, "sup-d", {"init": {"command": ["sh", "-c", "echo no schema; exit 4"]},
                                            "command": ["sh", "-c", "echo never"]})
    assert (status["phase"], status["reason"]) == ("FAILED", "InitFailed"), status
    assert status["message"] == "no schema" and "never" not in log
    status, log = supervise(node, "sup-e", {"command": ["/bin/train", "--fast"]})
    assert (status["phase"], status["reason"], status["exit_code"]) == ("FAILED", "Error", 127), status
    assert status["message"].startswith("command could not start: /bin/train: main: runc run"), status
    assert "no such file or directory" in status["message"]
    assert node.runc.list() == []


def test_pod_namespaces_are_made_even_from_a_process_running_grpc_threads(tmp_path: Path) -> None:
    """The agent (and this test process, after the gRPC tests) runs gRPC threads, and gRPC's at-fork
    handler restarts them in a forked child, which then cannot unshare a user namespace (EINVAL). The
    namespaces' holder is therefore a fresh program, and this works whatever threads the caller has."""
    import grpc

    from nodus.agent.oci.namespaces import create_namespaces

    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=0.2)  # gRPC's threads now run here
        paths = create_namespaces(tmp_path / "ns", IdRange.for_slot(4000))
        try:
            assert all(os.path.ismount(p) for p in (paths.user, paths.network, paths.ipc))
            shown = subprocess.run(["nsenter", f"--net={paths.network}", "--", "ip", "-o", "link", "show", "lo"],
                                   capture_output=True, text=True, check=True).stdout
            assert "UP" in shown.split("<", 1)[1].split(">", 1)[0].split(","), shown
            uid_map = subprocess.run(["nsenter", f"--user={paths.user}", "--", "cat", "/proc/self/uid_map"],
                                     capture_output=True, text=True)
            assert uid_map.returncode == 0 and str(IdRange.for_slot(4000).host_start) in uid_map.stdout, uid_map
        finally:
            remove_namespaces(tmp_path / "ns")
    finally:
        channel.close()


def ipc_queues(ipc: str) -> str:
    """The System V message queues of the IPC namespace bound at `ipc`, as ipcs lists them."""
    return subprocess.run(["nsenter", f"--ipc={ipc}", "--", "ipcs", "-q"], capture_output=True, text=True,
                          check=True).stdout


def test_a_pod_takes_a_spares_namespaces_and_never_a_dead_pods(node: Node) -> None:
    """ADR 0111: a pod claims a spare the agent made ahead (its containers run in the spare's namespaces); a slot
    claimed fresh gets new namespaces even where a pod killed before its release left its own bound there."""
    spare = node.slots.make_spare()
    made = node.slots.namespaces(spare)
    assert node.slots.spares() == [spare] and os.path.ismount(made / "net")
    pod = node.pod("spare")
    assert pod.ids == IdRange.for_slot(spare) and node.slots.spares() == []
    assert pod.namespaces.network == str(made / "net")
    proc = run(node, pod, "main", sh("sleep 30"))
    assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino == os.stat(made / "net").st_ino
    # a pod killed before its release: its slot file gone, its namespaces still bound, a queue in its IPC
    pod.stop_all({"main": proc}, grace=1)
    (node.slots.directory / str(spare)).unlink()
    subprocess.run(["nsenter", f"--ipc={made / 'ipc'}", "--", "ipcmk", "-Q"], check=True, capture_output=True)
    assert "0x" in ipc_queues(str(made / "ipc"))
    fresh = node.pod("fresh")
    assert fresh.ids == IdRange.for_slot(spare)  # the lowest free slot: the dead pod's
    assert "0x" not in ipc_queues(fresh.namespaces.ipc)  # new namespaces, not the dead pod's
