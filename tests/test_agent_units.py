"""The agent's pure parts: reconcile, the status fold, backoff, progress folding, files and archives."""
from __future__ import annotations

import io
import json
import os
import random
import tarfile
from pathlib import Path

import pytest

from nodus.checkpoint.errors import CheckpointError
import zstandard

from nodus import progress
from nodus.agent import layout as L
from nodus.agent import reconcile
from nodus.agent.archive import pack_dir, sha256_file, unpack
from nodus.agent.attempts import Attempt, Stage, observe
from nodus.agent.backoff import Backoff
from nodus.agent.blobs import blob_digest
from nodus.agent.progress_tail import ProgressTail
from nodus.agent.runtime.process import ProcessRuntime, Refused, attempt_env
from nodus.agent.statefile import read_json, write_json
from nodus.v1 import agent_pb2


def a(attempt_id: str) -> agent_pb2.Assignment:
    return agent_pb2.Assignment(attempt_id=attempt_id, command=["true"])


# -- reconcile -------------------------------------------------------------------------------------
def test_full_state_starts_missing_stops_cancelled_and_unassigned() -> None:
    fs = agent_pb2.FullState(assignments=[a("keep"), a("new"), a("done-before")],
                             cancels=[agent_pb2.Cancel(attempt_id="cancel-me", reason="Preempted", grace_seconds=7),
                                      agent_pb2.Cancel(attempt_id="unknown", reason="Cancelled")])
    known = {"keep", "cancel-me", "orphan", "ended"}
    live = {"keep", "cancel-me", "orphan"}
    actions = reconcile.full_state(fs, known, live, finished={"done-before"}, default_grace=10)
    assert actions == [reconcile.Start(fs.assignments[1]), reconcile.Resend("done-before"),
                       reconcile.Stop("cancel-me", "Preempted", 7.0), reconcile.Stop("orphan", "Unassigned", 10)]


def test_repeated_assignment_is_a_noop_and_cancel_without_grace_uses_the_default() -> None:
    assert reconcile.assignment(a("x"), known={"x"}, finished=()) == []
    assert reconcile.assignment(a("x"), known=(), finished={"x"}) == [reconcile.Resend("x")]
    assert reconcile.cancel(agent_pb2.Cancel(attempt_id="x"), live={"x"}, default_grace=4) == [
        reconcile.Stop("x", "Cancelled", 4)]
    assert reconcile.cancel(agent_pb2.Cancel(attempt_id="y"), live={"x"}, default_grace=4) == []


# -- the status fold -------------------------------------------------------------------------------
def test_observe_folds_status_and_liveness() -> None:
    assert observe(None, alive=True) is None
    assert observe({"phase": L.SPAWNED}, alive=True) is None
    lost = observe(None, alive=False)
    assert lost is not None and lost.phase == L.LOST and lost.kill_leftovers
    running = observe({"phase": L.RUNNING, "start_time": 5.0}, alive=True)
    assert running is not None and running.stage == Stage.SUPERVISED and running.fields["start_time"] == 5.0
    died = observe({"phase": L.RUNNING}, alive=False)
    assert died is not None and died.stage == Stage.DONE and died.phase == L.LOST and died.fields["reason"] == "AgentFault"
    assert "while running" in died.fields["message"] and died.kill_leftovers
    found_at = observe({"phase": L.RUNNING}, alive=False, now=1_767_225_600.0)
    assert found_at is not None and found_at.fields["finish_time"] == 1_767_225_600.0, "the agent clock's time"
    ok = observe({"phase": L.SUCCEEDED, "outputs": [{"name": "outputs"}]}, alive=False)
    assert ok is not None and (ok.stage, ok.phase) == (Stage.COLLECTING, L.STOPPING)
    failed = observe({"phase": L.FAILED, "reason": "OOMKilled", "oom_killed": True, "exit_code": 137}, alive=True)
    assert failed is not None and (failed.stage, failed.phase) == (Stage.DONE, L.FAILED) and not failed.kill_leftovers


