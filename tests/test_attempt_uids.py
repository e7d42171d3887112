"""The agent's uid range (ADR 0040): parsing and the clash check, and the allocator's allocation, its
record across an agent restart, release, round robin and the live-process rule."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nodus.agent.oci.bundle import ID_BASE
from nodus.agent.uids import AttemptUids, UidRange, UidsExhausted, blocked_ancestor, uids_with_processes

BIN = Path(sys.executable).parent


def test_a_range_is_parsed_and_malformed_ones_name_the_form() -> None:
    rng = UidRange.parse("200000:65536")
    assert (rng.start, rng.count, rng.last, str(rng)) == (200000, 65536, 265535, "200000:65536")
    assert 200000 in rng and 265535 in rng and 199999 not in rng and 265536 not in rng
    for bad in ("200000", "a:b", "200000:-1", "0:10", "10:0", "", "4294967290:10"):
        with pytest.raises(ValueError) as e:
            UidRange.parse(bad)
        assert "START:COUNT" in str(e.value) or "at least 1" in str(e.value) or "last valid id" in str(e.value)


def test_a_range_that_holds_a_passwd_or_group_entry_or_the_pods_ids_clashes() -> None:
    rng = UidRange.parse("1000:100")
    assert rng.clashes(users=[("alice", 1001), ("root", 0)], groups=[("staff", 1050)]) == [
        "user alice (uid 1001)", "group staff (gid 1050)"]
    assert UidRange(ID_BASE - 10, 20).clashes(users=[], groups=[])[0].startswith("the oci runtime's pod ids")
    assert UidRange.parse("200000:65536").clashes(users=[("nobody", 65534)], groups=[]) == []
    with pytest.raises(ValueError, match=r"overlaps user root \(uid 0\)"):
        UidRange(0, 10).check()


def _attempt(base: Path, name: str) -> Path:
    d = base / "attempts" / name
    d.mkdir(parents=True)
    return d


def test_each_attempt_gets_its_own_uid_and_keeps_it(tmp_path: Path) -> None:
    uids = AttemptUids(UidRange(300000, 4), tmp_path / "uids.json", tmp_path / "attempts", live=set)
    _attempt(tmp_path, "a"), _attempt(tmp_path, "b")
    a, b = uids.allocate("a"), uids.allocate("b")
    assert (a, b) == (300000, 300001)
    assert uids.allocate("a") == a and uids.uid_of("b") == b and uids.uid_of("c") is None
    on_disk = json.loads((tmp_path / "uids.json").read_text())
    assert on_disk["attempts"] == {"a": a, "b": b} and on_disk["range"] == "300000:4"
    assert (tmp_path / "uids.json").stat().st_mode & 0o777 == 0o600


def test_a_restarted_agent_gives_re_adopted_attempts_the_same_uid_and_drops_removed_ones(tmp_path: Path) -> None:
    first = AttemptUids(UidRange(300000, 8), tmp_path / "uids.json", tmp_path / "attempts", live=set)
    _attempt(tmp_path, "kept")
    gone = _attempt(tmp_path, "gone")
    kept = first.allocate("kept")
    first.allocate("gone")
    gone.rmdir()  # removed, and the agent died before it released the uid
    again = AttemptUids(UidRange(300000, 8), tmp_path / "uids.json", tmp_path / "attempts", live=set)
    assert again.uid_of("kept") == kept and again.uid_of("gone") is None
    assert json.loads((tmp_path / "uids.json").read_text())["attempts"] == {"kept": kept}
    _attempt(tmp_path, "new")
    assert again.allocate("new") == 300002  # the round robin went on from where it was


def test_a_released_uid_comes_back_only_after_the_others_had_their_turn(tmp_path: Path) -> None:
    uids = AttemptUids(UidRange(300000, 3), tmp_path / "uids.json", tmp_path / "attempts", live=set)
    got = []
    for n in range(3):
        _attempt(tmp_path, f"a{n}")
        got.append(uids.allocate(f"a{n}"))
    assert got == [300000, 300001, 300002]
    _attempt(tmp_path, "a3")
    with pytest.raises(UidsExhausted, match="all 3 uids of --attempt-uids 300000:3"):
        uids.allocate("a3")
    uids.release("a1")
    uids.release("a0")
    assert uids.allocate("a3") == 300000  # the cursor wrapped: the oldest free one
    _attempt(tmp_path, "a4")
    assert uids.allocate("a4") == 300001
    uids.release("never-held")  # nothing to do


def test_a_uid_that_still_runs_a_process_is_never_handed_out_again(tmp_path: Path) -> None:
    live: set[int] = set()
    scans: list[int] = []

    def seen() -> set[int]:
        scans.append(1)
        return set(live)

    uids = AttemptUids(UidRange(300000, 3), tmp_path / "uids.json", tmp_path / "attempts", live=seen)
    for n in range(3):
        _attempt(tmp_path, f"a{n}")
        uids.allocate(f"a{n}")
    assert scans == []  # a uid never handed out cannot run anything of ours: no scan of /proc
    for n in range(3):
        uids.release(f"a{n}")
    live.update({300000, 300002})  # say a program of a0 and of a2 escaped and still runs
    _attempt(tmp_path, "b")
    assert uids.allocate("b") == 300001 and scans == [1]
    _attempt(tmp_path, "c")
    with pytest.raises(UidsExhausted):
        uids.allocate("c")
    live.clear()
    assert uids.allocate("c") == 300002
    # The round robin went round: a restarted agent keeps checking.
    assert json.loads((tmp_path / "uids.json").read_text())["wrapped"] is True
    again = AttemptUids(UidRange(300000, 3), tmp_path / "uids.json", tmp_path / "attempts", live=seen)
    _attempt(tmp_path, "d")
    before = len(scans)
    assert again.allocate("d") == 300000 and len(scans) == before + 1


def test_a_record_lost_with_the_host_comes_back_from_the_directorys_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: giving a directory another group needs root; the allocator's recovery of a lost "
                    "record is then untested here")
    d = _attempt(tmp_path, "survivor")
    os.chown(d, 0, 300005)
    uids = AttemptUids(UidRange(300000, 10), tmp_path / "uids.json", tmp_path / "attempts", live=set)
    assert uids.uid_of("survivor") == 300005
    _attempt(tmp_path, "other")
    assert uids.allocate("other") == 300000


def test_a_work_dir_under_a_directory_closed_to_others_is_found(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "open" / "deeper").mkdir(parents=True)
    closed.chmod(0o700)
    assert blocked_ancestor(closed / "open" / "deeper" / "work") == closed  # the nearest one
    base = Path(tempfile.mkdtemp(prefix="nodus-uids-unit-"))
    try:
        base.chmod(0o755)
        assert blocked_ancestor(base / "work") is None  # / and /tmp let every uid through
    finally:
        base.rmdir()


def test_the_hosts_processes_are_seen_by_their_uids() -> None:
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: starting a process under another uid needs root; the uid allocator's live-process "
                    "check is then untested here")
    proc = subprocess.Popen(["sleep", "30"], user=300123, group=300123)
    try:
        assert 300123 in uids_with_processes() and os.getuid() in uids_with_processes()
    finally:
        proc.kill()
        proc.wait()
    assert 300123 not in uids_with_processes()


def test_the_agent_refuses_a_malformed_or_clashing_range_at_start(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    base = [str(BIN / "nodus-agent"), "--work-dir", str(tmp_path / "work"), "--join-token-file", str(token),
            "--runtime", "process"]
    bad = subprocess.run([*base, "--attempt-uids", "200000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--attempt-uids: '200000' is not START:COUNT" in bad.stderr, bad.stderr
    if os.geteuid() != 0:
        return  # the clash check runs only where the range is used
    blocked = subprocess.run([*base, "--attempt-uids", "300000:10"], capture_output=True, text=True, timeout=60)
    closed = blocked_ancestor(tmp_path / "work")
    assert closed is not None  # pytest's directories are 0700
    assert blocked.returncode != 0 and (f"the attempts' uids cannot reach the work dir {tmp_path / 'work'}: "
                                        f"{closed} lets only its owner through") in blocked.stderr, blocked.stderr
    nobody = subprocess.run([*base, "--attempt-uids", "65530:10"], capture_output=True, text=True, timeout=60)
    assert nobody.returncode != 0, nobody.stderr
    assert "--attempt-uids: 65530:10 overlaps user nobody (uid 65534)" in nobody.stderr, nobody.stderr


def test_the_runtime_gives_an_attempt_what_the_agent_materialized_for_it(tmp_path: Path) -> None:
    """prepare → (the agent materializes inputs, volumes and code as root) → write_spec: the attempt's uid
    owns its directories, inputs, volumes and code, and nothing of Nodus's own (run/, logs/)."""
    if os.geteuid() != 0:
        pytest.skip("LOUD SKIP: chown to an attempt uid needs root; the runtime's ownership is then untested here")
    from nodus.agent.runtime.process import ProcessRuntime
    from nodus.v1 import agent_pb2

    rt = ProcessRuntime(tmp_path / "work", attempt_uids="300500:10", zygote=False, cgroups=False)
    a = agent_pb2.Assignment(attempt_id="att-own", command=["true"])
    a.source.blob.sha256 = "0" * 64
    a.volumes.add(volume="ds", read_only=True)
    a.secrets.add(name="db", version=1, data={"password": b"nodus-test-secret"})
    layout = rt.prepare(a)
    uid = rt.uids.uid_of("att-own") if rt.uids else None
    assert uid == 300500 and stat.S_IMODE((tmp_path / "work" / "attempts").stat().st_mode) == 0o711
    for made in (layout.inputs / "data" / "private", layout.volumes / "ds", layout.root / "src"):
        made.mkdir(parents=True)
        (made / "f").write_text("x")
        (made / "f").chmod(0o400)
        made.chmod(0o500)
    rt.write_spec(a, layout)
    owners = {p.relative_to(layout.root).as_posix(): p.lstat().st_uid for p in layout.root.rglob("*")}
    theirs = {p for p, owner in owners.items() if owner == uid}
    assert {"inputs/data", "inputs/data/private/f", "volumes/ds/f", "src", "src/f", "state", "outputs",
            "run/tmp", "run/progress.jsonl", "run/secrets/db/password"} <= theirs, owners
    assert not {p for p in theirs if p.startswith(("run/spec", "run/status", "logs"))}
    assert json.loads(layout.spec.read_text())["user"] == {"name": "nodus-attempt-300500", "uid": 300500,
                                                           "gid": 300500, "groups": []}
    rt.remove(layout)
    assert not layout.root.exists() and rt.uids is not None and rt.uids.uid_of("att-own") is None


