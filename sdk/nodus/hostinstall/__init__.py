"""What `nodus-agent install` and `nodus-coordinator install` share (docs/adr/0056-host-install.md).

Each daemon gets its own prefix, /opt/nodus/<component>: versioned virtual environments in venvs/, the
symlink venv -> venvs/<current> that the systemd unit's ExecStart goes through, and install.json, the
manifest of every file the install wrote (uninstall removes exactly those). An upgrade builds a new venv
beside the current one and swaps the symlink atomically; the previous venv stays (processes started
from it, such as attempt supervisors, keep their files), older ones are removed.

Everything is written under a root prefix (`--root DIR`, default /): a path below is always the path
on the installed system (/etc/nodus/agent.yaml), and Layout.host() is where it lies here. systemctl
runs only when the root is / and systemd runs; otherwise the install says what to run.

Kept out of nodus.agent and nodus.coordinator (which never import each other), and out of the SDK's
modules list (a package, not a module, so it is not copied into containers: agent/oci/sdk.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ETC = Path("/etc/nodus")
UNIT_DIR = Path("/etc/systemd/system")
PREFIX = Path("/opt/nodus")
KEEP_VENVS = 2
"""The current venv and the one before it (processes started from it may still run)."""
_CHECKOUT_SYSTEMD = Path(__file__).resolve().parents[3] / "systemd"
"""systemd/ of the checkout an editable install runs from (a wheel carries the same files inside)."""


class InstallError(Exception):
    """Bad input or a refused step: names the flag, what is wrong and the fix."""

    def __init__(self, flag: str, problem: str, fix: str) -> None:
        super().__init__(f"{flag}: {problem}; {fix}")
        self.flag = flag


class Mode(Enum):
    """What an install run does, decided from the request and what is already installed."""

    FRESH = "fresh"
    UPGRADE = "upgrade"


@dataclass(frozen=True, slots=True)
class Found:
    """An existing install, as its manifest records it (None fields: nothing there)."""

    manifest: dict[str, Any] | None
    config_exists: bool


def decide(component: str, upgrade: bool, found: Found, config: Path) -> Mode:
    """Fresh install, upgrade, or an InstallError saying why neither (pure)."""
    installed = found.manifest is not None or found.config_exists
    if upgrade and found.manifest is None:
        raise InstallError("--upgrade", f"no nodus-{component} installed by `nodus-{component} install` here "
                                        f"(no {PREFIX / component / 'install.json'})",
                           f"run `nodus-{component} install` without --upgrade first")
    if upgrade:
        return Mode.UPGRADE
    if installed:
        version = (found.manifest or {}).get("version", "unknown version")
        raise InstallError("install", f"nodus-{component} is already installed here ({config} exists; {version})",
                           f"re-run with --upgrade to replace its venv and restart it (running attempts keep "
                           f"running), or `nodus-{component} uninstall` first")
    return Mode.FRESH


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one component's files go, on the installed system and (host()) on this one."""

    component: str
    root: Path = Path("/")

    def host(self, target: Path) -> Path:
        """TARGET (an absolute path on the installed system) as a path here, under the root."""
        return self.root / target.relative_to("/")

    @property
    def prefix(self) -> Path:
        return PREFIX / self.component

    @property
    def venv(self) -> Path:
        return self.prefix / "venv"

    @property
    def manifest(self) -> Path:
        return self.prefix / "install.json"

    @property
    def unit(self) -> Path:
        return UNIT_DIR / f"nodus-{self.component}.service"

    @property
    def config(self) -> Path:
        return ETC / f"{self.component}.yaml"

    @property
    def live(self) -> bool:
        """systemctl applies: the root is this system's and systemd runs it."""
        return self.root.resolve() == Path("/") and Path("/run/systemd/system").is_dir()

    def found(self) -> Found:
        path = self.host(self.manifest)
        manifest = json.loads(path.read_text()) if path.is_file() else None
        return Found(manifest, self.host(self.config).exists())


