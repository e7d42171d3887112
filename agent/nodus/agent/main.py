"""`nodus-agent`: the node daemon's entry point (one per host, under systemd).

    nodus-agent --coordinator HOST:PORT --node NAME --work-dir DIR --join-token-file FILE
                [--coordinator-ca DATA_DIR/tls/ca.crt | --coordinator-insecure]
                [--runtime process|oci|auto] [--image-cache DIR] [--image-disk-budget SIZE]
                [--insecure-registry HOST:PORT …] [--cdi-dir DIR …]
                [--region CLASS] [--offering ID] [--pool PROJECT/NAME]
                [--labels k=v,…]
                [--config FILE]
    nodus-agent install --coordinator HOST:PORT --join-token-file FILE [...]   (install.py)
    nodus-agent uninstall [--stop-attempts] [--purge]

Every flag is also a config-file key and a NODUS_* environment variable (nodus.config). SIGTERM
stops the agent and leaves every workload running; a restarted agent re-adopts them.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from nodus import config as daemon_config

from .oci.egress import EgressError, PodLink, preset_table
from .gpu_health import DEFAULT_MAX_TEMPERATURE_C
from .settings import DEFAULT_ATTEMPT_UIDS

if TYPE_CHECKING:  # the daemon (grpc, psutil) is imported only once the flags are good
    from .settings import AgentConfig

DEFAULTS = {
    "coordinator": "127.0.0.1:7070",
    "work_dir": "/var/lib/nodus/agent",
    "join_token_file": "/etc/nodus/join-token",
    "runtime": "auto",
    "image_cache": "",
    "image_disk_budget": "20Gi",
    "insecure_registry": [],
    "egress_presets": {},
    "egress_range": "10.213.0.0/16",
    "egress_interface_prefix": "nodus",
    "egress_uplink": [],
    "cdi_dir": [],
    "region": "",
    "offering": "",
    "labels": "",
    "pool": "",
    "advertise_address": "",
    "interruptible": False,
    "cgroup_root": "nodus",
    "cgroups": True,
    "stop_grace": 10.0,
    "poll_interval": 0.5,
    "input_ca_file": "",
    "coordinator_ca": "",
    "coordinator_insecure": False,
    "reconnect_base": 0.2,
    "reconnect_max": 10.0,
    "workload_user": "",
    "attempt_uids": DEFAULT_ATTEMPT_UIDS,
    "zygote": True,
    "warm_probe": True,
    "simulate_gpus": "",
    "simulate_gpu_faults": "",
    "gpu_max_temperature": DEFAULT_MAX_TEMPERATURE_C,
    "clock_offset_file": "",
    "log_level": "INFO",
}


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-agent", description="The Nodus node agent.")
    p.add_argument("--config", help="YAML file of settings (keys as the long flags, without --)")
    p.add_argument("--coordinator", help=f"coordinator gRPC HOST:PORT (default {DEFAULTS['coordinator']})")
    p.add_argument("--node", help="node name, unique in the cluster (default: the host name)")
    p.add_argument("--work-dir", help=f"state and attempt directories (default {DEFAULTS['work_dir']})")
    p.add_argument("--join-token-file", help=f"file holding the node join token (default {DEFAULTS['join_token_file']})")
    p.add_argument("--runtime", choices=["process", "oci", "auto"],
                   help="how attempts run: process (no images), oci (runc pods for Jobs with an image, the process "
                        "runtime for the others; needs runc, skopeo and umoci), auto (oci when those are on the PATH; "
                        "the default)")
    p.add_argument("--image-cache", help="the oci runtime's image store (default: images/ in the work dir)")
    p.add_argument("--image-disk-budget", help="bytes the image store may hold, such as 20Gi (default 20Gi)")
    p.add_argument("--insecure-registry", action="append", metavar="HOST:PORT",
                   help="a registry pulled from over plain HTTP or unverified TLS (repeatable)")
    p.add_argument("--cdi-dir", action="append", metavar="DIR",
                   help="a directory of CDI specs for GPU injection (repeatable, lowest priority first; default "
                        "/etc/cdi and /var/run/cdi)")
    p.add_argument("--egress-presets", metavar="YAML",
                   help="network.egress presets over the built-in ones, a mapping such as "
                        "'{pypi-mirror: [pypi.internal, \"*.pypi.internal\"]}' (best in the config file)")
    p.add_argument("--egress-range", metavar="CIDR",
                   help="IPv4 range pods' links take a /30 of each, such as 10.213.0.0/16 (the default)")
    p.add_argument("--egress-interface-prefix", help="host-side pod veth names start with this (default nodus)")
    p.add_argument("--egress-uplink", action="append", metavar="IFACE",
                   help="an interface pods' traffic leaves by, whose forwarding is turned on (repeatable; "
                        "default: net.ipv4.ip_forward for all)")
    p.add_argument("--region", help="region class of this host (us, eu, …)")
    p.add_argument("--offering", help="offering id this host is sold as")
    p.add_argument("--labels", help="k=v,k2=v2 labels placement can select on")
    p.add_argument("--pool", metavar="PROJECT/NAME", help="dedicate this host to pool NAME of PROJECT: only that "
                   "project places here (the label nodus.dev/pool)")
    p.add_argument("--advertise-address", help="address other hosts reach this one at (default: the primary IP)")
    p.add_argument("--interruptible", type=_bool, help="the capacity can be reclaimed (spot): true or false")
    p.add_argument("--cgroup-root", help="cgroup directory attempts go under (default nodus)")
    p.add_argument("--cgroups", type=_bool, help="put attempts in cgroups (default true)")
    p.add_argument("--stop-grace", type=float, help="seconds between SIGTERM and SIGKILL when nobody says (default 10)")
    p.add_argument("--poll-interval", type=float, help="seconds between status polls (default 0.5)")
    p.add_argument("--input-ca-file", help="extra CA bundle for https:// inputs")
    p.add_argument("--coordinator-ca", help="CA bundle the coordinator's gRPC certificate is verified with: its "
                   "DATA_DIR/tls/ca.crt (default: the system's roots, for a certificate the operator brought)")
    p.add_argument("--coordinator-insecure", type=_bool, nargs="?", const=True,
                   help="speak plaintext gRPC, to a coordinator run with --grpc-insecure on loopback (default false)")
    p.add_argument("--clock-offset-file", help="for drills and tests: a file holding seconds added to every time the "
                   "agent and its supervisors report (as nodus-coordinator's --clock-offset-file; re-read every 50 ms)")
    p.add_argument("--reconnect-base", type=float, help="first reconnect delay in seconds (default 0.2)")
    p.add_argument("--reconnect-max", type=float, help="longest reconnect delay in seconds (default 10)")
    p.add_argument("--workload-user", help="run every attempt as this one user; --attempt-uids is then not used "
                   "(default: each attempt its own uid when the agent is root, else the agent's own user)")
    p.add_argument("--attempt-uids", metavar="START:COUNT|off",
                   help=f"uids (and gids) the agent owns, one per attempt, so attempts cannot read, signal or ptrace "
                        f"each other; no passwd or group entry may lie inside (default {DEFAULT_ATTEMPT_UIDS}; off: "
                        f"attempts run as the agent's own user; needs root, ignored with --workload-user)")
    p.add_argument("--zygote", type=_bool, help="fork supervisors from a warm process (default true; false "
                   "starts a Python interpreter per attempt)")
    p.add_argument("--warm-probe", type=_bool, help="after this host's first gang with the mesh probe, keep one probe "
                   "process ready with torch imported, about 220 MB (default true; false starts it per member)")
    p.add_argument("--simulate-gpus", metavar="MODEL:COUNT[:MEMORY]",
                   help="for development and tests: report COUNT GPUs of MODEL (MEMORY each, such as 80Gi) instead "
                        "of what NVML sees, each marked simulated in the inventory")
    p.add_argument("--simulate-gpu-faults", metavar="FILE",
                   help="with --simulate-gpus: a JSON file of readings the simulated GPUs report (Xid events, ECC, "
                        "row remapping, temperature), read at every reading, to rehearse a failing GPU")
    p.add_argument("--gpu-max-temperature", type=int, metavar="CELSIUS",
                   help=f"a GPU at or above this temperature takes no new work until it cools (default "
                        f"{DEFAULT_MAX_TEMPERATURE_C})")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.set_defaults(_defaults=DEFAULTS)
    return p


def build_config(args: argparse.Namespace) -> "AgentConfig":
    from .settings import CDI_DIRS, AgentConfig, SimulatedGpus, choose_runtime, parse_size
    from .inventory import parse_labels

    token_file = Path(args.join_token_file)
    try:
        token = token_file.read_text().strip()
    except OSError as e:
        raise SystemExit(f"nodus-agent: --join-token-file {token_file}: {e.strerror or e}") from e
    if not token:
        raise SystemExit(f"nodus-agent: --join-token-file {token_file} is empty")
    try:
        labels = parse_labels(args.labels)
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --labels: {e}") from e
    if args.pool:
        project, _, name = str(args.pool).partition("/")
        if not project or not name or "/" in name:
            raise SystemExit(f"nodus-agent: --pool: {args.pool!r} is not PROJECT/NAME, such as team-a/a100s")
        labels["nodus.dev/pool"] = f"{project}/{name}"
    try:
        simulated = SimulatedGpus.parse(args.simulate_gpus) if args.simulate_gpus else None
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --simulate-gpus: {e}") from e
    faults = Path(args.simulate_gpu_faults).resolve() if args.simulate_gpu_faults else None
    if faults is not None and simulated is None:
        raise SystemExit("nodus-agent: --simulate-gpu-faults needs --simulate-gpus: only simulated GPUs take "
                         "simulated readings")
    if faults is not None and faults.exists():
        from .nvml import load_faults
        try:
            load_faults(faults, simulated.count if simulated else 0)
        except (OSError, ValueError) as e:
            raise SystemExit(f"nodus-agent: --simulate-gpu-faults {faults}: {e}") from e
    max_temperature = int(args.gpu_max_temperature)
    if not 30 <= max_temperature <= 130:
        raise SystemExit(f"nodus-agent: --gpu-max-temperature {max_temperature}: must be from 30 to 130 (°C), "
                         f"such as {DEFAULT_MAX_TEMPERATURE_C}")
    insecure = _bool(args.coordinator_insecure)
    if insecure and args.coordinator_ca:
        raise SystemExit("nodus-agent: --coordinator-insecure and --coordinator-ca contradict each other: plaintext "
                         "has no certificate to verify; keep --coordinator-ca unless the coordinator runs with "
                         "--grpc-insecure")
    try:
        ca = Path(args.coordinator_ca).read_bytes() if args.coordinator_ca else None
    except OSError as e:
        raise SystemExit(f"nodus-agent: --coordinator-ca {args.coordinator_ca}: {e.strerror or e} (copy the "
                         "coordinator's DATA_DIR/tls/ca.crt to this host)") from e
    try:
        runtime = choose_runtime(str(args.runtime))
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --runtime {args.runtime}: {e}") from e
    try:
        budget = parse_size(str(args.image_disk_budget))
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --image-disk-budget: {e}") from e
    registries = args.insecure_registry or ()
    if isinstance(registries, str):  # NODUS_INSECURE_REGISTRY: a comma-separated list
        registries = [h.strip() for h in registries.split(",") if h.strip()]
    cdi_dirs = args.cdi_dir or ()
    if isinstance(cdi_dirs, str):  # NODUS_CDI_DIR: a comma-separated list
        cdi_dirs = [d.strip() for d in cdi_dirs.split(",") if d.strip()]
    if bad := [d for d in cdi_dirs if not Path(d).is_absolute()]:
        raise SystemExit(f"nodus-agent: --cdi-dir {bad[0]!r} must be an absolute path, such as /etc/cdi")
    presets = egress_presets(args.egress_presets)
    try:
        PodLink.for_slot(0, str(args.egress_range), str(args.egress_interface_prefix))
    except EgressError as e:
        raise SystemExit(f"nodus-agent: --{e}") from e
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --egress-range: {e}; give an IPv4 network such as 10.213.0.0/16") from e
    uplinks = args.egress_uplink or ()
    if isinstance(uplinks, str):  # NODUS_EGRESS_UPLINK: a comma-separated list
        uplinks = [i.strip() for i in uplinks.split(",") if i.strip()]
    return AgentConfig(
        coordinator=args.coordinator, node=args.node or socket.gethostname(), work_dir=Path(args.work_dir).resolve(),
        token=token, runtime=runtime, region=args.region or "", offering=args.offering or "", labels=labels,
        advertise_address=args.advertise_address or "", interruptible=_bool(args.interruptible),
        cgroup_root=args.cgroup_root, cgroups=_bool(args.cgroups), stop_grace=float(args.stop_grace),
        poll_interval=float(args.poll_interval), input_ca_file=args.input_ca_file or None, coordinator_ca=ca,
        coordinator_ca_file=Path(args.coordinator_ca) if args.coordinator_ca else None, join_token_file=token_file,
        coordinator_insecure=insecure,
        reconnect_base=float(args.reconnect_base), reconnect_max=float(args.reconnect_max),
        clock_offset_file=str(args.clock_offset_file or ""),
        workload_user=str(args.workload_user or ""), attempt_uids=attempt_uids(args.attempt_uids),
        zygote=_bool(args.zygote), warm_probe=_bool(args.warm_probe), simulate_gpus=simulated, simulate_gpu_faults=faults,
        gpu_max_temperature=max_temperature,
        image_cache=Path(args.image_cache).resolve() if args.image_cache else None, image_disk_budget=budget,
        egress_presets=presets, egress_range=str(args.egress_range),
        egress_interface_prefix=str(args.egress_interface_prefix),
        egress_uplinks=tuple(str(i) for i in uplinks) if uplinks else None,
        insecure_registries=tuple(str(h) for h in registries),
        cdi_dirs=tuple(Path(d) for d in cdi_dirs) or CDI_DIRS)


def attempt_uids(value: object) -> str:
    """--attempt-uids as the runtime takes it: "off" or START:COUNT (checked for form here, for clashes in main)."""
    from .uids import OFF, UidRange

    text = str(value).strip()
    if text.lower() == OFF:
        return OFF
    try:
        return str(UidRange.parse(text))
    except ValueError as e:
        raise SystemExit(f"nodus-agent: --attempt-uids: {e}") from e


def egress_presets(value: object) -> dict[str, tuple[str, ...]]:
    """The operator's preset table: a mapping from the config file, or YAML text from the flag or NODUS_EGRESS_PRESETS."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value) if value.strip() else {}
        except yaml.YAMLError as e:
            raise SystemExit(f"nodus-agent: --egress-presets: not YAML: {e}") from e
    if not isinstance(value, dict):
        raise SystemExit("nodus-agent: --egress-presets: expected a mapping of preset name to a list of names, "
                         "such as {pypi-mirror: [pypi.internal]}")
    try:
        table = preset_table(value)
    except EgressError as e:
        raise SystemExit(f"nodus-agent: {e}; for example {{{next(iter(value))}: [pypi.internal]}}") from e
    return {k: table[k] for k in map(str, value)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("install", "uninstall"):  # nodus-agent install|uninstall … (install.py)
        from .install import main as install_main
        install_main(argv[0], argv[1:])
        return
    args = daemon_config.resolve(parser(), argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    cfg = build_config(args)
    if cfg.workload_user:
        from .runtime.process import WorkloadUser
        try:
            WorkloadUser.lookup(cfg.workload_user)
        except ValueError as e:
            raise SystemExit(f"nodus-agent: --workload-user: {e}") from e
    elif cfg.attempt_uids != "off" and os.geteuid() == 0:
        from .uids import UidRange, blocked_ancestor
        try:
            UidRange.parse(cfg.attempt_uids).check()
        except ValueError as e:
            raise SystemExit(f"nodus-agent: --attempt-uids: {e}") from e
        if (blocked := blocked_ancestor(cfg.work_dir)) is not None:
            raise SystemExit(f"nodus-agent: --attempt-uids: the attempts' uids cannot reach the work dir "
                             f"{cfg.work_dir}: {blocked} lets only its owner through (mode "
                             f"{blocked.stat().st_mode & 0o7777:o}); chmod o+x {blocked}, choose a --work-dir "
                             f"under /var/lib, or run --attempt-uids off")
    asyncio.run(_run(cfg))


async def _run(cfg: "AgentConfig") -> None:
    from .clock import agent_clock
    from .daemon import Agent
    from .gpu_health import HealthRules
    from .nvml import Nvml, SimulatedNvml

    rules = HealthRules(max_temperature_c=cfg.gpu_max_temperature)
    nvml = (SimulatedNvml(cfg.simulate_gpus, rules, cfg.simulate_gpu_faults) if cfg.simulate_gpus
            else Nvml(rules=rules))
    clock = agent_clock(cfg.work_dir, cfg.clock_offset_file)
    await Agent(cfg, nvml=nvml, clock=clock).run()  # built inside the loop: the gRPC channel binds to the running loop


if __name__ == "__main__":
    main()
