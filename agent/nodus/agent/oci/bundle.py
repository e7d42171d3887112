"""A step's OCI runtime spec (runc's config.json), built from the step's request and its image.

Pure: values in, a dict out. The Kubernetes override rules hold: `command` replaces the image's
entrypoint (and drops its cmd), `args` replaces the cmd, `env` merges over the image's env,
`workingDir` overrides the image's. The pod's user, network and IPC namespaces are joined by path
(containerd's WithPodNamespaces); pid, mount, UTS and cgroup namespaces are the container's own.
See docs/adr/0020-oci-pods.md for the id ranges and the writable layer.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

ID_BASE = 1 << 20
"""The first host uid/gid given to pods; below it are the host's own users (and the usual 100000 subuid start)."""
ID_RANGE = 1 << 16
"""Host ids per pod: container ids 0..65535, so an image's users (nobody is 65534) all map."""
ID_SLOTS = 4096
"""Pods a node can hold at once (ID_BASE + 4096 * 65536 stays below 2^32 - 1, the invalid id)."""
CPU_PERIOD_US = 100_000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CAPABILITIES = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")
"""Docker's default set; root in the container holds them only inside the pod's user namespace."""
MASKED_PATHS = ("/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class BundleError(ValueError):
    """A request the runtime cannot turn into a container; the message names the field and the fix."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What the image's config says about its process (the OCI image spec's `config` object)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """KEY=VALUE, in the image's order."""
    working_dir: str = ""
    user: str = ""
    """`uid`, `uid:gid`, `name` or `name:group`, as the image wrote it ("" is root)."""

    @classmethod
    def from_oci(cls, config: Mapping[str, Any]) -> ImageConfig:
        """From an image config blob (its `config` member; a missing one is an image with no defaults)."""
        c = config.get("config") or {}
        return cls(tuple(c.get("Entrypoint") or ()), tuple(c.get("Cmd") or ()), tuple(c.get("Env") or ()),
                   str(c.get("WorkingDir") or ""), str(c.get("User") or ""))


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One step of the attempt (init, a sidecar, the main command) as the Job asked for it."""

    name: str
    command: tuple[str, ...] | None = None
    """Replaces the image's entrypoint; None keeps it."""
    args: tuple[str, ...] | None = None
    """Replaces the image's cmd; None keeps it (unless `command` is set)."""
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    user: str = ""
    """Overrides the image's user, in the same forms."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path bound into the container."""

    destination: str
    source: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """The step's share of `resources`; 0 means no limit."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0


@dataclass(frozen=True, slots=True)
class IdRange:
    """The host uids (and gids) a pod's container ids 0..size-1 map to."""

    host_start: int
    size: int = ID_RANGE

    @classmethod
    def for_slot(cls, slot: int) -> IdRange:
        """Slot N of the node's pods: ranges never overlap, so two pods' roots are different host users."""
        if not 0 <= slot < ID_SLOTS:
            raise BundleError("idSlot", f"slot {slot} is outside 0..{ID_SLOTS - 1}; free a slot or raise ID_SLOTS")
        return cls(ID_BASE + slot * ID_RANGE)

    def host(self, container_id: int) -> int:
        """The host id that container id `container_id` is."""
        if not 0 <= container_id < self.size:
            raise BundleError("user", f"id {container_id} is outside the pod's 0..{self.size - 1}")
        return self.host_start + container_id


@dataclass(frozen=True, slots=True)
class PodNamespaces:
    """The pod's namespaces, as files the supervisor bind-mounted (all its containers join them)."""

    user: str
    network: str | None
    """None: the node's own network namespace (a gang member's pod, docs/adr/0033-gang-pods-on-the-host-network.md)."""
    ipc: str


@dataclass(frozen=True, slots=True)
class Device:
    """A device node the container gets, with its device-cgroup allow rule (a GPU, from CDI or NVML)."""

    path: str
    kind: str
    """"c" (character) or "b" (block)."""
    major: int
    minor: int
    file_mode: int = 0o666
    host_path: str = ""
    """The host node when it lives elsewhere than `path` (a CDI hostPath): bound in, not made by runc."""


@dataclass(frozen=True, slots=True)
class Hook:
    """A program runc runs at one of the runtime spec's hook points (a CDI spec's hooks)."""

    hook_name: str
    """prestart, createRuntime, createContainer, startContainer, poststart or poststop."""
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True, slots=True)
class Process:
    """The container's resolved process: argv, env, cwd and user ids."""

    args: tuple[str, ...]
    env: tuple[str, ...]
    cwd: str
    uid: int
    gid: int