# -- files --------------------------------------------------------------------------------------------------
def write_file(path: Path, data: bytes, mode: int) -> None:
    """Writes PATH whole (a temporary file renamed over it) with MODE from its creation on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def systemd_file(name: str) -> str:
    """A file of the repository's systemd/ folder (units and example configs), from this installation."""
    try:
        from importlib.resources import files
        packaged = files("nodus.hostinstall").joinpath("systemd", name)
        if packaged.is_file():
            return packaged.read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    return (_CHECKOUT_SYSTEMD / name).read_text()


def render_unit(layout: Layout) -> str:
    """systemd/nodus-<component>.service with ExecStart through the installed venv's symlink."""
    text = systemd_file(f"nodus-{layout.component}.service")
    binary = f"/usr/local/bin/nodus-{layout.component}"
    if binary not in text:
        raise RuntimeError(f"systemd/nodus-{layout.component}.service has no ExecStart={binary}")
    return text.replace(binary, str(layout.venv / "bin" / f"nodus-{layout.component}"))


def yaml_value(value: Any) -> str:
    """A scalar as YAML writes it (strings quoted only where YAML would misread them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text == "" or re.search(r"[:#{}\[\],&*!|>'\"%@`]|^\s|\s$", text) or text.lower() in (
            "true", "false", "yes", "no", "on", "off", "null", "~"):
        return json.dumps(text)
    return text


def config_text(header: str, settings: list[tuple[str, Any, str]]) -> str:
    """A config file: HEADER, then each (key, value, comment) that has a value; a None value is left out."""
    lines = [header.rstrip(), ""]
    for key, value, comment in settings:
        if value is None:
            continue
        if comment:
            lines.extend(f"# {c}" for c in comment.splitlines())
        lines.append(f"{key}: {yaml_value(value)}")
    return "\n".join(lines) + "\n"


# -- the virtual environment -------------------------------------------------------------------------------
def add_install_flags(p: argparse.ArgumentParser) -> None:
    """--root, --source and --pip-arg: what both daemons' `install` take alike."""
    p.add_argument("--root", default="/", help="install under this directory instead of / (an image, or tests): "
                   "files only, no systemctl; it says what to run")
    p.add_argument("--source", help="what pip installs into the venv: a nodus wheel, checkout or requirement "
                   "(default: the checkout this runs from, else nodus==this version)")
    p.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                   help="an argument for pip install, written --pip-arg=--find-links=DIR (repeatable)")


def default_source() -> str:
    """What pip installs when --source is not given: the checkout an editable install runs from, else this
    installation's version of nodus from the package index."""
    checkout = _CHECKOUT_SYSTEMD.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "agent" / "nodus").is_dir():
        return str(checkout)
    return f"nodus=={metadata.version('nodus')}"


