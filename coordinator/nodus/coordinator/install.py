"""`nodus-coordinator install` and `nodus-coordinator uninstall`: the control plane on a host in one command.

    nodus-coordinator install [--data-dir DIR] [--grpc-listen H:P] [--agent-listen H:P] [--http-listen H:P]
                              [--store-url URL] [--user nodus] [--root DIR] [--source …] [--pip-arg ARG …]
    nodus-coordinator install --upgrade [--source …] [--root DIR]
    nodus-coordinator uninstall [--purge] [--root DIR]

Builds the venv, writes /etc/nodus/coordinator.yaml and the systemd unit, makes the data dir (0700, the
unit's user), and starts it; its first start makes the CA, the join token and the admin kubeconfig there,
which `nodus-agent install` on each host then takes. An upgrade swaps the venv and restarts the unit
(agents reconnect and keep running their attempts). docs/adr/0056-host-install.md.
"""
from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from nodus import hostinstall as hi

DATA_DIR = Path("/var/lib/nodus/coordinator")
START_WAIT = 90.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-coordinator install", description="Install the Nodus coordinator.")
    p.add_argument("--data-dir", default=str(DATA_DIR), help=f"the store, CA, join token (default {DATA_DIR})")
    p.add_argument("--grpc-listen", default="0.0.0.0:7070", help="gRPC (TLS) for operators and enrolling agents")
    p.add_argument("--agent-listen", default="0.0.0.0:7071", help="mTLS for enrolled agents")
    p.add_argument("--http-listen", default="0.0.0.0:8080", help="REST (HTTPS)")
    p.add_argument("--store-url", help="postgresql://… (default: SQLite in the data dir)")
    p.add_argument("--user", default="nodus", help="the user the unit runs as (made as a system user if missing)")
    hi.add_install_flags(p)
    p.add_argument("--upgrade", action="store_true", help="replace the installed venv with --source's and restart "
                   "the coordinator (configuration and data are kept)")
    return p


def uninstall_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodus-coordinator uninstall", description="Remove the Nodus coordinator.")
    p.add_argument("--root", default="/", help="the root it was installed under (default /)")
    p.add_argument("--purge", action="store_true", help="also delete the data dir (store, CA, join token)")
    return p


