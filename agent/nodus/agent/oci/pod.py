"""One attempt's pod: its host id range, its namespaces, a writable layer per container, and the
containers themselves (init, sidecars in order, main), started through runc and stopped in reverse.

The supervisor owns a Pod and stays single-threaded: namespaces are made by a forked child, and a
container's init is the supervisor's child once it is a subreaper (runc.become_subreaper), so a
container is waited for like a process. Everything a restarted caller needs is on disk: the id
slot file, the namespace bind mounts under the pod directory and runc's state (docs/adr/0020-oci-pods.md).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..cgroups import DEFAULT_FS
from . import disk
from .bundle import (ID_SLOTS, ContainerRequest, Device, Hook, IdRange, ImageConfig, Limits, Mount, PodNamespaces,
                     resolve_process, runtime_spec)
from .egress import Egress, NodeNetwork, PodEgress, Policy
from .mounts import MountError, bind, libc, mount_layer, unmount, unmount_layer
from .runc import ContainerState, ContainerStatus, Runc, RuncError, wait_exit

NAMESPACES = ("user", "net", "ipc")
KILL_WAIT = 5.0
"""Seconds to wait for a container's init after SIGKILL before runc delete --force."""


class PodError(MountError):
    """The pod's namespaces, id range or a container's writable layer could not be set up."""