def build_venv(layout: Layout, source: str, pip_args: list[str], python: str = sys.executable,
               say: Callable[[str], None] = print) -> Path:
    """A new venv under PREFIX/venvs with SOURCE pip-installed into it; its path on the installed system.

    Built at the path it keeps (scripts' #! lines name it); nothing points at it until switch_venv.
    """
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    target = layout.prefix / "venvs" / name
    here = layout.host(target)
    here.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", python) if python == sys.executable else python
    say(f"building {target} from {source}")
    steps = [[base, "-m", "venv", str(here)],
             [str(here / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              *pip_args, source]]
    for argv in steps:
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(here, ignore_errors=True)
            tail = (result.stderr or result.stdout).strip()[-2000:]
            raise InstallError("--source", f"`{' '.join(argv)}` failed ({result.returncode}): {tail}",
                               "give --source a nodus wheel, checkout or requirement pip can install here "
                               "(--pip-arg passes index options such as --find-links DIR)")
    return target


def venv_version(layout: Layout, venv: Path) -> str:
    out = subprocess.run([str(layout.host(venv) / "bin" / "python"), "-c",
                          "from importlib import metadata; print(metadata.version('nodus'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def current_venv(layout: Layout) -> Path | None:
    """The venv the symlink points at (path on the installed system), or None."""
    link = layout.host(layout.venv)
    if not link.is_symlink():
        return None
    return layout.prefix / os.readlink(link)


def switch_venv(layout: Layout, new: Path) -> None:
    """Points PREFIX/venv at NEW in one rename (a relative link, so it resolves under any root)."""
    link = layout.host(layout.venv)
    tmp = link.with_name(".venv.new")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(new, layout.prefix), tmp)
    os.replace(tmp, link)


def prune_venvs(layout: Layout, keep: list[Path]) -> list[Path]:
    """Removes the venvs not in KEEP; those removed."""
    venvs = layout.host(layout.prefix / "venvs")
    kept = {layout.host(k).name for k in keep}
    removed = []
    for d in sorted(venvs.iterdir()) if venvs.is_dir() else []:
        if d.name not in kept:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(layout.prefix / "venvs" / d.name)
    return removed


# -- systemd -----------------------------------------------------------------------------------------------
def systemctl(*argv: str) -> None:
    result = subprocess.run(["systemctl", *argv], capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError("systemctl", f"`systemctl {' '.join(argv)}` failed: {result.stderr.strip()}",
                           f"see `journalctl -u {argv[-1]}`")


@dataclass(slots=True)
class Manifest:
    """install.json: what an install wrote, so uninstall removes exactly that."""

    component: str
    version: str
    venv: str
    files: list[str] = field(default_factory=list)
    """Files on the installed system (configs, token, CA, unit)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What uninstall needs to know: the work or data dir."""

    def write(self, layout: Layout) -> None:
        body = {"component": self.component, "version": self.version, "venv": self.venv, "files": self.files,
                "settings": self.settings}
        write_file(layout.host(layout.manifest), json.dumps(body, indent=2).encode() + b"\n", 0o644)

    @classmethod
    def read(cls, layout: Layout) -> "Manifest | None":
        found = layout.found().manifest
        if found is None:
            return None
        return cls(found["component"], found["version"], found["venv"], list(found["files"]),
                   dict(found.get("settings", {})))


def finish(layout: Layout, mode: Mode, manifest: Manifest, previous: Path | None,
           say: Callable[[str], None]) -> None:
    """Writes the manifest, starts (fresh) or restarts (upgrade) the unit where systemd runs, or says what
    to run; keeps the current and previous venvs."""
    manifest.write(layout)
    unit = layout.unit.name
    if layout.live:
        systemctl("daemon-reload")
        if mode is Mode.FRESH:
            systemctl("enable", "--now", unit)
            say(f"started {unit} (systemctl enable --now)")
        else:
            systemctl("restart", unit)
            say(f"restarted {unit} on {manifest.version}")
    else:
        verb = "enable --now" if mode is Mode.FRESH else "restart"
        say(f"files written under {layout.root}; on the installed system run: systemctl daemon-reload && "
            f"systemctl {verb} {unit}")
    keep = [Path(manifest.venv)] + ([previous] if previous is not None else [])
    for gone in prune_venvs(layout, keep):
        say(f"removed the old venv {gone}")


def remove_install(layout: Layout, manifest: Manifest, keep_venvs: bool, say: Callable[[str], None]) -> None:
    """Stops and disables the unit (where systemd runs), removes the files the manifest lists, and the
    venvs unless KEEP_VENVS (processes started from them still run)."""
    unit = layout.unit.name
    if layout.live:
        subprocess.run(["systemctl", "disable", "--now", unit], capture_output=True, text=True)
        say(f"stopped and disabled {unit}")
    for name in manifest.files:
        path = layout.host(Path(name))
        if path.exists() or path.is_symlink():
            path.unlink()
            say(f"removed {name}")
    if layout.live:
        systemctl("daemon-reload")
    prefix = layout.host(layout.prefix)
    if keep_venvs:
        layout.host(layout.manifest).unlink(missing_ok=True)
        say(f"kept {layout.prefix / 'venvs'}: processes started from it still run; remove it once they end")
    else:
        shutil.rmtree(prefix, ignore_errors=True)
        say(f"removed {layout.prefix}")
    etc = layout.host(ETC)
    if etc.is_dir() and not any(etc.iterdir()):
        etc.rmdir()
