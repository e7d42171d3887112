"""The systemd units verify cleanly, keep workloads alive across agent restarts, and the example
configuration files are accepted by the daemons they are for."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodus import config as daemon_config

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "systemd"
BIN = Path(sys.executable).parent
ANALYZE = shutil.which("systemd-analyze")
UNITS = ("nodus-coordinator.service", "nodus-agent.service")

needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def installed_copy(unit: str, tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this venv's scripts (verify checks they are executable)."""
    text = (SYSTEMD / unit).read_text().replace("/usr/local/bin/", f"{BIN}/")
    path = tmp_path / unit
    path.write_text(text)
    return path


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)


def settings(unit: str) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / unit).read_text())
    return {section: dict(parser[section]) for section in parser.sections()}


@needs_analyze
@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies_without_warnings(unit: str, tmp_path: Path) -> None:
    result = verify(installed_copy(unit, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).strip() == ""


@needs_analyze
def test_verify_does_catch_mistakes(tmp_path: Path) -> None:
    path = installed_copy("nodus-agent.service", tmp_path)
    path.write_text(path.read_text().replace("KillMode=process", "KillMode=processes\nWatchdogSecs=3"))
    result = verify(path)
    out = result.stdout + result.stderr
    assert "kill mode" in out.lower() and "WatchdogSecs" in out


def test_agent_unit_spares_workloads_and_is_watched() -> None:
    service = settings("nodus-agent.service")["Service"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["KillMode"] == "process", "stopping the agent must not kill the attempts"
    assert service["Delegate"] == "yes", "the agent manages cgroups"
    assert service["WatchdogSec"]
    for forbidden in ("NoNewPrivileges", "ProtectControlGroups", "PrivateDevices", "PrivateTmp", "ProtectSystem"):
        assert forbidden not in service, f"{forbidden} would stop the agent from doing its job"
    assert service["ExecStart"].split()[0] == "/usr/local/bin/nodus-agent"


def test_coordinator_unit_is_locked_down() -> None:
    service = settings("nodus-coordinator.service")["Service"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert service["CapabilityBoundingSet"] == ""
    assert service["User"] == "nodus"


def test_example_configuration_is_accepted(tmp_path: Path) -> None:
    from nodus.agent.main import parser as agent_parser
    from nodus.coordinator.main import parser as coordinator_parser

    agent = daemon_config.resolve(agent_parser(), ["--config", str(SYSTEMD / "agent.yaml")])
    assert agent.coordinator == "coordinator.internal:7070" and not agent.workload_user
    assert agent.labels == "rack=r12,fabric=ib" and agent.interruptible is False
    coordinator = daemon_config.resolve(coordinator_parser(), ["--config", str(SYSTEMD / "coordinator.yaml")])
    assert coordinator.grpc_listen == "0.0.0.0:7070" and coordinator.lease_duration == "15s"
    for env_file in ("agent.env", "coordinator.env"):
        for line in (SYSTEMD / env_file).read_text().splitlines():
            assert not line.strip() or line.startswith("#") or "=" in line
