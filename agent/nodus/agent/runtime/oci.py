"""The OCI runtime: attempts with an image run as runc containers of a pod, under the same supervisor.

It is the process runtime plus images (ADR 0018): an image-less attempt runs exactly as there; for one
with an image the runtime pulls the pinned digests into the node's ImageStore (ADR 0019), then writes the
"oci" section of run/spec.json (supervisor/containers.py reads it) so the supervisor makes the pod
(ADR 0020). A pull that fails refuses the attempt: FAILED when the image or its credentials are wrong,
LOST (lost capacity, placed elsewhere) when it is the node's fault.
"""
from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from nodus.v1 import agent_pb2, common_pb2

from .. import layout as L
from ..clock import Clock
from ..layout import AttemptLayout
from ..nvml import Nvml, SimulatedNvml
from ..oci import cdi, disk, sdk
from ..oci.bundle import ImageConfig
from ..oci.egress import Policy, left_link, preset_table, remove_link
from ..oci.images import ImageStore, PulledImage, PullProgress
from ..oci.mounts import MountError
from ..oci.namespaces import remove_namespaces
from ..oci.pod import pod_safe_id, remove_cgroup_dirs, unmount_layer
from ..oci.pull_errors import ImagePullError
from ..oci.runc import Runc, RuncError
from ..oci.slots import IdSlots
from ..oci.skopeo import RegistryCredentials, Skopeo
from ..reasons import Reason
from ..settings import AgentConfig, choose_runtime
from ..statefile import read_json, write_json
from .process import PASSED_ENV, ProcessRuntime, Refused

log = logging.getLogger("nodus.agent.runtime")
_POLICIES = {agent_pb2.EGRESS_POLICY_DENY: Policy.DENY, agent_pb2.EGRESS_POLICY_ALLOW_LIST: Policy.ALLOW_LIST,
             agent_pb2.EGRESS_POLICY_OPEN: Policy.OPEN}
SPARE_PODS = 2
"""Pods' namespaces kept made ahead (ADR 0111): one for the next image attempt and one for the one after."""
GANG_EGRESS = ("spec.network.egress.policy: a gang member's pod shares the node's network (ADR 0033), where Deny and "
               "AllowList cannot be enforced; set network.egress.policy to Open for a distributed Job with an image")

def config_blob(config: ImageConfig) -> dict[str, Any]:
    """An OCI image config blob holding `config` (what containers.py reads back with ImageConfig.from_oci)."""
    return {"config": {"Entrypoint": list(config.entrypoint), "Cmd": list(config.cmd), "Env": list(config.env),
                       "WorkingDir": config.working_dir, "User": config.user}}


