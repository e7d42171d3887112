"""`nodus-agent install` / `nodus-coordinator install` into a scratch root (--root), as an operator runs them:
the files they write pass `systemd-analyze verify`, uninstall removes them, an upgrade with an attempt
running leaves it running and re-adopted, and bad input is refused naming its flag (ADR 0056)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import Coordinator, job
from e2e import JOBS, ended
from agent_double import wait_for

from nodus import hostinstall as hi

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ANALYZE = shutil.which("systemd-analyze")
AGENT_VENV = Path("opt/nodus/agent/venv")


def run(*argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(tree: Path, out: Path) -> Path:
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, tree)
    [wheel] = out.glob("nodus-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This checkout as a wheel, and a copy of it one version newer (the upgrade)."""
    tmp = tmp_path_factory.mktemp("wheels")
    old = build_wheel(ROOT, tmp / "old")
    newer = tmp / "newer"
    newer.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, newer / name)
    for folder in ("proto", "sdk", "cli", "agent", "coordinator", "checkpoint", "launchers", "systemd"):
        shutil.copytree(ROOT / folder, newer / folder, ignore=shutil.ignore_patterns("__pycache__"))
    text = (newer / "pyproject.toml").read_text()
    (newer / "pyproject.toml").write_text(text.replace('version = "0.1.0"', 'version = "0.1.1"', 1))
    return old, build_wheel(newer, tmp / "new")


