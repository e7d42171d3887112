"""A pod's user, network and IPC namespaces: made by a fresh `unshare` holder, kept alive by bind mounts
on files in a directory, loopback brought up from the host (docs/adr/0020-oci-pods.md). Where that
directory is, and who holds it, is oci/slots.py's: the namespaces belong to an id slot (ADR 0111).
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

from .bundle import IdRange, PodNamespaces
from .mounts import MountError, bind, libc, unmount
from .runc import wait_exit

NAMESPACES = ("user", "net", "ipc")


class PodError(MountError):
    """The pod's namespaces, id range or a container's writable layer could not be set up."""


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
    """Unbinds and removes the namespace files in `directory`, then the directory if that left it empty."""
    for ns in NAMESPACES:
        target = directory / ns
        if os.path.ismount(target):
            unmount(target)
        target.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass  # not there, or something else lives in it