class OciRuntime(ProcessRuntime):
    """Runs image-less attempts as the process runtime does and attempts with an image in runc pods."""

    runtime = common_pb2.RUNTIME_OCI
    runtimes = (common_pb2.RUNTIME_PROCESS, common_pb2.RUNTIME_OCI)

    def __init__(self, work_dir: Path, *, image_cache: Path, disk_budget: int, clock: Clock,
                 insecure_registries: Collection[str] = (), egress_presets: Mapping[str, Sequence[str]] | None = None,
                 egress_network: Mapping[str, Any] | None = None, nvml: Nvml | None = None, cdi_dirs: Sequence[Path] = cdi.SPEC_DIRS, **process: Any) -> None:
        super().__init__(work_dir, **process)
        self.nvml = nvml
        self.cdi_dirs = tuple(cdi_dirs)
        if nvml is not None:
            cdi.check_gpus(nvml, self.cdi_dirs)  # before the agent registers: a stale spec is seen at once
        self.egress_presets = preset_table(egress_presets)
        """Built-in presets with the operator's over them: the supervisor expands a Job's presets from these."""
        self.egress_network = dict(egress_network or {})
        """NodeNetwork's settings (pod_range, if_prefix, uplinks), as the supervisor builds it from spec.json."""
        self.runc_root = work_dir / "runc"
        self.id_slots = work_dir / "ids"
        self.slots = IdSlots(self.id_slots)
        self._remove_spares(unfinished_only=True)  # what a killed agent was making is in no known state
        self._topping_up = threading.Lock()
        self.sdk = sdk.install(work_dir / "sdk")
        self.disk_limit = disk.available()
        """None when pods' writable layers can be limited to resources.disk (oci/disk.py), else why not."""
        if self.disk_limit is not None:
            log.error("image Jobs' writable layers will not be limited to their resources.disk on this host: %s",
                      self.disk_limit)
        """The SDK tree every container mounts at /nodus/sdk (oci/sdk.py)."""
        self.store = ImageStore(image_cache, disk_budget, clock, self.images_in_use,
                                Skopeo(insecure=frozenset(insecure_registries)))
        self._pull_lock = threading.Lock()
        self._progress: dict[str, dict[str, PullProgress]] = {}
        """Attempt id -> image reference -> bytes so far, while its pulls run (written by worker threads)."""
        self._pulled: dict[str, dict[str, PulledImage]] = {}
        """Attempt id -> its images, from the pull until write_spec puts them in spec.json."""

    # -- images --------------------------------------------------------------------------------------
    @staticmethod
    def references(a: agent_pb2.Assignment) -> list[str]:
        """The attempt's image and its sidecars' own, each once, in order."""
        refs = [a.image] if a.image else []
        for sc in a.sidecars:
            if sc.image and sc.image not in refs:
                refs.append(sc.image)
        return refs

    def images_in_use(self) -> set[str]:
        """Manifest digests of attempts that have not ended (run/images.json is written before the pull,
        so an attempt counts from then; the directory holds it across a restart)."""
        used: set[str] = set()
        for images in (self.work_dir / "attempts").glob("*/run/images.json"):
            status = read_json(images.parent / "status.json") or {}
            if status.get("phase") in L.TERMINAL:
                continue
            for ref in (read_json(images) or {}).get("references") or ():
                used.add(str(ref).rpartition("@")[2])
        return used

    def check(self, a: agent_pb2.Assignment) -> None:
        if not a.image:
            super().check(a)  # a sidecar image without the Job's is refused there too
        elif a.HasField("gang") and _POLICIES.get(a.egress.policy, Policy.DENY) is not Policy.OPEN:
            # admission refuses this already; an older coordinator's Assignment must not run unenforced either
            raise Refused(Reason.INVALID_ASSIGNMENT, GANG_EGRESS)
        elif a.gpu_indexes and self.nvml is not None:
            # the host's CDI spec may have gone stale since the last look (a driver update): refuse here,
            # with the GPUs marked unhealthy for placement, rather than fail inside runc
            message = cdi.check_gpus(self.nvml, self.cdi_dirs)
            if message:
                raise Refused(Reason.AGENT_FAULT, f"{cdi.STALE_REASON}: {message}", L.LOST)

    def gpu_injection(self, a: agent_pb2.Assignment) -> cdi.GpuInjection:
        """The assigned GPUs' devices, mounts, hooks and env (through the host's CDI spec, else the driver's
        files); raises Refused (LOST: the node's fault) when the spec cannot supply them."""
        if not a.gpu_indexes or self.nvml is None:
            return cdi.inject(cdi.ContainerEdits(), (), "none")
        uuids = {g.index: g.uuid for g in self.nvml.read()}
        gpus = [cdi.AssignedGpu(i, uuids.get(i, "")) for i in a.gpu_indexes]
        try:
            if isinstance(self.nvml, SimulatedNvml) and not cdi.load_specs(self.cdi_dirs):
                return cdi.inject(cdi.ContainerEdits(), gpus, "simulated")  # no driver files to bind
            return cdi.gpu_injection(gpus, self.nvml.driver_version, self.cdi_dirs)
        except cdi.CdiError as e:
            raise Refused(Reason.AGENT_FAULT, f"the GPUs could not be injected: {e}", L.LOST) from e

    def pull(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> None:
        """Pulls the attempt's images into the store (blocking: call it in a thread); raises Refused."""
        refs = self.references(a)
        if not refs:
            return
        # Not fsynced (an image attempt's start waited ~5 ms on it): it protects the images from the collector
        # while the attempt lives, and a crash of the host, the only thing that loses it, ends the attempt too.
        write_json(layout.run / "images.json", {"references": refs}, mode=0o600, durable=False)
        credentials = RegistryCredentials.from_logins((c.registry, c.username, c.password)
                                                      for c in a.image_pull_credentials)
        pulled: dict[str, PulledImage] = {}
        with self._pull_lock:
            self._progress[a.attempt_id] = {}
        try:
            for ref in refs:
                pulled[ref] = self.store.pull(ref, credentials, functools.partial(self._note, a.attempt_id, ref))
        except ImagePullError as e:
            with self._pull_lock:
                self._progress.pop(a.attempt_id, None)  # the attempt ends here: nothing more to report
            if e.lost_capacity:
                raise Refused(Reason.IMAGE_PULL_NODE_FAULT, f"{e.reason}: {e.message}", L.LOST) from e
            raise Refused(Reason.IMAGE_PULL_FAILED, f"{e.reason}: {e.message}") from e
        with self._pull_lock:
            self._pulled[a.attempt_id] = pulled

    def _note(self, attempt_id: str, ref: str, progress: PullProgress) -> None:
        with self._pull_lock:
            if attempt_id in self._progress:
                self._progress[attempt_id][ref] = progress

    def pull_progress(self, attempt_id: str) -> tuple[int, int] | None:
        """(bytes done, bytes total) over the attempt's images so far; None when nothing is pulled."""
        with self._pull_lock:
            seen = list((self._progress.get(attempt_id) or {}).values())
        if not seen:
            return None
        return sum(p.done for p in seen), sum(p.total for p in seen)

    # -- the spec ------------------------------------------------------------------------------------
    def write_spec(self, a: agent_pb2.Assignment, layout: AttemptLayout) -> None:
        super().write_spec(a, layout)
        with self._pull_lock:
            self._progress.pop(a.attempt_id, None)
            pulled = self._pulled.pop(a.attempt_id, None)
        if not a.image or pulled is None:
            return
        spec = read_json(layout.spec) or {}
        spec["oci"] = self.oci_section(a, pulled)
        spec["oci"]["gpus"] = self.gpu_injection(a).to_json()
        # the image's entrypoint and cmd apply as Kubernetes does: command replaces the entrypoint, args the cmd
        spec["command"] = list(a.command)
        spec["working_dir"] = str(layout.root)
        # the image's environment, not the node's: PATH, LD_LIBRARY_PATH, … pass only where the Job sets them
        spec["env"] = {k: v for k, v in spec["env"].items() if k not in PASSED_ENV or k in a.env}
        write_json(layout.spec, spec, mode=0o600, durable=False)

    def oci_section(self, a: agent_pb2.Assignment, pulled: dict[str, PulledImage]) -> dict[str, Any]:
        main = pulled[a.image]
        sidecars = {sc.name: {"rootfs": str(pulled[sc.image].rootfs),
                              "image_config": config_blob(pulled[sc.image].config)}
                    for sc in a.sidecars if sc.image and sc.image != a.image}
        return {"rootfs": str(main.rootfs), "image_config": config_blob(main.config), "digest": main.digest,
                "runc_root": str(self.runc_root), "id_slots": str(self.id_slots), "sdk": str(self.sdk),
                "disk_bytes": a.resources.disk_bytes if self.disk_limit is None else 0,
                "args": list(a.args) if a.args else None, "working_dir": a.working_dir, "user": "",
                "sidecars": sidecars, "egress": self.egress_section(a.egress),
                "egress_presets": {k: list(v) for k, v in self.egress_presets.items()},
                "egress_network": self.egress_network,
                # a gang member's containers meet the other members on the node's network (ADR 0033)
                "host_network": a.HasField("gang")}

    @staticmethod
    def egress_section(egress: agent_pb2.Egress) -> dict[str, Any]:
        """The Assignment's network.egress as the Job spells it (Egress.from_spec reads it); unset is Deny."""
        policy = _POLICIES.get(egress.policy, Policy.DENY)
        return {"policy": policy.value, "allow": list(egress.allow), "presets": list(egress.presets)}

    # -- after a supervisor -------------------------------------------------------------------------
    def kill_leftovers(self, layout: AttemptLayout) -> None:
        super().kill_leftovers(layout)
        self.close_pod(layout)

    def close_pod(self, layout: AttemptLayout) -> None:
        """What a dead supervisor's pod left: its containers, writable layers, namespaces, cgroups, the node's
        side of its link (veth, NAT table) and its id slot (Pod.close's steps, from disk alone: the pod object died with its supervisor)."""
        spec = read_json(layout.spec) or {}
        oci = spec.get("oci")
        pod_dir = layout.run / "pod"
        if not oci and not pod_dir.exists():
            return
        pod_id = pod_safe_id(layout.root.name)
        runc = Runc(Path(oci["runc_root"]) if oci else self.runc_root)
        try:
            for state in runc.list():
                if state.id.startswith(pod_id + "-"):
                    runc.delete(state.id, force=True)
        except RuncError as e:
            log.warning("attempt %s: its containers could not be listed or deleted: %s", layout.root.name, e)
        containers = pod_dir / "containers"
        if containers.is_dir():
            for directory in containers.iterdir():
                unmount_layer(directory)
        disk.remove(pod_dir)
        remove_namespaces(pod_dir / "ns")  # where an agent before ADR 0111 bound them
        remove_cgroup_dirs(f"{spec.get('cgroup_root', self.cgroup_root)}/{spec.get('cgroup_name') or layout.root.name}")
        slots = IdSlots(Path(oci["id_slots"]) if oci else self.id_slots)
        slot = slots.slot_of(pod_id)
        link = left_link(oci, slot) if oci and slot is not None else None
        if link is not None:
            remove_link(link)  # the node's NAT table outlives the pod's namespace
        slots.release(pod_id)  # the slot's namespaces with it

    def remove(self, layout: AttemptLayout) -> None:
        with self._pull_lock:  # one stopped between its pull and its spec
            for attempt_id in [k for k in self._pulled if self.layout(k).root == layout.root]:
                self._pulled.pop(attempt_id, None)
        if (layout.run / "pod").exists():
            self.close_pod(layout)  # never remove a tree through a layer still mounted
            self.top_up_spares()  # before the attempt is gone: the node is idle once its attempts are
        super().remove(layout)

    def top_up_spares(self) -> None:
        """Makes spare pods' namespaces until SPARE_PODS wait (ADR 0111): after an image attempt ends, off
        every attempt's way to running. A failure leaves the next pod to make its own, where it fails loudly."""
        if not self._topping_up.acquire(blocking=False):
            return  # another ended attempt's thread is at it
        try:
            for _ in range(SPARE_PODS - len(self.slots.spares())):
                self.slots.make_spare()
        except (MountError, OSError) as e:  # PodError is a MountError
            log.warning("a spare pod's namespaces could not be made (%s): the next image attempt makes its own", e)
        finally:
            self._topping_up.release()

    def _remove_spares(self, unfinished_only: bool = False) -> None:
        try:
            self.slots.remove_spares(unfinished_only)
        except (MountError, OSError) as e:  # left held ~making: removed at the next start
            log.warning("spare pods' namespaces could not be removed: %s", e)

    def close(self) -> None:
        super().close()
        with self._topping_up:  # a top-up still running on a removal's thread ends first
            self._remove_spares()  # the agent stops: no attempt of its will take them


def node_runtime(cfg: AgentConfig, notify_address: str | None, host_gpus: int, clock: Clock,
                 nvml: Nvml | None = None) -> ProcessRuntime:
    """The runtime `cfg.runtime` names (main.py resolved auto already; oci without its tools fails here too)."""
    process: dict[str, Any] = {"notify_address": notify_address, "cgroup_root": cfg.cgroup_root, "cgroups": cfg.cgroups,
                               "stop_grace": cfg.stop_grace, "host_gpus": host_gpus,
                               "workload_user": cfg.workload_user, "attempt_uids": cfg.attempt_uids,
                               "zygote": cfg.zygote}
    if choose_runtime(cfg.runtime) != "oci":
        return ProcessRuntime(cfg.work_dir, **process)
    return OciRuntime(cfg.work_dir, image_cache=cfg.image_cache or cfg.work_dir / "images",
                      disk_budget=cfg.image_disk_budget, clock=clock, insecure_registries=cfg.insecure_registries,
                      egress_presets=cfg.egress_presets,
                      egress_network={"pod_range": cfg.egress_range, "if_prefix": cfg.egress_interface_prefix,
                                      "uplinks": list(cfg.egress_uplinks) if cfg.egress_uplinks is not None else None},
                      nvml=nvml, cdi_dirs=cfg.cdi_dirs,
                      **process)