class IdSlots:
    """Which pod holds which host id range: one file per claimed slot, created exclusively, naming the pod.

    A slot is claimed before the pod's first container and released after its last one is deleted, so
    two live pods never share host ids and a restarted agent sees the claims it made.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def slot_of(self, pod_id: str) -> int | None:
        if not self.directory.is_dir():
            return None
        for entry in self.directory.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                holder = entry.read_text()
            except FileNotFoundError:
                continue  # another pod freed that slot between the listing and the read
            if holder == pod_id:
                return int(entry.name)
        return None

    def claim(self, pod_id: str) -> int:
        """The pod's slot: the one it holds already, else the lowest free one."""
        held = self.slot_of(pod_id)
        if held is not None:
            return held
        self.directory.mkdir(parents=True, exist_ok=True)
        for slot in range(ID_SLOTS):
            try:
                fd = os.open(self.directory / str(slot), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue
            # not fsynced: a restarted agent reads it from the page cache, and after a host crash no pod of
            # the slot lives (an empty file a crash left holds its slot either way, fsync or not)
            with os.fdopen(fd, "w") as f:
                f.write(pod_id)
            return slot
        raise PodError(f"all {ID_SLOTS} host id ranges are held by pods; wait for attempts to end")

    def release(self, pod_id: str) -> None:
        slot = self.slot_of(pod_id)
        if slot is not None:
            (self.directory / str(slot)).unlink(missing_ok=True)


def create_namespaces(directory: Path, ids: IdRange, host_network: bool = False) -> PodNamespaces:
    """A user namespace mapping container ids to `ids`, and a network and IPC namespace it owns
    (loopback up), kept alive by bind mounts on files in `directory`.

    The network namespace belongs to the pod's user namespace, so the containers may mount sysfs. With
    `host_network` (a gang member's pod) there is none: the containers stay in the node's network
    namespace (docs/adr/0033-gang-pods-on-the-host-network.md).
    """
    directory.mkdir(parents=True, exist_ok=True)
    kinds = tuple(ns for ns in NAMESPACES if not (host_network and ns == "net"))
    paths = PodNamespaces(str(directory / "user"), None if host_network else str(directory / "net"),
                          str(directory / "ipc"))
    if all(os.path.ismount(directory / ns) for ns in kinds):
        return paths  # made before a restart
    # The holder is a fresh program (unshare(1) exec'ing sh), not a fork of this process: a fork of a
    # process with gRPC threads gets them restarted by gRPC's at-fork handler, and a multithreaded
    # process cannot unshare a user namespace (EINVAL). It waits on stdin while the namespaces are
    # mapped and bound; loopback is brought up from here as host root (ip in the pod's netns).
    flags = ["--user", "--ipc"] if host_network else ["--user", "--net", "--ipc"]
    holder = subprocess.Popen(["unshare", *flags, "--", "sh", "-c", "echo u; read g"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.readline() != b"u\n":
            holder.wait(10)
            why = holder.stderr.read().decode(errors="replace").strip() if holder.stderr else ""
            raise PodError(f"could not create the pod's {', '.join(kinds)} namespaces: {why or 'unshare failed'}")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as f:
                f.write(f"0 {ids.host_start} {ids.size}\n")
        for ns in kinds:
            target = directory / ns
            target.touch()
            bind(f"/proc/{holder.pid}/ns/{ns}", target)
        if paths.network is not None:
            try:
                loopback_up(paths.network)
            except OSError as e:
                remove_namespaces(directory)
                raise PodError(f"could not bring up loopback in the pod's network namespace: {e}") from e
    finally:
        holder.stdin.close()  # the holder's `read` ends: it exits, the bind mounts keep the namespaces
        try:
            wait_exit(holder, 10)  # woken at its exit, not by Popen.wait's doubling sleeps (ADR 0076)
        except subprocess.TimeoutExpired:
            pass  # killed and reaped
    return paths


CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"
"""struct ifreq with its flags member (40 bytes, what the kernel copies)."""


def loopback_up(netns: str) -> None:
    """Brings `lo` up in the network namespace bound at `netns` (SIOCSIFFLAGS on a socket made inside it),
    from a short-lived thread that enters it: setns moves only the calling thread, and no `ip` program is
    started on the pod's way to running. Host root may: it holds CAP_NET_ADMIN over every pod's namespaces."""
    failed: list[OSError] = []

    def enter_and_raise() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc().setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
        except OSError as e:
            failed.append(e)

    thread = threading.Thread(target=enter_and_raise, name="pod-loopback")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def remove_namespaces(directory: Path) -> None:
    for ns in NAMESPACES:
        target = directory / ns
        if os.path.ismount(target):
            unmount(target)
        target.unlink(missing_ok=True)


@dataclass(slots=True)
class ContainerProcess:
    """A container's init as seen from the host: waited for through a pidfd; its exit code is known
    only to its parent (the subreaping supervisor)."""

    container_id: str
    pid: int
    pidfd: int
    returncode: int | None = None

    @classmethod
    def of(cls, container_id: str, pid: int) -> ContainerProcess:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = -1
        return cls(container_id, pid, pidfd)

    def poll(self) -> int | None:
        """The exit code once the init exited (128+N for signal N), else None; -1 when it was not ours."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            if self.pidfd >= 0 and not select.select([self.pidfd], [], [], 0)[0]:
                return None
            self.returncode = -1
            return self._closed()
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        self.returncode = 128 - code if code < 0 else code
        return self._closed()

    def _closed(self) -> int | None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Waits up to `timeout` seconds for the init to exit."""
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0 or self.pidfd < 0:
                return None
            select.select([self.pidfd], [], [], left)
        return code


def pod_safe_id(text: str) -> str:
    """`text` as a runc id and a file name (the pod's id from its attempt directory's name, a step's name)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


class Pod:
    """The containers of one attempt, in `directory` (under the attempt's run dir)."""

    def __init__(self, pod_id: str, directory: Path, runc: Runc, slots: IdSlots, cgroup_parent: str,
                 egress: Egress = Egress(), network: NodeNetwork = NodeNetwork(), disk_bytes: int = 0,
                 host_network: bool = False) -> None:
        self.pod_id = pod_safe_id(pod_id)
        self.directory = directory
        self.runc = runc
        self.slots = slots
        self.cgroup_parent = cgroup_parent.strip("/")
        """Containers' cgroups nest under the attempt's, so its freezer and memory limit hold them too."""
        if host_network and egress.policy != Policy.OPEN:
            # the node's network has no rules of the pod's: anything but Open would go unenforced
            raise PodError(f"spec.network.egress.policy: {egress.policy.value} cannot be enforced for a gang member, "
                           "whose pod shares the node's network; set it to Open")
        slot = slots.claim(self.pod_id)
        self.ids = IdRange.for_slot(slot)
        # Only host root and the pod's root may enter: runc resolves the rootfs as the pod's root, and the
        # layers hold files a host user must not run (a setuid file of the pod's root is the pod's uid).
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, self.ids.host(0), self.ids.host(0))
        directory.chmod(0o700)
        if disk_bytes:
            try:  # the writable layers on a filesystem of the disk floor's size (oci/disk.py)
                disk.mount(directory, disk_bytes, self.ids.host(0))
            except (disk.DiskLimitError, OSError) as e:
                slots.release(self.pod_id)
                raise PodError(f"the writable layers could not be limited to resources.disk: {e}") from e
        self.namespaces = create_namespaces(directory / "ns", self.ids, host_network)
        self.egress = (PodEgress(egress, "", None, network) if self.namespaces.network is None
                       else network.for_pod(egress, self.namespaces.network, slot))
        """The pod's way out (Deny: loopback only); the supervisor calls `egress.refresh` and reads `egress.denied`."""
        try:
            self.egress.attach()
        except BaseException:
            self.egress.detach()
            remove_namespaces(directory / "ns")
            disk.remove(directory)
            slots.release(self.pod_id)
            raise
        self.started: list[str] = []
        """Container names in start order."""

    def container_id(self, name: str) -> str:
        return f"{self.pod_id}-{pod_safe_id(name)}"

    def own(self, path: Path, uid: int = 0, gid: int = 0) -> None:
        """Makes a host path (a state or outputs dir to bind) belong to container user uid:gid."""
        os.chown(path, self.ids.host(uid), self.ids.host(gid))

    def start(self, name: str, request: ContainerRequest, image: ImageConfig, image_rootfs: Path, stdout: int,
              mounts: Sequence[Mount] = (), limits: Limits = Limits(), devices: Sequence[Device] = (),
              hooks: Sequence[Hook] = ()) -> ContainerProcess:
        """Creates and starts one container; its stdout and stderr go to `stdout`; runc runs `hooks` (a CDI
        spec's) at their points."""
        directory = self.directory / "containers" / pod_safe_id(name)
        rootfs = mount_layer(image_rootfs, directory, self.ids.host(0), self.namespaces.user)
        process = resolve_process(request, image, _read(image_rootfs / "etc/passwd"), _read(image_rootfs / "etc/group"))
        spec = runtime_spec(process, str(rootfs), hostname=self.pod_id[:63], ids=self.ids, namespaces=self.namespaces,
                            cgroups_path=f"/{self.cgroup_parent}/{pod_safe_id(name)}", mounts=mounts, limits=limits,
                            devices=devices, hooks=hooks)
        (directory / "config.json").write_text(json.dumps(spec))
        container_id = self.container_id(name)
        try:
            # one runc call, not create + start: a runc process fewer on every container's way to running
            # (its init is this subreaper's child all the same; the pidfd is opened on it, a zombie included)
            pid = self.runc.run(container_id, directory, stdout)
        except RuncError:
            try:
                self.runc.delete(container_id, force=True)  # what a failed run left (a container half made)
            except RuncError:
                pass  # the run's own error is the one to tell
            raise
        proc = ContainerProcess.of(container_id, pid)
        self.started.append(name)
        return proc

    def find(self) -> dict[str, ContainerState]:
        """This pod's containers as runc knows them, by container id (what a restarted caller adopts)."""
        prefix = self.pod_id + "-"
        return {s.id: s for s in self.runc.list() if s.id.startswith(prefix)}

    def oom_killed(self, name: str) -> bool:
        try:
            return self.runc.oom_kills(self.container_id(name)) > 0
        except (RuncError, OSError, KeyError, ValueError):
            return False

    def stop(self, name: str, proc: ContainerProcess | None, grace: float) -> None:
        """SIGTERM, up to `grace` seconds, SIGKILL to all its processes, then delete."""
        container_id = self.container_id(name)
        if proc is None or proc.poll() is None:
            for sig, all_processes, wait in ((signal.SIGTERM, False, grace), (signal.SIGKILL, True, KILL_WAIT)):
                try:
                    self.runc.kill(container_id, sig, all_processes)
                except RuncError:
                    break  # already stopped or gone
                if proc is not None and proc.wait(wait) is not None:
                    break
        self.runc.delete(container_id, force=True)

    def stop_all(self, procs: dict[str, ContainerProcess], grace: float) -> list[str]:
        """Every started container, the last started first; returns the order it stopped them in."""
        order = list(reversed(self.started))
        for name in order:
            self.stop(name, procs.get(name), grace)
        return order

    def close(self) -> None:
        """Deletes what is left of the pod: containers, writable layers (and their limited filesystem),
        namespaces, the id slot."""
        for container_id in self.find():
            self.runc.delete(container_id, force=True)
        containers = self.directory / "containers"
        if containers.is_dir():
            for directory in containers.iterdir():
                unmount_layer(directory)
        disk.remove(self.directory)
        self.egress.detach()
        remove_namespaces(self.directory / "ns")
        remove_cgroup_dirs(self.cgroup_parent)
        self.slots.release(self.pod_id)


def remove_cgroup_dirs(relative: str, fs: Path = DEFAULT_FS) -> None:
    """The empty cgroup directories under `relative` in every hierarchy (runc makes them in all v1
    controllers, not only the ones the attempt's Cgroup holds); a busy one stays."""
    hierarchies = [fs] if (fs / "cgroup.controllers").exists() else [c for c in fs.iterdir() if c.is_dir()]
    for top in (h / relative for h in hierarchies):
        # Bottom-up, and tolerant of directories vanishing meanwhile (os.walk ignores them).
        dirs = [Path(d) for d, _, _ in os.walk(top, topdown=False)]
        for path in dirs:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        break
                    time.sleep(0.01)  # its last tasks are still leaving (as Cgroup.remove waits)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
            return ""
        raise


def listening_ports(pid: int) -> set[int]:
    """TCP ports that `pid` or its descendants listen on, in whatever network namespace they are
    (read from their own /proc tables: a container's sockets are not in the host's /proc/net)."""
    pids, inodes = _descendants(pid), set()
    for p in pids:
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                target = os.readlink(f"/proc/{p}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN, one of theirs
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found