def process_args(request: ContainerRequest, image: ImageConfig) -> tuple[str, ...]:
    """The argv under Kubernetes' rules: command replaces entrypoint (and cmd), args replaces cmd."""
    if request.command is not None:
        argv = (*request.command, *(request.args or ()))
    else:
        argv = (*image.entrypoint, *(image.cmd if request.args is None else request.args))
    if not argv:
        raise BundleError(f"{request.name}.command", "the image has no entrypoint or cmd; set command")
    return argv


def merged_env(image_env: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """The image's env with `env` merged over it (an image variable keeps its place; new ones follow)."""
    merged: dict[str, str] = {}
    for item in image_env:
        key, _, value = item.partition("=")
        merged[key] = value
    merged.setdefault("PATH", DEFAULT_PATH)
    merged.update(env)
    return tuple(f"{k}={v}" for k, v in merged.items())


def resolve_user(user: str, passwd: str = "", group: str = "", field_path: str = "user") -> tuple[int, int]:
    """(uid, gid) of `user` in the image's /etc/passwd and /etc/group texts ("" is root)."""
    if not user:
        return 0, 0
    name, _, group_name = user.partition(":")
    users = _table(passwd)
    if name.isdigit():
        uid = int(name)
        gid = next((int(row[3]) for row in users.values() if row[2] == name and len(row) > 3), uid)
    elif name in users and len(users[name]) > 3:
        uid, gid = int(users[name][2]), int(users[name][3])
    else:
        raise BundleError(field_path, f"user {name!r} is not in the image's /etc/passwd; use a numeric uid")
    if group_name:
        groups = _table(group)
        if group_name.isdigit():
            gid = int(group_name)
        elif group_name in groups and len(groups[group_name]) > 2:
            gid = int(groups[group_name][2])
        else:
            raise BundleError(field_path, f"group {group_name!r} is not in the image's /etc/group; use a numeric gid")
    return uid, gid


def _table(text: str) -> dict[str, list[str]]:
    rows = (line.split(":") for line in text.splitlines() if line and not line.startswith("#"))
    return {row[0]: row for row in rows if len(row) > 2}


def resolve_process(request: ContainerRequest, image: ImageConfig, passwd: str = "", group: str = "") -> Process:
    """The process the container runs, every override applied."""
    cwd = request.working_dir or image.working_dir or "/"
    if not posixpath.isabs(cwd):
        raise BundleError(f"{request.name}.workingDir", f"{cwd!r} is not absolute; write it from /")
    uid, gid = resolve_user(request.user or image.user, passwd, group, f"{request.name}.user")
    return Process(process_args(request, image), merged_env(image.env, request.env), cwd, uid, gid)


def attempt_mounts(state: str, inputs: str, outputs: str, progress: str,
                   secrets: Mapping[str, str] = {}) -> tuple[Mount, ...]:
    """The literal /nodus paths of DESIGN.md, over the attempt's own directories; secret files read-only."""
    return (Mount("/nodus/state", state), Mount("/nodus/inputs", inputs, read_only=True),
            Mount("/nodus/outputs", outputs), Mount("/nodus/progress", progress),
            *(Mount(dest, src, read_only=True) for dest, src in sorted(secrets.items())))


def runtime_spec(process: Process, rootfs: str, *, hostname: str, ids: IdRange, namespaces: PodNamespaces,
                 cgroups_path: str, mounts: Sequence[Mount] = (), limits: Limits = Limits(),
                 devices: Sequence[Device] = (), hooks: Sequence[Hook] = ()) -> dict[str, Any]:
    """config.json for one container of the pod.

    `rootfs` is the container's merged root (the image's read-only tree under the container's own
    writable layer), so the root is writable to the container while the image stays shared.
    A device with a `host_path` is bound from there (runc in a user namespace binds every device
    from its own path, which a CDI hostPath may not be); the device cgroup allows it either way.
    """
    destinations = [m.destination for m in mounts] + [d.path for d in devices if d.host_path]
    for m in mounts:
        if not posixpath.isabs(m.destination) or ".." in m.destination.split("/"):
            raise BundleError("mountPath", f"{m.destination!r} must be an absolute path without '..'")
    if len(set(destinations)) != len(destinations):
        raise BundleError("mountPath", "two mounts share a path; give each its own mountPath")
    idmap = [{"containerID": 0, "hostID": ids.host_start, "size": ids.size}]
    for what, value in (("uid", process.uid), ("gid", process.gid)):
        if not 0 <= value < ids.size:
            raise BundleError("user", f"{what} {value} is outside the pod's 0..{ids.size - 1}")
    spec: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": process.uid, "gid": process.gid},
            "args": list(process.args),
            "env": list(process.env),
            "cwd": process.cwd,
            "capabilities": {k: list(CAPABILITIES) for k in ("bounding", "effective", "permitted")},
            # No rlimits: the supervisor's are inherited (a user namespace may not raise a hard limit).
            "noNewPrivileges": True,
            "oomScoreAdj": 0,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": [*_system_mounts(host_network=not namespaces.network), *(_bind(m) for m in mounts),
                   *(_device_bind(d) for d in devices if d.host_path)],
        "linux": {
            "uidMappings": idmap,
            "gidMappings": idmap,
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "uts"}, {"type": "cgroup"},
                           {"type": "user", "path": namespaces.user},
                           *([{"type": "network", "path": namespaces.network}] if namespaces.network else []),
                           {"type": "ipc", "path": namespaces.ipc}],
            "cgroupsPath": cgroups_path,
            "resources": _resources(limits, devices),
            "devices": [{"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor,
                         "fileMode": d.file_mode, "uid": 0, "gid": 0} for d in devices if not d.host_path],
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
    if hooks:
        spec["hooks"] = _hooks(hooks)
    return spec


