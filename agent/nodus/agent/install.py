"""`nodus-agent install` and `nodus-agent uninstall`: a host set up (and taken down) in one command.

    nodus-agent install --coordinator HOST:PORT --join-token-file F [--coordinator-ca F] [--node NAME]
                        [--offering ID] [--region R] [--labels k=v,…] [--pool P/N] [--runtime R]
                        [--work-dir DIR] [--root DIR] [--source WHEEL|DIR|REQ] [--pip-arg ARG …]
    nodus-agent install --upgrade [--source …] [--root DIR]
    nodus-agent uninstall [--stop-attempts] [--purge] [--root DIR]

Install checks its input, enrols the node with the join token (so a wrong address, CA or token fails here,
naming its flag, not later in a journal), builds the venv, writes /etc/nodus/agent.yaml, the join token
(0600), the coordinator's CA and the systemd unit, and starts it. An upgrade swaps the venv and restarts
the agent only: the unit's KillMode=process leaves every attempt running, and the new agent re-adopts
them. docs/adr/0056-host-install.md.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Callable

import grpc
import orjson

from nodus import hostinstall as hi

from .enrolment import NodeCredentials

WORK_DIR = Path("/var/lib/nodus/agent")
TOKEN = hi.ETC / "join-token"
CA = hi.ETC / "coordinator-ca.crt"
ENROL_TIMEOUT = 15.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-agent install", description="Install the Nodus agent on this host.")
    p.add_argument("--coordinator", metavar="HOST:PORT", help="the coordinator's gRPC address (its grpc_listen, "
                   "port 7070 by default)")
    p.add_argument("--join-token-file", metavar="FILE", help="a file holding the coordinator's join token (its "
                   "DATA_DIR/join-token); copied to /etc/nodus/join-token, mode 0600")
    p.add_argument("--coordinator-ca", metavar="FILE", help="the coordinator's DATA_DIR/tls/ca.crt (default: the "
                   "system's roots, for a certificate the operator brought)")
    p.add_argument("--node", help="the node's name (default: the host name); enrolment binds it to this host's key")
    p.add_argument("--offering", help="the offering id this host is sold as")
    p.add_argument("--region", help="the region class of this host")
    p.add_argument("--labels", help="k=v,k2=v2 labels placement can select on")
    p.add_argument("--pool", metavar="PROJECT/NAME", help="dedicate the host to a pool")
    p.add_argument("--runtime", choices=["process", "oci", "auto"], default="auto")
    p.add_argument("--work-dir", default=str(WORK_DIR), help=f"the agent's state (default {WORK_DIR})")
    hi.add_install_flags(p)
    p.add_argument("--upgrade", action="store_true", help="replace the installed venv with --source's and restart "
                   "the agent; attempts keep running and are re-adopted (configuration files are kept)")
    return p


def uninstall_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-agent uninstall", description="Remove the Nodus agent from this host.")
    p.add_argument("--root", default="/", help="the root the agent was installed under (default /)")
    p.add_argument("--stop-attempts", action="store_true", help="also stop the attempts still running here "
                   "(default: leave them running, as a restart does)")
    p.add_argument("--purge", action="store_true", help="also delete the work dir (attempt state, the node's key)")
    return p


def _read_token(path: str | None) -> str:
    if not path:
        raise hi.InstallError("--join-token-file", "is required", "give the file holding the coordinator's "
                              "DATA_DIR/join-token (mode 0600)")
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise hi.InstallError("--join-token-file", f"cannot read {path}: {e.strerror or e}",
                              "copy the coordinator's DATA_DIR/join-token to this host and name that file") from e
    if not token:
        raise hi.InstallError("--join-token-file", f"{path} is empty",
                              "write the coordinator's DATA_DIR/join-token into it")
    return token


def _read_ca(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        pem = Path(path).read_bytes()
    except OSError as e:
        raise hi.InstallError("--coordinator-ca", f"cannot read {path}: {e.strerror or e}",
                              "copy the coordinator's DATA_DIR/tls/ca.crt to this host and name that file") from e
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise hi.InstallError("--coordinator-ca", f"{path} holds no PEM certificate",
                              "name the coordinator's DATA_DIR/tls/ca.crt")
    return pem


def _check_address(address: str | None) -> str:
    if not address:
        raise hi.InstallError("--coordinator", "is required", "give the coordinator's gRPC HOST:PORT, such as "
                              "coordinator.internal:7070")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise hi.InstallError("--coordinator", f"{address!r} is not HOST:PORT",
                              "give the coordinator's gRPC address, such as coordinator.internal:7070")
    return address


def _check_placement(args: argparse.Namespace) -> None:
    """--labels and --pool as the agent will read them from agent.yaml (it would refuse them at its start)."""
    from .inventory import parse_labels

    try:
        parse_labels(args.labels)
    except ValueError as e:
        raise hi.InstallError("--labels", str(e), "write k=v,k2=v2, such as rack=r12,fabric=ib") from e
    if args.pool is not None:
        project, _, name = str(args.pool).partition("/")
        if not project or not name or "/" in name:
            raise hi.InstallError("--pool", f"{args.pool!r} is not PROJECT/NAME", "such as team-a/a100s")


def enrol(address: str, token: str, ca: bytes | None, node: str, identity: Path) -> int:
    """Enrols NODE with the join token, keeping its key and certificate in IDENTITY; the agent port."""
    from nodus.v1 import agent_pb2, agent_pb2_grpc

    creds = NodeCredentials(identity, ca)
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca))
    try:
        answer = agent_pb2_grpc.AgentServiceStub(channel).Enrol(
            agent_pb2.EnrolRequest(node_name=node, csr_pem=creds.csr(node)),
            metadata=(("authorization", f"Bearer {token}"),), timeout=ENROL_TIMEOUT)
    except grpc.RpcError as e:
        code, details = e.code(), e.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise hi.InstallError("--coordinator", f"cannot reach the coordinator at {address} ({details})",
                                  "check the address (the coordinator's grpc_listen) and that this host reaches it; "
                                  "a certificate error means --coordinator-ca is not its DATA_DIR/tls/ca.crt") from e
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise hi.InstallError("--join-token-file", f"the coordinator refused the join token ({details})",
                                  "put the coordinator's current DATA_DIR/join-token in the file "
                                  "(`nodus join-token rotate` issues a new one)") from e
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise hi.InstallError("--node", f"the coordinator refused to enrol {node!r} ({details})",
                                  f"choose another --node, or on the coordinator `nodus node readmit {node}`") from e
        raise hi.InstallError("--coordinator", f"enrolment failed: {code.name}: {details}",
                              "see the coordinator's log") from e
    finally:
        channel.close()
    creds.save(answer)
    return int(answer.agent_port)


def install(argv: list[str], say: Callable[[str], None] = print) -> None:
    args = parser().parse_args(argv)
    layout = hi.Layout("agent", Path(args.root))
    if args.upgrade:
        for key in ("coordinator", "join_token_file", "coordinator_ca", "node", "offering", "region", "labels", "pool"):
            if getattr(args, key) is not None:
                flag = "--" + key.replace("_", "-")
                raise hi.InstallError(flag, "--upgrade keeps the installed configuration and takes no settings",
                                      f"edit {layout.config} (the agent reads it at the restart), then run "
                                      f"--upgrade without {flag}")
    mode = hi.decide("agent", args.upgrade, layout.found(), layout.config)
    previous = hi.current_venv(layout)
    files: list[str] = []
    settings: dict[str, str] = {}
    if mode is hi.Mode.FRESH:
        address = _check_address(args.coordinator)
        token = _read_token(args.join_token_file)
        ca = _read_ca(args.coordinator_ca)
        if not Path(args.work_dir).is_absolute():
            raise hi.InstallError("--work-dir", f"{args.work_dir!r} is not an absolute path", "such as /var/lib/nodus/agent")
        _check_placement(args)
        node = args.node or socket.gethostname()
        work_dir = Path(args.work_dir)
        port = enrol(address, token, ca, node, layout.host(work_dir) / "identity")
        say(f"enrolled node {node} at {address} (agent port {port}); its key stays in {work_dir / 'identity'}")
    venv = hi.build_venv(layout, args.source or hi.default_source(), args.pip_arg, say=say)
    version = hi.venv_version(layout, venv)
    if mode is hi.Mode.FRESH:
        hi.write_file(layout.host(TOKEN), (token + "\n").encode(), 0o600)
        files.append(str(TOKEN))
        if ca is not None:
            hi.write_file(layout.host(CA), ca, 0o644)
            files.append(str(CA))
        hi.write_file(layout.host(layout.config), config(args, node, ca is not None).encode(), 0o644)
        files.append(str(layout.config))
        settings = {"work_dir": str(work_dir), "node": node}
    else:
        old = hi.Manifest.read(layout)
        assert old is not None
        files, settings = [f for f in old.files if f != str(layout.unit)], old.settings
    hi.write_file(layout.host(layout.unit), hi.render_unit(layout).encode(), 0o644)
    files.append(str(layout.unit))
    hi.switch_venv(layout, venv)
    say(f"{layout.venv} -> {venv} (nodus {version})")
    hi.finish(layout, mode, hi.Manifest("agent", version, str(venv), files, settings), previous, say)


def config(args: argparse.Namespace, node: str, has_ca: bool) -> str:
    """/etc/nodus/agent.yaml: the keys systemd/agent.yaml shows, with this install's values."""
    return hi.config_text(
        "# /etc/nodus/agent.yaml: nodus-agent settings, written by `nodus-agent install` (edit freely; an upgrade\n"
        "# keeps this file). Every key is also a flag (--work-dir) and an environment variable (NODUS_WORK_DIR).",
        [("coordinator", args.coordinator, ""),
         ("node", node, "Enrolled with this host's key (work_dir/identity); another host cannot take the name."),
         ("work_dir", args.work_dir, ""),
         ("join_token_file", str(TOKEN), "The coordinator's join token (0600): used to enrol again if the "
                                         "certificate runs out while the host is down."),
         ("coordinator_ca", str(CA) if has_ca else None, "The coordinator's CA: its gRPC port is verified with it."),
         ("runtime", args.runtime, ""),
         ("region", args.region, ""),
         ("offering", args.offering, ""),
         ("labels", args.labels, ""),
         ("pool", args.pool, ""),
         ("log_level", "INFO", "")])