def verify(root: Path, unit: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify --root ROOT` of the installed unit; ROOT gets this host's systemd units (the
    targets the unit orders itself after), as an image with systemd has them."""
    assert ANALYZE is not None, "systemd-analyze is missing: scripts/setup installs the systemd package"
    system = root / "usr/lib/systemd/system"
    if not system.exists():
        shutil.copytree("/usr/lib/systemd/system", system, symlinks=True)
    return run(ANALYZE, "verify", "--man=no", f"--root={root}", f"/etc/systemd/system/{unit}", check=False,
               timeout=60)


# -- decisions and refusals (no venv built) ---------------------------------------------------------------
def test_decide_refuses_a_second_install_and_an_upgrade_of_nothing(tmp_path: Path) -> None:
    config = Path("/etc/nodus/agent.yaml")
    assert hi.decide("agent", False, hi.Found(None, False), config) is hi.Mode.FRESH
    assert hi.decide("agent", True, hi.Found({"version": "0.1.0"}, True), config) is hi.Mode.UPGRADE
    with pytest.raises(hi.InstallError, match=r"^install: nodus-agent is already installed.*--upgrade"):
        hi.decide("agent", False, hi.Found({"version": "0.1.0"}, True), config)
    with pytest.raises(hi.InstallError, match=r"already installed.*agent.yaml exists"):
        hi.decide("agent", False, hi.Found(None, True), config)  # a hand-written config is not overwritten
    with pytest.raises(hi.InstallError, match=r"^--upgrade: no nodus-agent installed"):
        hi.decide("agent", True, hi.Found(None, False), config)


def agent_install(root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run(BIN / "nodus-agent", "install", "--root", root, *flags, check=False)


def test_bad_input_is_refused_naming_the_flag_and_the_fix(coordinator: Coordinator, tmp_path: Path) -> None:
    root = tmp_path / "root"
    token = tmp_path / "token"
    token.write_text(coordinator.join_token + "\n")
    ca = ["--coordinator-ca", str(coordinator.grpc_ca)]
    missing = agent_install(root, "--coordinator", coordinator.grpc, "--join-token-file", tmp_path / "nope", *ca)
    assert missing.returncode == 2
    assert "--join-token-file: cannot read" in missing.stderr and "copy the coordinator's DATA_DIR/join-token" \
        in missing.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    unreachable = agent_install(root, "--coordinator", dead, "--join-token-file", token, *ca)
    assert unreachable.returncode == 2
    assert f"--coordinator: cannot reach the coordinator at {dead}" in unreachable.stderr
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    refused = agent_install(root, "--coordinator", coordinator.grpc, "--join-token-file", wrong, *ca)
    assert refused.returncode == 2 and "--join-token-file: the coordinator refused the join token" in refused.stderr
    not_a_ca = agent_install(root, "--coordinator", coordinator.grpc, "--join-token-file", token,
                             "--coordinator-ca", token)
    assert not_a_ca.returncode == 2 and "--coordinator-ca:" in not_a_ca.stderr and "no PEM" in not_a_ca.stderr
    assert not (root / "etc").exists() and not (root / "opt").exists(), "nothing is written before the checks pass"
    (root / "etc/nodus").mkdir(parents=True)
    (root / "etc/nodus/agent.yaml").write_text("coordinator: elsewhere:7070\n")
    existing = agent_install(root, "--coordinator", coordinator.grpc, "--join-token-file", token, *ca)
    assert existing.returncode == 2 and "already installed" in existing.stderr and "--upgrade" in existing.stderr
    assert (root / "etc/nodus/agent.yaml").read_text() == "coordinator: elsewhere:7070\n"
    bad_listen = run(BIN / "nodus-coordinator", "install", "--root", root, "--grpc-listen", "7070", check=False)
    assert bad_listen.returncode == 2 and "--grpc-listen: '7070' is not HOST:PORT" in bad_listen.stderr
    labels = agent_install(tmp_path / "root3", "--coordinator", coordinator.grpc, "--join-token-file", token, *ca,
                           "--labels", "rack")
    assert labels.returncode == 2 and "--labels: label 'rack' is not key=value" in labels.stderr
    from nodus.agent.x509 import new_key
    coordinator.enrol("taken-node", new_key())  # another host's key holds the name
    taken = agent_install(tmp_path / "root2", "--coordinator", coordinator.grpc, "--join-token-file", token, *ca,
                          "--node", "taken-node")
    assert taken.returncode == 2 and "--node: the coordinator refused to enrol 'taken-node'" in taken.stderr
    assert "nodus node readmit taken-node" in taken.stderr
    settings = agent_install(root, "--upgrade", "--coordinator", "other:7070")
    assert settings.returncode == 2 and "--coordinator: --upgrade keeps the installed configuration" in settings.stderr
    nothing = run(BIN / "nodus-agent", "uninstall", "--root", tmp_path / "empty", check=False)
    assert nothing.returncode == 2 and "no nodus-agent installed here" in nothing.stderr


# -- the real thing ----------------------------------------------------------------------------------------
WAIT_FOR_GO = r"""
import sys, time
from pathlib import Path
Path(sys.argv[1]).open("a").write("started\n")
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print("finished")
"""


class InstalledAgent:
    """The agent the install put under ROOT, run as its unit's ExecStart would run it (paths moved under ROOT:
    the unit is for the installed system), and restarted as KillMode=process does: SIGTERM to the main pid only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root.parent / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        r = self.root
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(r / AGENT_VENV / "bin/nodus-agent"), "--config", str(r / "etc/nodus/agent.yaml"),
                 "--work-dir", str(r / "var/lib/nodus/agent"), "--join-token-file", str(r / "etc/nodus/join-token"),
                 "--coordinator-ca", str(r / "etc/nodus/coordinator-ca.crt"), "--reconnect-base", "0.05",
                 "--reconnect-max", "0.5", "--poll-interval", "0.1", "--stop-grace", "3"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def restart_as_the_unit_does(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.start()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[InstalledAgent]:
    agent = InstalledAgent(tmp_path / "root")
    yield agent
    agent.stop()


def interpreter_of(pid: int) -> str:
    """The venv a process runs from: its script's #! names the interpreter, which /proc shows as argv[0] once
    the process has exec'd the script (until then its cmdline is empty or the forking parent's). Where the venv's
    path makes the #! line longer than the kernel reads (127 bytes: pytest's deep tmp paths do), pip writes a
    `#!/bin/sh` script that execs the venv's python on its second line: wait past the shell."""
    def argv() -> list[str] | None:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        ran = len(words) > 1 and words[1].endswith("/bin/nodus-agent")
        return words if ran and Path(words[0]).name not in ("sh", "dash", "bash") else None
    return str(wait_for(argv, 30, what=f"process {pid} to exec nodus-agent")[0])


@pytest.mark.slow
@pytest.mark.timeout(900)  # each venv is a real pip install of nodus and its dependencies (~1 min here)
def test_install_verify_upgrade_with_an_attempt_running_and_uninstall(coordinator: Coordinator, tmp_path: Path,
                                                                       wheels: tuple[Path, Path],
                                                                       installed: InstalledAgent) -> None:
    old, new = wheels
    root = installed.root
    token = tmp_path / "token"
    token.write_text(coordinator.join_token + "\n")
    out = agent_install(root, "--coordinator", coordinator.grpc, "--join-token-file", token, "--coordinator-ca",
                        str(coordinator.grpc_ca), "--node", "installed-a", "--offering", "h100-test", "--runtime",
                        "process", "--labels", "rack=r1", "--source", str(old))
    assert out.returncode == 0, out.stderr
    assert "enrolled node installed-a" in out.stdout
    assert f"files written under {root}; on the installed system run: systemctl daemon-reload && systemctl " \
           f"enable --now nodus-agent.service" in out.stdout

    # The files: config with systemd/agent.yaml's keys, the token 0600, the unit through the venv symlink.
    settings = yaml.safe_load((root / "etc/nodus/agent.yaml").read_text())
    assert settings["coordinator"] == coordinator.grpc and settings["node"] == "installed-a"
    assert settings["offering"] == "h100-test" and settings["labels"] == "rack=r1"
    assert settings["join_token_file"] == "/etc/nodus/join-token"
    assert settings["coordinator_ca"] == "/etc/nodus/coordinator-ca.crt"
    assert stat.S_IMODE((root / "etc/nodus/join-token").stat().st_mode) == 0o600
    assert (root / "etc/nodus/join-token").read_text().strip() == coordinator.join_token
    unit = (root / "etc/systemd/system/nodus-agent.service").read_text()
    assert "ExecStart=/opt/nodus/agent/venv/bin/nodus-agent --config /etc/nodus/agent.yaml" in unit
    assert "KillMode=process" in unit
    first_venv = (root / AGENT_VENV).resolve()
    assert (root / "var/lib/nodus/agent/identity/node.crt").is_file(), "the node enrolled at install"
    result = verify(root, "nodus-agent.service")
    assert result.returncode == 0 and (result.stdout + result.stderr).strip() == "", result.stdout + result.stderr
    broken = root / "etc/systemd/system/nodus-agent.service"
    broken.write_text(unit.replace("KillMode=process", "KillMode=processes"))  # verify does catch mistakes
    assert "kill mode" in (lambda r: r.stdout + r.stderr)(verify(root, "nodus-agent.service")).lower()
    broken.write_text(unit)

    # The agent from the installed venv runs a Job that waits for a go.
    installed.start()
    assert interpreter_of(installed.proc.pid).startswith(str(first_venv))  # type: ignore[union-attr]
    marker, go = tmp_path / "marker", tmp_path / "go"
    body = job("long", command=[sys.executable, "-c", WAIT_FOR_GO, str(marker), str(go)])
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_for(marker.exists, 90, what="the attempt to start")

    # Upgrade, run from the installed venv as an operator would; then the restart the unit would do.
    up = run(root / AGENT_VENV / "bin/nodus-agent", "install", "--upgrade", "--root", root, "--source", new)
    assert "nodus 0.1.1" in up.stdout and "systemctl restart nodus-agent.service" in up.stdout
    second_venv = (root / AGENT_VENV).resolve()
    assert second_venv != first_venv and first_venv.is_dir(), "the previous venv stays for what still runs from it"
    assert yaml.safe_load((root / "etc/nodus/agent.yaml").read_text()) == settings, "an upgrade keeps the config"
    assert verify(root, "nodus-agent.service").returncode == 0
    installed.restart_as_the_unit_does()
    assert interpreter_of(installed.proc.pid).startswith(str(second_venv))  # type: ignore[union-attr]
    wait_for(lambda: "re-adopted attempt" in installed.text(), 60, what="the re-adoption")
    go.touch()
    j = ended(coordinator, "long", 90)
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert (j["status"].get("attempts") or {}).get("total", 1) == 1
    assert marker.read_text() == "started\n", "the command ran exactly once, across the upgrade"
    installed.stop()

    # Uninstall removes what install wrote and keeps the work dir; --purge would delete it.
    gone = run(BIN / "nodus-agent", "uninstall", "--root", root)
    assert "kept the work dir /var/lib/nodus/agent" in gone.stdout
    for path in ("etc/nodus", "etc/systemd/system/nodus-agent.service", "opt/nodus/agent"):
        assert not (root / path).exists(), path
    assert (root / "var/lib/nodus/agent/identity/node.key").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)  # each venv is a real pip install of nodus and its dependencies (~1 min here)
