"""run/supervisor.log is made at the supervisor's first line to it, not at every fork (ADR 0112)."""
from __future__ import annotations

import os
from pathlib import Path

from nodus.agent.layout import AttemptLayout
from nodus.agent.supervisor.__main__ import LazyLog, _from_zygote


def test_a_supervisor_log_nobody_writes_is_never_made(tmp_path: Path) -> None:
    log = LazyLog(tmp_path / "supervisor.log")
    log.flush()
    assert not (tmp_path / "supervisor.log").exists()


def test_what_a_zygotes_child_prints_reaches_its_supervisor_log(tmp_path: Path) -> None:
    layout = AttemptLayout(tmp_path / "att-1")
    layout.run.mkdir(parents=True)  # no spec: the supervisor says so on stderr and returns
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    pid = os.fork()
    if pid == 0:  # as the zygote's child does
        code = 1
        try:
            _from_zygote({"attempt_dir": str(layout.root)}, lock)
            os.write(2, b"a line on fd 2\n")  # once made, the file is fds 1 and 2 too
            code = 0
        finally:
            os._exit(code)
    os.close(lock)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    text = (layout.run / "supervisor.log").read_text()
    assert f"no spec at {layout.spec}" in text and "a line on fd 2" in text
