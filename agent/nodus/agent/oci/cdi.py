"""GPUs into containers through CDI (the Container Device Interface), or the driver's own files without it.

A CDI spec (cncf-tags/container-device-interface SPEC.md; `nvidia-ctk cdi generate` writes one) is a
JSON or YAML file in /etc/cdi or /var/run/cdi naming devices of a kind (`nvidia.com/gpu`) and the
container edits each needs: device nodes, mounts (the driver's libraries), env and hooks, plus edits
common to every device of the spec. An attempt's assigned GPUs resolve by UUID (`nvidia.com/gpu=GPU-…`,
what `nvidia-ctk` names them) and else by NVML index; the edits become `bundle` values (the device
cgroup then allows only those nodes) and NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES name the
assigned UUIDs. A host without a spec gets /dev/nvidia<N> of each assigned GPU, the control nodes and
the driver's libraries of the probed version (`driver_edits`).

`stale` checks, before each attempt, that every node, mount and hook a spec names still exists and
that versioned driver libraries are of the version NVML probed: a driver update leaves the old spec
behind, and runc would otherwise fail inside the container's setup with an error no customer can act on.

Hooks: kept and handed to runc as the runtime spec's hooks of the same name, so runc runs them
(`nvidia-cdi-hook` makes the libcuda symlinks and the ld cache in a createContainer hook). Loading
is I/O; everything after it is pure over the loaded values (`stat` is injected for the tests).
"""
from __future__ import annotations

import os
import re
import stat as stat_mod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import yaml

if TYPE_CHECKING:  # the supervisor imports this module; NVML's (and protobuf's) import is the agent's alone
    from ..nvml import Nvml

from .bundle import ContainerRequest, Device, Hook, Mount

GPU_KIND = "nvidia.com/gpu"
SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where specs live, lowest priority first: a device in /var/run/cdi replaces one of the same name in /etc/cdi."""
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
"""The OCI runtime spec's hook points a CDI hook may name."""
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
"""Nodes every GPU container needs besides its own /dev/nvidia<N> (those the host has)."""
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
DRIVER_LIBRARY = re.compile(r"^lib(cuda|nvidia-[\w-]+|nvcuvid|nvoptix)\.so(\.\d+)*$")
VERSIONED = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
"""A library file named with the driver's full version (libcuda.so.535.104.05), as the driver installs them."""

Stat = Callable[[str], os.stat_result]


class CdiError(ValueError):
    """A spec the agent cannot use; the message names the file, the field and the fix."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node a spec names: `path` in the container, `host_path` on the host (the same when unset)."""

    path: str
    host_path: str = ""
    kind: str = ""
    """"c" or "b"; "" reads it from the host node."""
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None

    @property
    def source(self) -> str:
        return self.host_path or self.path


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a device (or a whole spec) adds to a container."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def __add__(self, other: ContainerEdits) -> ContainerEdits:
        nodes = {n.path: n for n in (*self.device_nodes, *other.device_nodes)}  # a node named twice is one node
        mounts = {m.destination: m for m in (*self.mounts, *other.mounts)}
        hooks = tuple(dict.fromkeys((*self.hooks, *other.hooks)))
        return ContainerEdits((*self.env, *other.env), tuple(nodes.values()), tuple(mounts.values()), hooks)