def test_coordinator_install_verifies_and_uninstall_keeps_the_data_dir(tmp_path: Path,
                                                                        wheels: tuple[Path, Path]) -> None:
    root = tmp_path / "root"
    out = run(BIN / "nodus-coordinator", "install", "--root", root, "--source", wheels[0], "--grpc-listen",
              "0.0.0.0:7443")
    assert "systemctl daemon-reload && systemctl enable --now nodus-coordinator.service" in out.stdout
    assert "nodus-agent install --coordinator THIS_HOST:7443" in out.stdout
    settings = yaml.safe_load((root / "etc/nodus/coordinator.yaml").read_text())
    assert settings["grpc_listen"] == "0.0.0.0:7443" and settings["data_dir"] == "/var/lib/nodus/coordinator"
    assert stat.S_IMODE((root / "var/lib/nodus/coordinator").stat().st_mode) == 0o700
    unit = (root / "etc/systemd/system/nodus-coordinator.service").read_text()
    assert "ExecStart=/opt/nodus/coordinator/venv/bin/nodus-coordinator --config /etc/nodus/coordinator.yaml" in unit
    result = verify(root, "nodus-coordinator.service")
    assert result.returncode == 0 and (result.stdout + result.stderr).strip() == "", result.stdout + result.stderr
    # The installed coordinator's own flags accept the config it was given.
    check = run(root / "opt/nodus/coordinator/venv/bin/python", "-c",
                "import sys; from nodus import config; from nodus.coordinator.main import parser; "
                "a = config.resolve(parser(), ['--config', sys.argv[1]]); print(a.grpc_listen, a.agent_listen)",
                root / "etc/nodus/coordinator.yaml")
    assert check.stdout.split() == ["0.0.0.0:7443", "0.0.0.0:7071"]
    again = run(BIN / "nodus-coordinator", "install", "--root", root, "--source", wheels[0], check=False)
    assert again.returncode == 2 and "already installed" in again.stderr
    (root / "var/lib/nodus/coordinator/store.db").write_text("data")
    gone = run(BIN / "nodus-coordinator", "uninstall", "--root", root)
    assert "kept the data dir" in gone.stdout
    for path in ("etc/nodus", "etc/systemd/system/nodus-coordinator.service", "opt/nodus/coordinator"):
        assert not (root / path).exists(), path
    assert (root / "var/lib/nodus/coordinator/store.db").read_text() == "data"
    assert os.listdir(root / "etc/systemd/system") == [] and not list(root.rglob("install.json"))