def test_attempt_round_trips_through_state_without_volatile_fields() -> None:
    att = Attempt("x", {"project": "p", "name": "j", "uid": "u"}, 3, 2, Stage.DONE, "FAILED", "Error", "boom", 3,
                  outputs=[{"name": "o", "path": "/p", "uri": "blob://sha256/" + "0" * 64, "sha256": "0" * 64,
                            "size": 1}])
    att.acked = True
    back = Attempt.from_persisted(json.loads(json.dumps(att.persisted())))
    assert back.persisted() == att.persisted() and not back.acked and back.supervisor_ended
    u = back.update(now=10.0)
    assert u.phase == 10 and u.exit_code == 3 and u.outputs[0].size_bytes == 1 and u.time.seconds == 10


# -- backoff ---------------------------------------------------------------------------------------
def test_backoff_grows_with_jitter_up_to_the_cap_and_resets() -> None:
    b = Backoff(base=0.1, cap=10.0, rng=random.Random(7))
    delays = [b.next() for _ in range(12)]
    for n, d in enumerate(delays):
        ceiling = min(10.0, 0.1 * 2 ** n)
        assert ceiling / 2 <= d <= ceiling
    assert max(delays) <= 10.0 and delays[-1] >= 5.0
    b.reset()
    assert b.next() <= 0.1


# -- progress --------------------------------------------------------------------------------------
def test_progress_helper_writes_lines_the_tail_folds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODUS_PROGRESS", raising=False)
    assert progress.report(stage="x") is False  # outside an attempt: nothing happens
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("NODUS_PROGRESS", str(path))
    assert progress.report(stage="train", completed=1, total=10, metrics={"loss": 0.5, "acc": 1})
    tail = ProgressTail(path)
    assert tail.poll()
    progress.report(metrics={"loss": 0.25}, step=3, total_steps=100, tokens_per_second=99.5, gpu_memory_bytes=7)
    with open(path, "a") as f:
        f.write("not json\n[1, 2]\n{\"units\": {\"completed\": 4}}\n{\"stage\": \"ev")  # junk and a partial line
    assert tail.poll()
    m = tail.message("att")
    assert m is not None
    assert (m.stage, m.units_completed, m.units_total, dict(m.metrics)) == ("train", 4, 10, {"loss": "0.25", "acc": "1"})
    assert (m.step, m.total_steps, m.tokens_per_second, m.gpu_memory_bytes) == (3, 100, "99.5", 7)
    with open(path, "a") as f:
        f.write("al\"}\n")  # the partial line completes
    assert tail.poll() and tail.message("att").stage == "eval"  # type: ignore[union-attr]
    assert not tail.poll()
    with pytest.raises(TypeError):
        progress.report(epochs=3)


# -- files -----------------------------------------------------------------------------------------
def test_state_file_is_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2} and oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"], "no temp file is left behind"
    path.write_text('{"a": ')
    assert read_json(path) is None and read_json(tmp_path / "missing.json") is None


def test_archives_round_trip_and_refuse_escapes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.bin").write_bytes(os.urandom(5000))
    (src / "top.txt").write_text("top")
    os.symlink("top.txt", src / "link")
    digest, size = pack_dir(src, tmp_path / "a.tar.zst")
    assert (digest, size) == sha256_file(tmp_path / "a.tar.zst")
    unpack(tmp_path / "a.tar.zst", tmp_path / "out")
    assert (tmp_path / "out" / "d" / "f.bin").read_bytes() == (src / "d" / "f.bin").read_bytes()
    assert os.readlink(tmp_path / "out" / "link") == "top.txt"

    for evil in ("../escape.txt", "/etc/evil.txt"):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo(evil)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        bad = tmp_path / "bad.tar.zst"
        bad.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
        with pytest.raises(CheckpointError, match="refused member"):
            unpack(bad, tmp_path / "victim")
    assert not (tmp_path / "escape.txt").exists() and not Path("/etc/evil.txt").exists()


