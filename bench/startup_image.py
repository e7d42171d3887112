"""bench/startup.py's image phase: the `runc run` floor its image Jobs are measured beside, the steps an image
attempt's supervisor takes that a process attempt's does not, and the cleanup of what the agent's pods leave.

The runc floor: `runc run` of an equivalent bundle, --jobs times, from the command line: the
same busybox rootfs (the pushed layout, `umoci raw unpack`ed and chowned to a pod id range, where the
agent mounts an overlay over an idmapped view of its cached tree), and the agent's own config.json
(bundle.runtime_spec: its system mounts, masks, capabilities, device cgroup, id map; of the binds
only the FIFO, not the attempt's /nodus ones) except that runc makes the user, network and IPC
namespaces itself where the agent's pod joins ones made beforehand. Timed
from the spawn of `runc run` to the container's process running: its command is
`sh -c 'echo > /ready'` with /ready a FIFO bound in from the host, and the time is when this process
reads that byte. Not spawn→exit, because the agent reports Running once `runc run --detach` returns, before
the program ends, and runc's teardown (the cgroup, the namespaces) comes after; spawn→exit is printed
beside it. The agent's per-Job work that runc run does not do (the supervisor, the pod's namespaces,
the overlay mount, the detached run) is in what the 30 ms allow.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

IMAGE_TOOLS = ("runc", "skopeo", "umoci", "docker-registry")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clean_pods(work: Path) -> None:
    """Whatever of the agent's pods is left once it stopped (as tests/test_oci_e2e.py's): containers,
    writable layers, namespace bind mounts."""
    if not (work / "runc").exists():
        return
    from nodus.agent.oci.mounts import unmount_layer
    from nodus.agent.oci.runc import Runc
    from nodus.agent.oci.slots import IdSlots

    runc = Runc(work / "runc")
    for state in runc.list():
        runc.delete(state.id, force=True)
    for pod_dir in work.glob("attempts/*/run/pod"):
        for layer in pod_dir.glob("containers/*"):
            unmount_layer(layer)
    IdSlots(work / "ids").unbind_all()  # the pods' namespaces and the agent's spares (ADR 0111)


def mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    top = os.path.realpath(root)
    return [p for p in points if p == top or p.startswith(top + "/")]


def remove_tree(root: Path) -> None:
    """rmtree, never through a mount still there (unmounted first, deepest first; left in place if that fails)."""
    for point in sorted(mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    if mounts_under(root):
        log(f"mounts remain under {root}; left in place")
        return
    shutil.rmtree(root, ignore_errors=True)


def image_tools_missing() -> str:
    """Why the image phase cannot run here ("" when it can)."""
    missing = [t for t in IMAGE_TOOLS if shutil.which(t) is None]
    if missing:
        return "needs " + ", ".join(missing)
    return "" if os.geteuid() == 0 else "needs root (runc pods)"


def runc_floor(layout: Path, work: Path, runs: int, after_each: Callable[[int], None] = lambda i: None
               ) -> tuple[list[float], list[float]]:
    """`runc run` of the bundle an image Job's main container gets, `runs` times: (spawn → the container's
    process running, spawn → runc's exit), in ms. See the module docstring for how it matches the agent's.
    `after_each(i)` runs after run i (the image Job measured beside it, so both see the same load)."""
    from nodus.agent.oci.bundle import ID_SLOTS, IdRange, Mount, PodNamespaces, Process, runtime_spec

    work.mkdir(mode=0o711)
    bundle, root = work / "bundle", work / "runc"
    bundle.mkdir(mode=0o711)
    rootfs = bundle / "rootfs"
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{layout}:latest", str(rootfs)], check=True,
                   capture_output=True, timeout=120)
    ids = IdRange.for_slot(ID_SLOTS - 1)  # the agent claims its slots from 0 up
    owner = ids.host(0)  # the image's root-owned tree as the pod's root, as the agent's idmapped view shows it
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(entry, owner, owner)
    fifo = work / "ready.fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    process = Process(("/bin/sh", "-c", "echo > /ready"), ("PATH=/bin",), "/", 0, 0)
    argv_base = ["runc", "--root", str(root), "--log", str(work / "runc.log"), "--log-format", "json"]
    running: list[float] = []
    exited: list[float] = []
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer of its own: no EOF between runs, reads wait for data
    try:
        with open(work / "container.log", "ab") as out:
            for i in range(runs):
                cid = f"nodus-bench-runc-{os.getpid()}-{i}"
                spec = runtime_spec(process, str(rootfs), hostname=cid, ids=ids, namespaces=PodNamespaces("", "", ""),
                                    cgroups_path=f"/{cid}", mounts=[Mount("/ready", str(fifo))])
                # runc makes the pod's user, network and IPC namespaces itself (the agent joins made ones)
                spec["linux"]["namespaces"] = [{"type": n["type"]} for n in spec["linux"]["namespaces"]]
                (bundle / "config.json").write_text(json.dumps(spec))
                t0 = time.perf_counter()
                proc = subprocess.Popen([*argv_base, "run", "--bundle", str(bundle), cid], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT)
                try:
                    ready, _, _ = select.select([fd], [], [], 60)
                    t1 = time.perf_counter()
                    rc = proc.wait(60)
                    t2 = time.perf_counter()
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                if not ready or rc != 0:
                    raise RuntimeError(f"runc run {cid}: exit {rc}, "
                                       f"{'no byte' if not ready else 'a byte'} on the FIFO:\n"
                                       f"{(work / 'runc.log').read_text(errors='replace')[-2000:]}")
                os.read(fd, 64)
                running.append((t1 - t0) * 1000)
                exited.append((t2 - t0) * 1000)
                after_each(i)
    finally:
        os.close(fd)
        if root.exists():
            listed = subprocess.run([*argv_base, "list", "--quiet"], capture_output=True, text=True, timeout=60)
            for cid in listed.stdout.split():
                subprocess.run([*argv_base, "delete", "--force", cid], capture_output=True, timeout=60)
    return running, exited


IMPORT_CONTAINERS = """
import os, time
import nodus.agent.supervisor.__main__, nodus.agent.zygote, tarfile, psutil, zstandard  # what the zygote holds
r, w = os.pipe()
pid = os.fork()  # a supervisor is a fork of the zygote
if pid == 0:
    t = time.perf_counter()
    import nodus.agent.supervisor.containers  # what a supervisor of an image attempt imports first
    os.write(w, repr((time.perf_counter() - t) * 1000).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 100).decode())
