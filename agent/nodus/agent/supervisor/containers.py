"""The OCI runtime's steps: each step of the attempt (init, a sidecar, a setup, main or teardown step)
is a runc container of the attempt's pod, made by `launch` instead of a fork and exec.

What the agent writes in spec.json for an attempt with an image (`"oci"`):

    {"rootfs": DIR, "image_config": {...}, "runc_root": DIR, "id_slots": DIR, "sdk": DIR, "disk_bytes": N,
     "args": [...] | null, "working_dir": "", "user": "",
     "sidecars": {NAME: {"rootfs": DIR, "image_config": {...}}},
     "egress": {"policy": "Deny" | "Open" | "AllowList", "allow": [...], "presets": [...]},
     "egress_presets": {NAME: [...]},
     "egress_network": {"pod_range": CIDR, "if_prefix": STR, "uplinks": [...] | null},
     "gpus": {"devices": [...], "mounts": [...], "env": {...}, "hooks": [...], "source": SPEC}}

`rootfs` is the image's unpacked read-only tree, `image_config` its OCI config blob, `args` the Job's
`args` (the main step's argv is the Job's `command`, empty to keep the image's entrypoint). The
attempt's directories are bound at the literal /nodus paths (its tmp at /tmp), and host paths in a
step's env are rewritten to where they are mounted (docs/adr/0020-oci-pods.md). `egress` is the Job's
`network.egress`, `egress_presets` the agent's preset table; an AllowList pod's /etc/resolv.conf names its
DNS gate, and the pod's denied count is written to run/egress.json (docs/adr/0023-pod-egress.md). `gpus` is
the assigned GPUs as oci/cdi.py resolved them (GpuInjection.to_json), given to every container (ADR 0024).
`sdk` is the agent's copy of the Nodus SDK, mounted read-only at /nodus/sdk and appended to PYTHONPATH
(oci/sdk.py); `disk_bytes` the Job's resources.disk, the size the pod's writable layers are limited to
(oci/disk.py; 0: no limit).
"""
from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from ..cgroups import Cgroup
from ..checkpointing import handshake_dir
from ..layout import AttemptLayout
from ..oci import sdk
from ..oci.bundle import ContainerRequest, ImageConfig, Mount, attempt_mounts, resolve_user
from ..oci.cdi import GpuInjection, with_gpus
from ..oci.egress import Egress, EgressError, NodeNetwork, Policy
from ..oci.pod import ContainerProcess, Pod
from ..oci.slots import IdSlots
from ..oci.runc import Runc, RuncError, become_subreaper
from ..statefile import write_json

log = logging.getLogger("nodus.agent.supervisor")
from .processes import StepProcess