def test_layout_translates_contract_paths_and_names(tmp_path: Path) -> None:
    lay = L.AttemptLayout.of(tmp_path, "att-1")
    assert lay.translate("/nodus/outputs") == lay.outputs
    assert lay.translate("/nodus/state/model/x") == lay.state / "model" / "x"
    assert lay.translate("/srv/data") == Path("/srv/data") and lay.translate("rel") == lay.root / "rel"
    assert L.safe_name("att-1") == "att-1"
    assert L.safe_name("../../etc") != "../../etc" and "/" not in L.safe_name("a/b")
    assert blob_digest("blob://sha256/" + "ab" * 32) == "ab" * 32 and blob_digest("https://x") is None


def test_process_runtime_refuses_images_and_sets_the_gpu_mask(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path)
    with pytest.raises(Refused) as e:
        rt.check(agent_pb2.Assignment(attempt_id="x", command=["true"], image="busybox@sha256:" + "0" * 64))
    assert e.value.reason == "ImageUnsupported"
    with pytest.raises(Refused) as e:
        rt.check(agent_pb2.Assignment(attempt_id="x"))
    assert "no command" in str(e.value)
    lay = L.AttemptLayout.of(tmp_path, "x")
    env = attempt_env(agent_pb2.Assignment(attempt_id="x", gpu_indexes=[2, 3]), lay, {"PATH": "/bin", "SECRET": "no"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "SECRET" not in env and env["PATH"] == "/bin"
    assert attempt_env(agent_pb2.Assignment(attempt_id="x"), lay, {}, host_gpus=8)["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in attempt_env(agent_pb2.Assignment(attempt_id="x"), lay, {})


def test_a_supervisors_poke_names_its_attempt_so_the_agent_looks_at_that_one() -> None:
    """Each status write's datagram carries the attempt id: the agent's watch loop folds that attempt's
    status at once without reading every other attempt's files (bench/startup.py's indexes/s)."""
    import asyncio
    import socket

    from nodus.agent.notices import SupervisorNotices

    async def main() -> None:
        wake = asyncio.Event()
        notices = SupervisorNotices(f"\0nodus-test-notices-{os.getpid()}-{random.getrandbits(32):x}", wake)
        notices.open(0.5)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # as Supervisor._notify sends
                for attempt_id in ("att-a", "att-b", "att-a"):
                    s.sendto(attempt_id.encode(), notices.address)
            await asyncio.wait_for(wake.wait(), 10)
            await asyncio.sleep(0.05)  # the three datagrams read
            assert notices.take() == {"att-a", "att-b"}
            assert notices.take() == set()  # taken once
            wake.clear()
            notices.add("att-c")  # the agent's own "look at this one" (after a spawn)
            assert wake.is_set() and notices.take() == {"att-c"}
        finally:
            notices.close()

    asyncio.run(main())


def test_state_json_keeps_every_tombstone_as_ends_are_forgotten_and_read_back(tmp_path: Path) -> None:
    """The tombstones are encoded once per change of them (not on every write of state.json), and each
    forgotten end is in the file the next write makes: a restarted agent answers an assignment sent again
    with its end instead of running it twice."""
    from nodus.agent.clock import SystemClock
    from nodus.agent.table import AttemptTable, Volatile

    path = tmp_path / "state.json"
    table = AttemptTable(path, "node-a", SystemClock())
    for i in range(3):
        table.add(Attempt(f"att-{i}", phase=L.SUCCEEDED, reason="Completed", exit_code=0), Volatile())
    table.forget("att-0")
    table.persist()  # outside an event loop: written at once
    table.add(Attempt("att-9"), Volatile())
    table.persist()  # a write with the tombstones unchanged
    table.forget("att-1")
    table.persist()
    on_disk = read_json(path)
    assert [i for i, _ in on_disk["finished"]] == ["att-0", "att-1"]
    assert sorted(on_disk["attempts"]) == ["att-2", "att-9"]
    again = AttemptTable(path, "node-a", SystemClock())
    assert [a.id for a in again.read()] == ["att-2", "att-9"]
    again.add(Attempt("att-2", phase=L.FAILED), Volatile())
    again.forget("att-2")
    again.persist()
    assert [i for i, _ in read_json(path)["finished"]] == ["att-0", "att-1", "att-2"]
    assert read_json(path)["finished"][0][1]["phase"] == L.SUCCEEDED