def _hooks(hooks: Sequence[Hook]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for h in hooks:
        entry: dict[str, Any] = {"path": h.path, "args": list(h.args) or [h.path]}
        if h.env:
            entry["env"] = list(h.env)
        if h.timeout is not None:
            entry["timeout"] = h.timeout
        out.setdefault(h.hook_name, []).append(entry)
    return out


def _device_bind(d: Device) -> dict[str, Any]:
    # No nodev here: the node must stay openable; nosuid still holds.
    return {"destination": d.path, "type": "bind", "source": d.host_path, "options": ["bind", "rprivate", "nosuid"]}


def _resources(limits: Limits, devices: Sequence[Device]) -> dict[str, Any]:
    # Deny every device, then allow the assigned ones; runc adds its defaults (null, zero, tty, ...).
    rules: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    rules += [{"allow": True, "type": d.kind, "major": d.major, "minor": d.minor, "access": "rwm"} for d in devices]
    out: dict[str, Any] = {"devices": rules}
    if limits.memory_bytes:
        out["memory"] = {"limit": limits.memory_bytes, "swap": limits.memory_bytes}
    if limits.cpu_millis:
        out["cpu"] = {"quota": limits.cpu_millis * CPU_PERIOD_US // 1000, "period": CPU_PERIOD_US}
    if limits.pids:
        out["pids"] = {"limit": limits.pids}
    return out


def _bind(m: Mount) -> dict[str, Any]:
    options = ["rbind", "rprivate", "nosuid", "nodev"] + (["ro"] if m.read_only else [])
    return {"destination": m.destination, "type": "bind", "source": m.source, "options": options}


def _system_mounts(host_network: bool = False) -> list[dict[str, Any]]:
    # sysfs can be mounted because the pod's network namespace belongs to the pod's user namespace. On the
    # node's network namespace (which the pod's user namespace does not own) the kernel refuses a new sysfs:
    # the node's /sys is bound read-only instead, as rootless Podman does for --network host.
    sysfs = ({"destination": "/sys", "type": "bind", "source": "/sys",
              "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]} if host_network else
             {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]})
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755",
                                                                                "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        sysfs,
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
    ]