class Containers:
    """The pod of one attempt, made when the first step starts and deleted by `close`."""

    def __init__(self, layout: AttemptLayout, oci: dict[str, Any], cgroup_parent: str) -> None:
        self.layout = layout
        self.oci = oci
        self.cgroup_parent = cgroup_parent
        self.pod: Pod | None = None
        self.count = 0
        self.mounts: tuple[Mount, ...] = ()
        self.gpus = GpuInjection.from_json(oci.get("gpus") or {})
        """The assigned GPUs (the agent resolved them through CDI): every container of the attempt gets them."""
        self.egress_watch: EgressWatch | None = None

    def _open(self) -> Pod:
        if self.pod is not None:
            return self.pod
        become_subreaper()  # a detached container's init is then this supervisor's child, waited for as one
        network = NodeNetwork.from_section(self.oci.get("egress_network"), self.oci.get("egress_presets"))
        try:
            egress = Egress.from_spec(self.oci.get("egress"), network.presets)
        except EgressError as e:
            raise OSError(str(e)) from e
        pod = Pod(self.layout.root.name, self.layout.run / "pod", Runc(Path(self.oci["runc_root"])),
                  IdSlots(Path(self.oci["id_slots"])), self.cgroup_parent, egress, network,
                  disk_bytes=int(self.oci.get("disk_bytes") or 0), host_network=bool(self.oci.get("host_network")))
        self.pod = pod
        lay = self.layout
        extra: tuple[Mount, ...] = ()
        if pod.egress.link is not None:
            if egress.policy == Policy.ALLOW_LIST:
                resolv = lay.run / "resolv.conf"
                resolv.write_text(pod.egress.link.resolv_conf())
                resolv.chmod(0o644)
                extra = (Mount("/etc/resolv.conf", str(resolv), read_only=True),)
            self.egress_watch = EgressWatch(pod, lay.run / "egress.json")
        # runc resolves the rootfs and the bind sources as the pod's root: it must pass through run/
        # (0700 for the process runtime's workload user); 0711 lets it through without listing it.
        lay.run.chmod(0o711)
        handshake = handshake_dir(lay)
        for d in (lay.state, lay.inputs, lay.outputs, lay.ready, handshake):
            d.mkdir(parents=True, exist_ok=True)
        lay.progress.touch()
        rootfs = Path(self.oci["rootfs"])
        uid, gid = resolve_user(self.oci.get("user") or ImageConfig.from_oci(self.oci.get("image_config") or {}).user,
                                _read(rootfs / "etc/passwd"), _read(rootfs / "etc/group"), "user")
        lay.tmp.mkdir(parents=True, exist_ok=True)
        for path in (lay.state, lay.outputs, lay.ready, handshake, lay.progress, lay.tmp):
            pod.own(path, uid, gid)  # written by the workload's user inside the pod
        secrets = {}
        if lay.secrets.is_dir():
            secrets["/nodus/secrets"] = str(lay.secrets)
            for path in (lay.secrets, *lay.secrets.rglob("*")):
                pod.own(path, uid, gid)  # 0400 files, readable by the workload's user only
        if self.oci.get("host_network"):  # a gang member: its launcher's files at the path its argv names (ADR 0033)
            launcher = lay.root / "launcher"
            launcher.mkdir(exist_ok=True)
            extra = (*extra, Mount(str(launcher), str(launcher), read_only=True))
        self.mounts = (*attempt_mounts(str(lay.state), str(lay.inputs), str(lay.outputs), str(lay.progress), secrets),
                       Mount("/nodus/ready", str(lay.ready)), Mount("/nodus/checkpoint", str(handshake)),
                       Mount("/tmp", str(lay.tmp)), *extra,
                       *((Mount(sdk.MOUNT, self.oci["sdk"], read_only=True),) if self.oci.get("sdk") else ()))
        return pod

    def launch(self, name: str, argv: list[str], env: dict[str, str], stdout: int) -> StepProcess:
        pod = self._open()
        self.count += 1
        image = self.oci
        if name.startswith("sidecar "):
            image = (self.oci.get("sidecars") or {}).get(name.removeprefix("sidecar "), self.oci)
        config = ImageConfig.from_oci(image.get("image_config") or {})
        env = self._inside(env)
        if self.oci.get("sdk"):
            env["PYTHONPATH"] = sdk.python_path(config.env, env)
        if name == "main":
            request = ContainerRequest(name, command=tuple(argv) or None,
                                       args=None if self.oci.get("args") is None else tuple(self.oci["args"]),
                                       env=env, working_dir=self.oci.get("working_dir") or "",
                                       user=self.oci.get("user") or "")
        else:
            request = ContainerRequest(name, command=tuple(argv), env=env, user=self.oci.get("user") or "")
        step = f"{self.count}-{name.replace(' ', '-')}"  # steps repeat names (setup, teardown): each its own container
        root, _, attempt = self.cgroup_parent.rpartition("/")
        try:
            # runc init sets the container up inside the attempt's cgroup: at the default CPU weight, not the
            # Job's floor, which on a busy node made that setup wait (ADR 0076)
            with Cgroup.locate(root, attempt).default_weight():
                return pod.start(step, with_gpus(request, self.gpus), config, Path(image["rootfs"]), stdout,
                                 (*self.mounts, *self.gpus.mounts), devices=self.gpus.devices, hooks=self.gpus.hooks)
        except (RuncError, ValueError) as e:
            raise OSError(f"{name}: {e}") from e

    def _inside(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with host paths of the attempt rewritten to where the pod sees them; one the pod cannot
        see is left out (HOME: runc then sets the image user's home from its /etc/passwd)."""
        binds = sorted(((m.source, m.destination) for m in self.mounts), key=lambda b: len(b[0]), reverse=True)
        root = str(self.layout.root)
        out = {}
        for key, value in env.items():
            for source, destination in binds:
                if value == source or value.startswith(source + "/"):
                    out[key] = destination + value[len(source):]
                    break
            else:
                if not (value == root or value.startswith(root + "/")):
                    out[key] = value
        return out

    def signal(self, proc: StepProcess, sig: int) -> None:
        if self.pod is None or not isinstance(proc, ContainerProcess) or proc.poll() is not None:
            return
        try:
            self.pod.runc.kill(proc.container_id, sig, all_processes=sig == signal.SIGKILL)
        except RuncError:
            pass  # it stopped meanwhile

    def oom_kills(self, proc: StepProcess | None) -> int:
        """The step's own cgroup counts its OOM kills (cgroup v1 counts them where the victim is), read
        before the container is deleted."""
        if self.pod is None or not isinstance(proc, ContainerProcess):
            return 0
        try:
            return self.pod.runc.oom_kills(proc.container_id)
        except (RuncError, OSError, KeyError, ValueError):
            return 0

    def close(self) -> None:
        if self.egress_watch is not None:
            self.egress_watch.close()  # the last count is read while the pod's namespace still exists
        if self.pod is not None:
            self.pod.close()


class EgressWatch:
    """Serves an AllowList pod's DNS gate, refreshes its pinned answers and writes its denied count, in a thread
    of the supervisor (the step loop waits on its children; the gate must answer while they run)."""

    PERIOD = 1.0
    """Seconds between looks at the count (and the longest a DNS question waits to be read)."""

    def __init__(self, pod: Pod, count_file: Path) -> None:
        self.pod = pod
        self.count_file = count_file
        self.gate = None
        if pod.egress.egress.policy == Policy.ALLOW_LIST:
            from ..oci.dns_gate import DnsGate  # noqa: PLC0415 - dnspython only for pods that need the gate
            self.gate = DnsGate(pod.egress)
        self.stopped = threading.Event()
        self.written = -1
        self.thread = threading.Thread(target=self._run, name="egress", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                if self.gate is not None:
                    self.gate.serve(self.PERIOD)
                else:
                    self.stopped.wait(self.PERIOD)
                self.pod.egress.refresh()
                self.write()
            except Exception as e:  # a failed nft or resolver call must not end the watch: the next period retries
                log.warning("egress: %s", e)
                self.stopped.wait(self.PERIOD)

    def write(self) -> None:
        denied = self.pod.egress.denied()
        if denied != self.written:
            write_json(self.count_file, {"denied": denied}, durable=False)
            self.written = denied

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.PERIOD * 5)
        try:
            self.write()
        except Exception:
            pass  # the count stays what was last written
        if self.gate is not None:
            self.gate.close()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def containers_for(layout: AttemptLayout, spec: dict[str, Any]) -> Containers | None:
    """The runc runtime when spec.json names an image (its "oci" section), else None (fork and exec)."""
    oci = spec.get("oci")
    if not oci:
        return None
    name = spec.get("cgroup_name") or layout.root.name
    return Containers(layout, dict(oci), f"{spec.get('cgroup_root', 'nodus')}/{name}")

