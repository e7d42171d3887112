"""One attempt's pod: its host id range, its namespaces, a writable layer per container, and the
containers themselves (init, sidecars in order, main), started through runc and stopped in reverse.

The supervisor owns a Pod and stays single-threaded: namespaces are made by an `unshare` program (oci/namespaces.py), and a
container's init is the supervisor's child once it is a subreaper (runc.become_subreaper), so a
container is waited for like a process. Everything a restarted caller needs is on disk: the id
slot file, the namespace bind mounts under its slot (oci/slots.py) and runc's state (docs/adr/0020-oci-pods.md).
"""
from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..cgroups import DEFAULT_FS
from . import disk
from .bundle import ContainerRequest, Device, Hook, IdRange, ImageConfig, Limits, Mount, resolve_process, runtime_spec
from .egress import Egress, NodeNetwork, PodEgress, Policy
from .mounts import mount_layer, unmount_layer
from .namespaces import PodError, create_namespaces
from .runc import ContainerState, Runc, RuncError
from .slots import IdSlots

KILL_WAIT = 5.0
"""Seconds to wait for a container's init after SIGKILL before runc delete --force."""


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
                slots.release(self.pod_id)  # a spare's namespaces with it
                raise PodError(f"the writable layers could not be limited to resources.disk: {e}") from e
        try:  # made already when the slot was a spare's (ADR 0111) or the pod's own before a restart
            self.namespaces = create_namespaces(slots.namespaces(slot), self.ids, host_network)
        except BaseException:
            disk.remove(directory)
            slots.release(self.pod_id)
            raise
        self.egress = (PodEgress(egress, "", None, network) if self.namespaces.network is None
                       else network.for_pod(egress, self.namespaces.network, slot))
        """The pod's way out (Deny: loopback only); the supervisor calls `egress.refresh` and reads `egress.denied`."""
        try:
            self.egress.attach()
        except BaseException:
            self.egress.detach()
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