SUPERVISOR = r"""
import json, os, signal, sys, time
from pathlib import Path
run = Path(sys.argv[1])
run.mkdir(parents=True)
signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[2]).write_text("stopped\n"), sys.exit(0)))
(run / "status.json").write_text(json.dumps({"supervisor_pid": os.getpid(), "phase": "Running"}))
while True:
    time.sleep(0.05)
"""


def hand_made_install(root: Path) -> None:
    """What `nodus-agent install --root ROOT` leaves, without the minute a real venv takes (the e2e test builds one)."""
    layout = hi.Layout("agent", root)
    venv = layout.prefix / "venvs" / "20261207-000000-1"
    (layout.host(venv) / "bin").mkdir(parents=True, exist_ok=True)
    hi.switch_venv(layout, venv)
    for path in (layout.config, layout.unit, Path("/etc/nodus/join-token")):
        hi.write_file(layout.host(path), b"x\n", 0o600)
    hi.Manifest("agent", "0.1.0", str(venv), [str(layout.config), "/etc/nodus/join-token", str(layout.unit)],
                {"work_dir": "/var/lib/nodus/agent", "node": "n1"}).write(layout)


def test_uninstall_leaves_running_attempts_alone_unless_asked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    hand_made_install(root)
    run_dir = root / "var/lib/nodus/agent/attempts/job-a-0-1/run"
    stopped = tmp_path / "stopped"
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(run_dir), str(stopped)])
    try:
        wait_for(lambda: (run_dir / "status.json").exists(), 30, what="the stand-in supervisor")
        purge = run(BIN / "nodus-agent", "uninstall", "--root", root, "--purge", check=False)
        assert purge.returncode == 2 and "--purge: 1 attempt(s) still run" in purge.stderr
        assert "--stop-attempts" in purge.stderr and (root / "etc/nodus/agent.yaml").exists()
        kept = run(BIN / "nodus-agent", "uninstall", "--root", root)
        assert "left 1 attempt(s) running (job-a-0-1)" in kept.stdout
        assert supervisor.poll() is None and not stopped.exists(), "the attempt was left alone"
        assert not (root / "etc/nodus").exists() and not (root / "etc/systemd/system/nodus-agent.service").exists()
        assert (root / "opt/nodus/agent/venvs/20261207-000000-1").is_dir(), "its interpreter is kept while it runs"
        assert "kept /opt/nodus/agent/venvs" in kept.stdout

        hand_made_install(root)
        gone = run(BIN / "nodus-agent", "uninstall", "--root", root, "--stop-attempts", "--purge")
        assert supervisor.wait(30) == 0 and stopped.read_text() == "stopped\n", "SIGTERM, as a cancel stops it"
        assert "stopped 1 attempt(s)" in gone.stdout
        assert not (root / "opt/nodus/agent").exists() and not (root / "var/lib/nodus/agent").exists()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