"""


def agent_steps(layout: Path, work: Path, runs: int) -> dict[str, float]:
    """The steps an image attempt's supervisor takes that a process attempt's does not, each run here `runs`
    times with the agent's own functions (medians, ms): importing its container runtime (in a fork of an
    interpreter holding what the zygote preloads), the pod's namespaces, the writable layer, `runc run --detach`."""
    from nodus.agent.oci.bundle import IdRange, Process, runtime_spec
    from nodus.agent.oci.mounts import mount_layer, unmount_layer
    from nodus.agent.oci.namespaces import create_namespaces
    from nodus.agent.oci.slots import IdSlots
    from nodus.agent.oci.runc import Runc

    work.mkdir(mode=0o711)
    tree = work / "tree"  # root-owned, as the agent's cache holds it
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{layout}:latest", str(tree)], check=True,
                   capture_output=True, timeout=120)
    runc = Runc(work / "runc")
    slots = IdSlots(work / "ids")
    steps: dict[str, list[float]] = {k: [] for k in ("import", "spare", "namespaces", "layer", "run")}
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORT_CONTAINERS], check=True, capture_output=True, text=True,
                             timeout=60)
        steps["import"].append(float(out.stdout.split()[-1]))
    try:
        with open(work / "container.log", "ab") as log_file:
            for i in range(runs):
                pod = work / f"pod{i}"
                pod.mkdir()
                layer = pod / "containers" / "main"
                cid = f"nodus-bench-steps-{os.getpid()}-{i}"
                try:
                    s0 = time.perf_counter()
                    slots.make_spare()  # the agent's, after the attempt before this one ended (ADR 0111)
                    s1 = time.perf_counter()
                    t0 = time.perf_counter()
                    slot = slots.claim(cid)  # the spare's slot, its namespaces made: as Pod() takes it
                    ids = IdRange.for_slot(slot)
                    ns = create_namespaces(slots.namespaces(slot), ids)
                    t1 = time.perf_counter()
                    os.chown(pod, ids.host(0), ids.host(0))
                    pod.chmod(0o700)
                    t1b = time.perf_counter()  # the chown is Pod()'s, as before: in neither step
                    merged = mount_layer(tree, layer, ids.host(0), ns.user)
                    t2 = time.perf_counter()
                    spec = runtime_spec(Process(("/bin/true",), ("PATH=/bin",), "/", 0, 0), str(merged), hostname=cid,
                                        ids=ids, namespaces=ns, cgroups_path=f"/{cid}")
                    (layer / "config.json").write_text(json.dumps(spec))
                    runc.run(cid, layer, log_file.fileno())  # run --detach, as Pod.start does
                    t3 = time.perf_counter()
                finally:
                    runc.delete(cid, force=True)
                    unmount_layer(layer)
                    slots.release(cid)
                for key, (a, b) in zip(("spare", "namespaces", "layer", "run"), ((s0, s1), (t0, t1), (t1b, t2), (t2, t3))):
                    steps[key].append((b - a) * 1000)
    finally:
        if runc.root.exists():
            for state in runc.list():
                runc.delete(state.id, force=True)
    return {k: statistics.median(v) for k, v in steps.items()}