# -- uninstall ----------------------------------------------------------------------------------------------
def running_attempts(work_dir: Path) -> dict[str, int]:
    """Attempt id -> supervisor pid of each attempt whose supervisor still runs (from its run/status.json)."""
    found: dict[str, int] = {}
    attempts = work_dir / "attempts"
    for status in attempts.glob("*/run/status.json") if attempts.is_dir() else []:
        try:
            pid = int(orjson.loads(status.read_bytes()).get("supervisor_pid") or 0)
        except (OSError, ValueError):
            continue
        if pid > 0 and _alive(pid):
            found[status.parent.parent.name] = pid
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) no longer runs
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def stop_attempts(supervisors: dict[str, int], grace: float, say: Callable[[str], None] = print) -> None:
    """SIGTERM to each supervisor (it stops its workload as a cancel does), SIGKILL to those left after GRACE."""
    for pid in supervisors.values():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in supervisors.values()):
        time.sleep(0.1)
    for attempt, pid in supervisors.items():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            say(f"killed attempt {attempt}'s supervisor {pid} after {grace:g} s")
    say(f"stopped {len(supervisors)} attempt(s)")


def uninstall(argv: list[str], say: Callable[[str], None] = print) -> None:
    args = uninstall_parser().parse_args(argv)
    layout = hi.Layout("agent", Path(args.root))
    manifest = hi.Manifest.read(layout)
    if manifest is None:
        raise hi.InstallError("uninstall", f"no nodus-agent installed here (no {layout.manifest} under {args.root})",
                              "give --root the directory it was installed under")
    work_dir = layout.host(Path(manifest.settings.get("work_dir", str(WORK_DIR))))
    supervisors = running_attempts(work_dir)
    if supervisors and args.purge and not args.stop_attempts:
        raise hi.InstallError("--purge", f"{len(supervisors)} attempt(s) still run in the work dir {work_dir}",
                              "add --stop-attempts to stop them first, or leave out --purge to keep the work dir")
    if supervisors and args.stop_attempts:
        stop_attempts(supervisors, 20.0, say)
        supervisors = {}
    elif supervisors:
        say(f"left {len(supervisors)} attempt(s) running ({', '.join(sorted(supervisors))}); --stop-attempts stops them")
    hi.remove_install(layout, manifest, keep_venvs=bool(supervisors), say=say)
    if args.purge:
        import shutil

        from .oci.slots import IdSlots
        IdSlots(work_dir / "ids").unbind_all()  # never delete through a pod's namespace bind mounts (ADR 0111)
        shutil.rmtree(work_dir, ignore_errors=True)
        say(f"removed the work dir {manifest.settings.get('work_dir')}")
    else:
        say(f"kept the work dir {manifest.settings.get('work_dir')} (--purge deletes it); the node stays enrolled: "
            f"`nodus node revoke {manifest.settings.get('node', 'NAME')}` on the coordinator cuts it off")


def main(command: str, argv: list[str]) -> None:
    try:
        (install if command == "install" else uninstall)(argv)
    except hi.InstallError as e:
        print(f"nodus-agent {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