def _listen(flag: str, value: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise hi.InstallError(flag, f"{value!r} is not HOST:PORT", "such as 0.0.0.0:7070")
    return value


def _user(name: str, live: bool, say: Callable[[str], None]) -> tuple[int, int] | None:
    """The unit's user (uid, gid), made as a system user where the install is live; None under --root."""
    if not live:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        result = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise hi.InstallError("--user", f"cannot make the system user {name}: {result.stderr.strip()}",
                                  "make it by hand (useradd --system) or name an existing user") from None
        say(f"made the system user {name}")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def install(argv: list[str], say: Callable[[str], None] = print) -> None:
    args = parser().parse_args(argv)
    layout = hi.Layout("coordinator", Path(args.root))
    mode = hi.decide("coordinator", args.upgrade, layout.found(), layout.config)
    previous = hi.current_venv(layout)
    if mode is hi.Mode.FRESH:
        for flag in ("grpc_listen", "agent_listen", "http_listen"):
            _listen("--" + flag.replace("_", "-"), getattr(args, flag))
        if not Path(args.data_dir).is_absolute():
            raise hi.InstallError("--data-dir", f"{args.data_dir!r} is not an absolute path",
                                  "such as /var/lib/nodus/coordinator")
        if args.store_url and not args.store_url.startswith(("postgresql://", "postgres://")):
            raise hi.InstallError("--store-url", f"{args.store_url!r} is not a postgresql:// URL",
                                  "leave it out for SQLite in the data dir")
        owner = _user(args.user, layout.live, say)
    venv = hi.build_venv(layout, args.source or hi.default_source(), args.pip_arg, say=say)
    version = hi.venv_version(layout, venv)
    if mode is hi.Mode.FRESH:
        data = layout.host(Path(args.data_dir))
        data.mkdir(parents=True, exist_ok=True)
        os.chmod(data, 0o700)
        if owner is not None:
            os.chown(data, *owner)
        hi.write_file(layout.host(layout.config), config(args).encode(), 0o644)
        files = [str(layout.config)]
        settings = {"data_dir": args.data_dir, "user": args.user}
    else:
        old = hi.Manifest.read(layout)
        assert old is not None
        files, settings = [f for f in old.files if f != str(layout.unit)], old.settings
    unit = hi.render_unit(layout)
    if settings.get("user", "nodus") != "nodus":
        unit = unit.replace("User=nodus", f"User={settings['user']}").replace("Group=nodus", f"Group={settings['user']}")
    if settings.get("data_dir", str(DATA_DIR)) != str(DATA_DIR):  # the unit may write only its data dir
        unit = unit.replace(f"ReadWritePaths={DATA_DIR}", f"ReadWritePaths={settings['data_dir']}")
    hi.write_file(layout.host(layout.unit), unit.encode(), 0o644)
    files.append(str(layout.unit))
    hi.switch_venv(layout, venv)
    say(f"{layout.venv} -> {venv} (nodus {version})")
    hi.finish(layout, mode, hi.Manifest("coordinator", version, str(venv), files, settings), previous, say)
    data_dir = Path(settings.get("data_dir", str(DATA_DIR)))
    if layout.live and mode is hi.Mode.FRESH:
        _wait_ready(data_dir)
    say(f"agents install with: nodus-agent install --coordinator THIS_HOST:{args.grpc_listen.rpartition(':')[2]} "
        f"--join-token-file (a copy of {data_dir / 'join-token'}) --coordinator-ca (a copy of "
        f"{data_dir / 'tls' / 'ca.crt'}); the admin kubeconfig is {data_dir / 'kubeconfig'}")


def _wait_ready(data_dir: Path) -> None:
    deadline = time.monotonic() + START_WAIT
    while not (data_dir / "endpoints.json").exists():
        if time.monotonic() > deadline:
            raise hi.InstallError("install", f"nodus-coordinator did not write {data_dir / 'endpoints.json'} in "
                                  f"{START_WAIT:.0f} s", "see `journalctl -u nodus-coordinator`")
        time.sleep(0.5)


def config(args: argparse.Namespace) -> str:
    """/etc/nodus/coordinator.yaml: the keys systemd/coordinator.yaml shows, with this install's values."""
    return hi.config_text(
        "# /etc/nodus/coordinator.yaml: nodus-coordinator settings, written by `nodus-coordinator install` (edit\n"
        "# freely; an upgrade keeps this file). Every key is also a flag and a NODUS_* environment variable.",
        [("data_dir", args.data_dir, ""),
         ("grpc_listen", args.grpc_listen, "gRPC (TLS) for operators and enrolling agents; enrolled agents use "
                                           "agent_listen (mTLS; ADR 0039)."),
         ("agent_listen", args.agent_listen, ""),
         ("http_listen", args.http_listen, ""),
         ("store_url", args.store_url, ""),
         ("node_certificate_lifetime", "24h", ""),
         ("lease_duration", "15s", ""),
         ("heartbeat_interval", "3s", ""),
         ("log_level", "INFO", "")])


def uninstall(argv: list[str], say: Callable[[str], None] = print) -> None:
    args = uninstall_parser().parse_args(argv)
    layout = hi.Layout("coordinator", Path(args.root))
    manifest = hi.Manifest.read(layout)
    if manifest is None:
        raise hi.InstallError("uninstall", f"no nodus-coordinator installed here (no {layout.manifest} under "
                              f"{args.root})", "give --root the directory it was installed under")
    hi.remove_install(layout, manifest, keep_venvs=False, say=say)
    data_dir = manifest.settings.get("data_dir", str(DATA_DIR))
    if args.purge:
        shutil.rmtree(layout.host(Path(data_dir)), ignore_errors=True)
        say(f"removed the data dir {data_dir}")
    else:
        say(f"kept the data dir {data_dir} (store, CA, join token; --purge deletes it)")


def main(command: str, argv: list[str]) -> None:
    try:
        (install if command == "install" else uninstall)(argv)
    except hi.InstallError as e:
        print(f"nodus-coordinator {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