@dataclass(frozen=True, slots=True)
class Spec:
    """One CDI spec file of the GPU kind."""

    source: str
    version: str
    edits: ContainerEdits
    """Edits every device of the spec brings."""
    devices: Mapping[str, ContainerEdits] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AssignedGpu:
    """A GPU the agent assigned to the attempt: its NVML index and UUID."""

    index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class GpuInjection:
    """The assigned GPUs as bundle values: what `Pod.start` and the step's env take."""

    devices: tuple[Device, ...]
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]
    hooks: tuple[Hook, ...]
    source: str
    """The spec file used, or "driver" when none was."""

    def to_json(self) -> dict[str, Any]:
        """For spec.json's "oci" section: the agent resolves, the supervisor's containers apply."""
        return {"source": self.source, "env": dict(self.env),
                "devices": [{"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor,
                             "fileMode": d.file_mode, "hostPath": d.host_path} for d in self.devices],
                "mounts": [{"containerPath": m.destination, "hostPath": m.source, "readOnly": m.read_only}
                           for m in self.mounts],
                "hooks": [{"hookName": h.hook_name, "path": h.path, "args": list(h.args), "env": list(h.env),
                           "timeout": h.timeout} for h in self.hooks]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GpuInjection:
        return cls(tuple(Device(d["path"], d["type"], int(d["major"]), int(d["minor"]), int(d["fileMode"]),
                                d.get("hostPath") or "") for d in doc.get("devices") or ()),
                   tuple(Mount(m["containerPath"], m["hostPath"], bool(m.get("readOnly")))
                         for m in doc.get("mounts") or ()),
                   dict(doc.get("env") or {}),
                   tuple(Hook(h["hookName"], h["path"], tuple(h.get("args") or ()), tuple(h.get("env") or ()),
                              h.get("timeout")) for h in doc.get("hooks") or ()),
                   str(doc.get("source") or ""))


# -- loading ------------------------------------------------------------------------------------------

def load_specs(dirs: Sequence[Path] = SPEC_DIRS, kind: str = GPU_KIND) -> list[Spec]:
    """The specs of `kind` in `dirs` (missing dirs are no specs), lowest priority first."""
    specs = []
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(p for p in d.iterdir() if p.suffix in (".json", ".yaml", ".yml")):
            try:
                doc = yaml.safe_load(path.read_text())  # JSON is YAML
            except (OSError, yaml.YAMLError) as e:
                raise CdiError(f"{path}: not a readable CDI spec ({e}); fix or remove the file") from None
            if _kind(doc) == kind:  # another vendor's spec is not ours to judge
                specs.append(parse_spec(doc, str(path)))
    return specs


def _kind(doc: Any) -> str:
    return str(doc.get("kind") or "") if isinstance(doc, dict) else ""


def parse_spec(doc: Any, source: str) -> Spec:
    """A spec from its parsed document, every field checked (the error names the file and the field)."""
    if not isinstance(doc, dict):
        raise CdiError(f"{source}: a CDI spec is a mapping with cdiVersion, kind and devices")
    if not doc.get("cdiVersion"):
        raise CdiError(f"{source}: cdiVersion is missing; regenerate the spec (nvidia-ctk cdi generate)")
    kind = _kind(doc)
    if "/" not in kind:
        raise CdiError(f"{source}: kind {kind!r} is not vendor/class (for example {GPU_KIND})")
    devices: dict[str, ContainerEdits] = {}
    for i, dev in enumerate(doc.get("devices") or ()):
        where = f"{source}: devices[{i}]"
        if not isinstance(dev, dict) or not dev.get("name"):
            raise CdiError(f"{where}.name is missing; every device needs a name")
        devices[str(dev["name"])] = _edits(dev.get("containerEdits"), f"{where}.containerEdits")
    return Spec(source, str(doc["cdiVersion"]), _edits(doc.get("containerEdits"), f"{source}: containerEdits"), devices)


def _edits(doc: Any, where: str) -> ContainerEdits:
    if doc is None:
        return ContainerEdits()
    if not isinstance(doc, dict):
        raise CdiError(f"{where} must be a mapping")
    env = tuple(str(e) for e in doc.get("env") or ())
    if bad := [e for e in env if "=" not in e]:
        raise CdiError(f"{where}.env: {bad[0]!r} is not KEY=VALUE")
    nodes = tuple(_node(n, f"{where}.deviceNodes[{i}]") for i, n in enumerate(doc.get("deviceNodes") or ()))
    mounts = tuple(_mount(m, f"{where}.mounts[{i}]") for i, m in enumerate(doc.get("mounts") or ()))
    hooks = tuple(_hook(h, f"{where}.hooks[{i}]") for i, h in enumerate(doc.get("hooks") or ()))
    return ContainerEdits(env, nodes, mounts, hooks)


def _absolute(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise CdiError(f"{where} must be an absolute path, not {value!r}")
    return value


def _node(doc: Any, where: str) -> DeviceNode:
    if not isinstance(doc, dict):
        raise CdiError(f"{where} must be a mapping with a path")
    kind = str(doc.get("type") or "")
    if kind not in ("", "c", "b", "u"):
        raise CdiError(f"{where}.type {kind!r} is not c or b")
    mode = doc.get("fileMode")
    return DeviceNode(_absolute(doc.get("path"), f"{where}.path"),
                      _absolute(doc["hostPath"], f"{where}.hostPath") if doc.get("hostPath") else "",
                      "c" if kind == "u" else kind, _int(doc.get("major")), _int(doc.get("minor")),
                      int(mode) if mode is not None else None)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _mount(doc: Any, where: str) -> Mount:
    if not isinstance(doc, dict):
        raise CdiError(f"{where} must be a mapping with hostPath and containerPath")
    options = [str(o) for o in doc.get("options") or ()]
    return Mount(_absolute(doc.get("containerPath"), f"{where}.containerPath"),
                 _absolute(doc.get("hostPath"), f"{where}.hostPath"), read_only="ro" in options)


def _hook(doc: Any, where: str) -> Hook:
    if not isinstance(doc, dict) or doc.get("hookName") not in HOOK_NAMES:
        name = doc.get("hookName") if isinstance(doc, dict) else doc
        raise CdiError(f"{where}.hookName {name!r} is not one of {', '.join(HOOK_NAMES)}")
    timeout = doc.get("timeout")
    return Hook(str(doc["hookName"]), _absolute(doc.get("path"), f"{where}.path"),
                tuple(str(a) for a in doc.get("args") or ()), tuple(str(e) for e in doc.get("env") or ()),
                int(timeout) if timeout is not None else None)


# -- resolving ------------------------------------------------------------------------------------------

def resolve(specs: Sequence[Spec], gpus: Sequence[AssignedGpu], kind: str = GPU_KIND) -> tuple[ContainerEdits, str]:
    """The edits of the assigned GPUs (each by UUID, else by index) and the spec(s) they came from.

    A later spec's device replaces an earlier one of the same name (the directories' priority); the
    common edits of every spec that supplied a device apply once.
    """
    named: dict[str, tuple[Spec, ContainerEdits]] = {}
    for spec in specs:
        for name, edits in spec.devices.items():
            named[name] = (spec, edits)
    edits, used = ContainerEdits(), dict[str, Spec]()
    for gpu in gpus:
        hit = named.get(gpu.uuid) or named.get(str(gpu.index))
        if hit is None:
            have = ", ".join(sorted(named)) or "none"
            raise CdiError(f"{kind}={gpu.uuid} (index {gpu.index}) is in no CDI spec (it has: {have}); "
                           "regenerate the spec (nvidia-ctk cdi generate)")
        used.setdefault(hit[0].source, hit[0])
        edits = edits + hit[1]
    for spec in used.values():
        edits = spec.edits + edits
    return edits, ", ".join(used)


def driver_edits(gpus: Sequence[AssignedGpu], driver_version: str, dev: str = "/dev",
                 library_dirs: Sequence[str] = LIBRARY_DIRS) -> ContainerEdits:
    """Without a spec: each GPU's /dev/nvidia<N>, the control nodes, and the driver's libraries of
    `driver_version` (each soname link mounted as the file it resolves to, read-only)."""
    nodes = [DeviceNode(f"/dev/nvidia{g.index}", f"{dev}/nvidia{g.index}") for g in gpus]
    for path in CONTROL_NODES:
        host = dev + path.removeprefix("/dev")
        if os.path.exists(host):
            nodes.append(DeviceNode(path, host))
    mounts = []
    for d in library_dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            real = os.path.realpath(path)
            found = VERSIONED.search(os.path.basename(real))
            if DRIVER_LIBRARY.match(name) and found and found.group(1) == driver_version and os.path.isfile(real):
                mounts.append(Mount(path, real, read_only=True))
    return ContainerEdits(device_nodes=tuple(nodes), mounts=tuple(mounts))


def inject(edits: ContainerEdits, gpus: Sequence[AssignedGpu], source: str, stat: Stat = os.stat) -> GpuInjection:
    """Bundle values: every node with its numbers (read from the host node where the spec leaves them
    out), the mounts, the spec's env with the visible-devices variables set to the assigned UUIDs."""
    devices = []
    for node in edits.device_nodes:
        kind, major, minor = node.kind, node.major, node.minor
        if not kind or major is None or minor is None:
            try:
                st = stat(node.source)
            except OSError as e:
                raise CdiError(f"device node {node.source}: {e.strerror}; regenerate the CDI spec") from None
            kind = kind or ("b" if stat_mod.S_ISBLK(st.st_mode) else "c")
            major = os.major(st.st_rdev) if major is None else major
            minor = os.minor(st.st_rdev) if minor is None else minor
        devices.append(Device(node.path, kind, major, minor, node.file_mode if node.file_mode is not None else 0o666,
                              host_path=node.host_path if node.host_path != node.path else ""))
    env = dict(e.split("=", 1) for e in edits.env)
    visible = ",".join(g.uuid for g in gpus)
    # UUIDs, not indexes: inside the container only the assigned GPUs exist, so host indexes would mislead.
    env.update(NVIDIA_VISIBLE_DEVICES=visible or "void", CUDA_VISIBLE_DEVICES=visible)
    return GpuInjection(tuple(devices), edits.mounts, env, edits.hooks, source)


VISIBLE_DEVICES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def with_gpus(request: ContainerRequest, injection: GpuInjection) -> ContainerRequest:
    """The step's request with the GPUs' env: the spec's under the Job's own, the visible devices over it
    (a Job's NVIDIA_VISIBLE_DEVICES=all must not name GPUs another attempt holds)."""
    env = {k: v for k, v in injection.env.items() if k not in VISIBLE_DEVICES}
    env.update(request.env)
    env.update({k: injection.env[k] for k in VISIBLE_DEVICES if k in injection.env})
    return replace(request, env=env)


def gpu_injection(gpus: Sequence[AssignedGpu], driver_version: str, dirs: Sequence[Path] = SPEC_DIRS,
                  dev: str = "/dev") -> GpuInjection:
    """The attempt's GPUs through the host's CDI spec when it has one of the GPU kind, else the driver's files."""
    if not gpus:
        return inject(ContainerEdits(), gpus, "none")
    specs = load_specs(dirs)
    if specs:
        edits, source = resolve(specs, gpus)
        return inject(edits, gpus, source)
    return inject(driver_edits(gpus, driver_version, dev), gpus, "driver")


# -- staleness ------------------------------------------------------------------------------------------

def stale(edits: ContainerEdits, driver_version: str = "", stat: Stat = os.stat) -> list[str]:
    """What of `edits` the host no longer has: a missing (or non-device) node, a node whose numbers
    changed, a missing mount source or hook, a driver library of another version than NVML's."""
    problems = []
    for node in edits.device_nodes:
        try:
            st = stat(node.source)
        except OSError:
            problems.append(f"device node {node.source} does not exist")
            continue
        if not (stat_mod.S_ISCHR(st.st_mode) or stat_mod.S_ISBLK(st.st_mode)):
            problems.append(f"{node.source} is not a device node")
        elif (node.major, node.minor) != (None, None) and \
                (node.major, node.minor) != (os.major(st.st_rdev), os.minor(st.st_rdev)):
            problems.append(f"device node {node.source} is {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, "
                            f"the spec says {node.major}:{node.minor}")
    for m in edits.mounts:
        try:
            stat(m.source)
        except OSError:
            problems.append(f"mount source {m.source} does not exist")
            continue
        name = os.path.basename(m.source)
        version = VERSIONED.search(name)
        if driver_version and version and DRIVER_LIBRARY.match(name[:name.index(".so") + 3]) \
                and version.group(1) != driver_version:
            problems.append(f"{m.source} is driver {version.group(1)}, the host runs {driver_version}")
    for hook in edits.hooks:
        try:
            stat(hook.path)
        except OSError:
            problems.append(f"{hook.hook_name} hook {hook.path} does not exist")
    return problems


def all_edits(specs: Iterable[Spec]) -> ContainerEdits:
    """Every edit of every device of the specs: what a check before an attempt looks at."""
    out = ContainerEdits()
    for spec in specs:
        out = out + spec.edits
        for edits in spec.devices.values():
            out = out + edits
    return out


STALE_REASON = "StaleCdiSpec"
"""The GPUs' condition reason when the host's CDI spec no longer matches its devices or driver."""


def check_host(driver_version: str, dirs: Sequence[Path] = SPEC_DIRS, stat: Stat = os.stat) -> str:
    """"" when the host's CDI specs (if any) match it, else a message for the GPUs' unhealthy condition."""
    try:
        specs = load_specs(dirs)
    except CdiError as e:
        return f"{e}"
    problems = stale(all_edits(specs), driver_version, stat)
    if not problems:
        return ""
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    sources = ", ".join(s.source for s in specs)
    return f"the CDI spec ({sources}) is stale: {shown}; regenerate it (nvidia-ctk cdi generate) for this driver"


def check_gpus(nvml: Nvml, dirs: Sequence[Path] = SPEC_DIRS, stat: Stat = os.stat) -> str:
    """The check before an attempt (and at start): the host's GPUs read unhealthy with StaleCdiSpec while
    its spec is stale, healthy again once it matches, so every heartbeat tells placement. Returns the message."""
    if not nvml.handles:
        return ""
    message = check_host(nvml.driver_version, dirs, stat)
    nvml.mark_unhealthy(STALE_REASON if message else "", message)
    return message