def test_an_agent_that_is_not_root_says_so_at_error_level_and_runs_attempts_as_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from nodus.agent.runtime.process import ProcessRuntime

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.ERROR, logger="nodus.agent.runtime"):
        rt = ProcessRuntime(tmp_path / "work", attempt_uids="300500:10", zygote=False)
    assert rt.uids is None and rt.user is None
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "attempts run as the agent's own user (uid 1000), all under one uid" in record.getMessage()
    assert "--attempt-uids 300500:10" in record.getMessage()


def test_a_release_rides_on_the_next_allocations_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ADR 0102: on a busy node an index's release and the next index's allocation write uids.json once, not
    twice; a restarted agent drops a released record by itself, and a stop writes what is still pending."""
    from nodus.agent.swapfile import SwapFile
    writes: list[dict[str, Any]] = []
    real = SwapFile.write

    def counted(self: SwapFile, data: bytes, durable: bool = True) -> None:
        writes.append(json.loads(data))
        real(self, data, durable)

    monkeypatch.setattr(SwapFile, "write", counted)
    path = tmp_path / "uids.json"
    uids = AttemptUids(UidRange(300000, 8), path, tmp_path / "attempts", live=set, release_save_delay=3600)
    done = _attempt(tmp_path, "a0")
    uids.allocate("a0")
    done.rmdir()
    uids.release("a0")
    assert uids.uid_of("a0") is None and json.loads(path.read_text())["attempts"] == {"a0": 300000}
    assert AttemptUids(UidRange(300000, 8), path, tmp_path / "attempts", live=set).held == {}  # dropped at load
    writes.clear()
    _attempt(tmp_path, "a1")
    uids.allocate("a1")
    assert [w["attempts"] for w in writes] == [{"a1": 300001}]  # the release and the allocation: one write
    uids.release("a1")
    uids.close()
    assert json.loads(path.read_text())["attempts"] == {}
    writes.clear()
    uids.close()
    assert writes == []  # nothing pending: nothing written
