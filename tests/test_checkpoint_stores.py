"""The local store: listing, latest, retention, deletion, garbage; a full disk during a save; and kill -9
of a saving process at random moments (what must not be lost: the latest committed checkpoint, which
always restores and verifies; what must never happen: a torn upload listed as a checkpoint)."""
from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from nodus.checkpoint import AlreadyCommitted, LocalStore, NoSpace, NotFound, find_trainer_checkpoint

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _state(base: Path, text: str) -> Path:
    (base / "state").mkdir(parents=True, exist_ok=True)
    (base / "state" / "f").write_text(text)
    return base / "state"


def test_list_latest_get_delete(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    assert store.list() == [] and store.latest() is None
    with pytest.raises(NotFound, match="no committed checkpoint"):
        store.get()
    for i in range(1, 4):
        _state(tmp_path, f"v{i}")
        assert store.save(["state"], root=tmp_path, attempt=f"a{i}", epoch=i).seq == i
    assert [m.seq for m in store.list()] == [1, 2, 3]
    assert store.latest().seq == 3 and store.get(2).attempt == "a2" and store.get(2).epoch == 2
    store.restore(tmp_path / "r2", seq=2)
    assert (tmp_path / "r2" / "state" / "f").read_text() == "v2"
    store.delete(3)
    assert store.latest().seq == 2
    assert store.save(["state"], root=tmp_path).seq == 3  # seqs continue from the latest committed
    with pytest.raises(NotFound):
        store.get(9)


def test_a_committed_seq_is_never_overwritten(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _state(tmp_path, "first")
    store.save(["state"], root=tmp_path, seq=5)
    _state(tmp_path, "second")
    with pytest.raises(AlreadyCommitted):
        store.save(["state"], root=tmp_path, seq=5)
    store.restore(tmp_path / "r")
    assert (tmp_path / "r" / "state" / "f").read_text() == "first"
    assert len(list((tmp_path / "store").glob("*.tar.zst"))) == 1  # the loser's archive is gone


def test_prune_and_retain_after_finish(tmp_path: Path) -> None:
    clock = Clock()
    store = LocalStore(tmp_path / "store", clock=clock)
    for _ in range(3):
        store.save([_state(tmp_path, "x")])
        clock.now += timedelta(hours=1)
    # now T0+3h; checkpoints at T0, T0+1h, T0+2h
    assert store.prune(older_than=timedelta(minutes=90)) == [1, 2]
    assert [m.seq for m in store.list()] == [3]
    clock.now += timedelta(days=30)
    assert store.prune(older_than=timedelta(hours=1)) == []  # the latest survives pruning
    finished = T0 + timedelta(hours=3)
    clock.now = finished + timedelta(hours=167)
    assert store.expire(finished_at=finished, retain_after_finish=timedelta(hours=168)) == []
    clock.now = finished + timedelta(hours=168)
    assert store.expire(finished_at=finished, retain_after_finish=timedelta(hours=168)) == [3]
    assert store.list() == [] and os.listdir(tmp_path / "store") == []


def test_purge_leaves_nothing_of_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.save([_state(tmp_path, "one")], root=tmp_path)
    store.save([_state(tmp_path, "two")], root=tmp_path)
    (tmp_path / "store" / ".tmp-0000000003-abc.tar.zst").write_bytes(b"torn")
    assert store.purge() == [1, 2]
    assert os.listdir(tmp_path / "store") == [] and store.list() == []


def test_garbage_of_torn_saves_is_never_listed_and_is_collected(tmp_path: Path) -> None:
    clock = Clock()
    store = LocalStore(tmp_path / "store", clock=clock)
    m = store.save([_state(tmp_path, "x")])
    root = tmp_path / "store"
    (root / ".tmp-0000000002-abcdef.tar.zst").write_bytes(b"half an archive")
    (root / "0000000002-0123456789ab.tar.zst").write_bytes(b"an archive whose manifest never came")
    (root / ".tmp-0000000002-abcdef.manifest.json").write_bytes(b'{"seq": 2, "tor')
    assert [x.seq for x in store.list()] == [1] and store.latest().seq == 1
    assert store.collect_garbage(grace=timedelta(hours=1)) == []  # younger than the grace: maybe in flight
    clock.now = datetime.now(timezone.utc) + timedelta(hours=2)
    assert len(store.collect_garbage(grace=timedelta(hours=1))) == 3
    assert sorted(os.listdir(root)) == sorted([m.archive, "0000000001.manifest.json"])


def test_full_disk_during_save(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs to fill (needs root and CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        store = LocalStore(disk / "store")
        state = _state(tmp_path, "small and precious")
        first = store.save([state])
        (state / "big").write_bytes(os.urandom(4 << 20))
        with pytest.raises(NoSpace, match="no space left on device") as e:
            store.save([state])
        assert "earlier checkpoints are intact" in str(e.value)
        assert store.latest() == first and [m.seq for m in store.list()] == [1]
        assert not [n for n in os.listdir(disk / "store") if n.startswith(".tmp-")]  # the torn file is gone
        (state / "big").unlink()
        store.restore(tmp_path / "r")
        assert (tmp_path / "r" / str(state).lstrip("/") / "f").read_text() == "small and precious"
        store.verify()
        # and the store works again once there is room
        assert store.save([state]).seq == 2
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# -- kill -9 at random moments --------------------------------------------------------------------

SAVER = r"""
import hashlib, os, random, sys
from nodus.checkpoint import LocalStore
store, state, seed = LocalStore(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
while True:
    latest = store.latest()
    seq = (latest.seq if latest else 0) + 1
    blob = rng.randbytes(rng.randint(1, 2 << 20)) + bytes(rng.randint(0, 1 << 20))
    with open(os.path.join(state, "blob"), "wb") as f:
        f.write(blob)
    with open(os.path.join(state, "seq"), "w") as f:
        f.write(f"{seq} {hashlib.sha256(blob).hexdigest()}")
    store.save([state], seq=seq, level=1)
    print(seq, flush=True)
"""


@pytest.mark.slow
def test_kill_9_while_saving_never_loses_the_latest(tmp_path: Path) -> None:
    trials, seed = 50, int(os.environ.get("NODUS_KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    store_dir, state = tmp_path / "store", tmp_path / "state"
    state.mkdir()
    store = LocalStore(store_dir)
    committed_before = 0
    torn_seen = 0
    started = time.monotonic()
    for trial in range(trials):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(store_dir), str(state), str(seed + trial)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()  # one commit in this trial, then kill at a random moment of the next ones
        time.sleep(rng.uniform(0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        where = f"(trial {trial}, seed {seed})"

        manifests = store.list()
        assert manifests, where
        latest = manifests[-1]
        assert latest.seq > committed_before, where
        for m in manifests:
            if m.seq > committed_before:
                store.verify(m.seq)  # every listed checkpoint is whole: a torn upload is never listed
        into = tmp_path / f"restore-{trial}"
        store.restore(into)
        restored = into / str(state).lstrip("/")
        seq_text, digest = (restored / "seq").read_text().split()
        assert int(seq_text) == latest.seq, where
        assert hashlib.sha256((restored / "blob").read_bytes()).hexdigest() == digest, where
        committed_before = latest.seq

        torn_seen += sum(1 for n in os.listdir(store_dir) if n.startswith(".tmp-"))
        store.prune(older_than=timedelta(0))  # keep the store small: only the latest stays
        store.collect_garbage(grace=timedelta(0))
        for p in tmp_path.glob(f"restore-{trial}"):
            subprocess.run(["rm", "-rf", str(p)], check=True)
    elapsed = time.monotonic() - started  # printed, not asserted (a duration)
    print(f"{trials} kills, {committed_before} checkpoints committed, {torn_seen} torn leftovers collected, "
          f"{elapsed:.1f}s, seed {seed}")


# -- HFTrainer integration ------------------------------------------------------------------------

def _trainer_ckpt(base: Path, step: int, *, state: str | None = '{"global_step": %d}', weights: str = "single",
                  shards_present: bool = True) -> Path:
    d = base / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if weights == "single":
        (d / "model.safetensors").write_bytes(b"w" * 64)
    elif weights == "sharded":
        shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        (d / "model.safetensors.index.json").write_text(
            '{"metadata": {}, "weight_map": {"a": "%s", "b": "%s"}}' % tuple(shards))
        for s in shards[: 2 if shards_present else 1]:
            (d / s).write_bytes(b"w" * 64)
    elif weights == "peft":
        (d / "adapter_model.safetensors").write_bytes(b"w" * 64)
    (d / "optimizer.pt").write_bytes(b"o")
    if state is not None:
        (d / "trainer_state.json").write_text(state % step if "%d" in state else state)
    return d


def test_newest_complete_trainer_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "state" / "runs" / "out"
    assert find_trainer_checkpoint(tmp_path / "state") is None
    _trainer_ckpt(out, 100)
    best = _trainer_ckpt(out, 250, weights="sharded")
    _trainer_ckpt(out, 300, state='{"global_step": 3')  # killed while writing trainer_state.json
    _trainer_ckpt(out, 400, state=None)  # killed before trainer_state.json
    _trainer_ckpt(out, 500, weights="sharded", shards_present=False)  # a shard never written
    _trainer_ckpt(out, 600, weights="none")
    (out / "checkpoint-700-tmp").mkdir()
    found = find_trainer_checkpoint(tmp_path / "state")
    assert found is not None and found.step == 250 and found.path == str(best)
    peft = _trainer_ckpt(out, 900, weights="peft")
    assert find_trainer_checkpoint(tmp_path / "state").path == str(peft)
