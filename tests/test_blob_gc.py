"""Nothing grows forever (issue 16 item 5): a Job deleted by its ttlSecondsAfterFinished takes its outputs'
blobs and its logs with it, blobs nothing references are collected after a grace period, a kill -9 of the
coordinator in the middle of a collection loses no blob a live object names, and a Job's status.storage
counts its logs. Real coordinator and agent; the blob store is the data dir's (DATA_DIR/blobs, DATA_DIR/logs)."""
from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path
from typing import Any

import pytest

from agent_double import restart_ports, wait_for
from conftest import Coordinator
from e2e import JOBS, attempts_of, create, settled, start_agent, status
from nodus.coordinator.blob_gc import decide_gc, digests_in

pytestmark = pytest.mark.timeout(300)

GC_FLAGS = ("--blob-gc-interval", "1s", "--blob-gc-grace", "2s")
WRITE_OUTPUT = ('import os; p = os.path.join(os.environ["NODUS_OUTPUTS_DIR"], "result.txt"); '
                'open(p, "w").write("result of %s\\n" % os.environ.get("NODUS_JOB_NAME", "?") * 50); '
                'print("line of log " * 40)')


def test_a_blob_is_deleted_only_after_it_stayed_unreferenced_for_the_grace() -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    first = decide_gc({a, b, c}, {a}, {"x", "y"}, {"x"}, {}, now=100.0, grace=10.0)
    assert first.delete_blobs == () and first.delete_logs == ()
    assert first.state == {"blobs": {b: 100.0, c: 100.0}, "logs": {"y": 100.0}}
    # b is referenced again (its upload was committed): dropped from the candidates; c's grace runs out.
    later = decide_gc({a, b, c}, {a, b}, {"x", "y"}, {"x"}, first.state, now=110.0, grace=10.0)
    assert later.delete_blobs == (c,) and later.delete_logs == ("y",)
    assert later.state == {"blobs": {}, "logs": {}}
    ref = f'{{"uri": "blob://sha256/{a}", "sha256": "{b}", "blob": "sha256:{c}", "uid": "{"d" * 63}"}}'
    assert digests_in(ref.encode()) == {a, b, c}


def _blob_path(c: Coordinator, digest: str) -> Path:
    return c.data_dir / "blobs" / "sha256" / digest[:2] / digest[2:]


def _output_digests(st: dict[str, Any]) -> list[str]:
    """Every committed output's blob: `result` and the outputs directory's archive."""
    return sorted(o["sha256"].removeprefix("sha256:") for o in st.get("outputs") or [])


def test_a_ttl_deletion_takes_the_jobs_outputs_and_logs_and_storage_counts_logs(tmp_path: Path) -> None:
    with Coordinator(tmp_path / "data").start(extra_args=GC_FLAGS) as c, start_agent(c, tmp_path / "agent"):
        outputs = [{"name": "result", "path": "/nodus/outputs/result.txt"}]
        create(c, "kept", command=["python3", "-c", WRITE_OUTPUT], outputs=outputs)
        create(c, "gone", command=["python3", "-c", WRITE_OUTPUT.replace("result of", "gone: result of")],
               outputs=outputs, ttlSecondsAfterFinished=3)
        kept = settled(c, "kept")
        assert kept["phase"] == "Succeeded", kept
        kept_digests = _output_digests(kept)
        assert len(kept_digests) == 2, kept
        (kept_attempt,) = attempts_of(c, "kept")
        kept_log = c.data_dir / "logs" / f"{kept_attempt['spec']['id']}.log"

        # The finished Job's storage counts its log once garbage collection measured it.
        def counted() -> dict[str, Any] | None:
            st = status(c, "kept")
            (a,) = attempts_of(c, "kept")
            log_bytes = int((a.get("status") or {}).get("logBytes") or 0)
            outputs = sum(int(o["size"]) for o in st.get("outputs") or [])
            return st if log_bytes > 0 and int((st.get("storage") or {}).get("bytes", 0)) == \
                outputs + log_bytes else None
        st = wait_for(counted, 30, interval=0.3, what="the kept Job's storage to count its log")
        assert kept_log.stat().st_size == int(attempts_of(c, "kept")[0]["status"]["logBytes"]), st

        gone = wait_for(lambda: (s := status(c, "gone")).get("phase") == "Succeeded" and s, 60, interval=0.2,
                        what="the TTL Job to finish")
        gone_digests = _output_digests(gone)
        assert len(gone_digests) == 2 and not set(gone_digests) & set(kept_digests), gone
        (gone_attempt,) = attempts_of(c, "gone")
        gone_log = c.data_dir / "logs" / f"{gone_attempt['spec']['id']}.log"
        assert all(_blob_path(c, d).exists() for d in gone_digests) and gone_log.exists()
        wait_for(lambda: c.session().get(c.url(f"{JOBS}/gone")).status_code
                 == 404, 60, interval=0.2, what="the TTL to delete the Job")
        wait_for(lambda: not any(_blob_path(c, d).exists() for d in gone_digests) and not gone_log.exists(), 60,
                 interval=0.3, what="the deleted Job's output blobs and log to be collected")
        # What the kept Job names stays, and still downloads intact.
        assert all(_blob_path(c, d).exists() for d in kept_digests) and kept_log.exists()
        got = c.session().get(c.url(f"{JOBS}/kept/outputs/result"))
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() in kept_digests


@pytest.mark.slow
def test_kill_9_during_collection_loses_no_referenced_blob(tmp_path: Path) -> None:
    data = tmp_path / "data"
    c = Coordinator(data)
    first = restart_ports(3)  # gRPC, its agent port, HTTP: the same three on every restart
    c.start(http_port=first + 2, grpc_port=first, extra_args=("--blob-gc-interval", "1h"))  # no collection yet
    pushed = []
    try:
        for i in range(12):  # sources a project pushed: referenced by their _sources records
            code = tmp_path / f"code-{i}"
            code.mkdir()
            (code / "main.py").write_text(f"print({i})\n" * (i + 1))
            out = c.run("nodus", "source", "push", str(code)).stdout
            pushed.append(next(w for w in out.split() if w.startswith("sha256:")).removeprefix("sha256:"))
        http, grpc = c.http.rsplit(":", 1)[1], str(c.grpc).rsplit(":", 1)[1]
    finally:
        c.stop()
    assert all(_blob_path(c, d).exists() for d in pushed)
    orphans = []
    rng = random.Random(7)
    for i in range(3000):  # blobs nothing names (as a deleted Job's outputs leave)
        body = f"orphan {i} {rng.random()}".encode()
        digest = hashlib.sha256(body).hexdigest()
        path = _blob_path(c, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        orphans.append(digest)

    kills = 0
    for delay in (1.2, 1.6, 2.0, 2.4, 2.8):  # each kill lands in a pass of the 1 s interval with a 1 s grace
        c.start(http_port=int(http), grpc_port=int(grpc), extra_args=("--blob-gc-interval", "1s",
                                                                       "--blob-gc-grace", "1s"))
        time.sleep(delay)
        c.kill()
        kills += 1
        missing = [d for d in pushed if not _blob_path(c, d).exists()]
        assert not missing, f"after kill {kills}: referenced blobs gone: {missing}"
    left = sum(_blob_path(c, d).exists() for d in orphans)
    c.start(http_port=int(http), grpc_port=int(grpc), extra_args=("--blob-gc-interval", "1s",
                                                                   "--blob-gc-grace", "1s"))
    try:
        wait_for(lambda: not any(_blob_path(c, d).exists() for d in orphans), 120, interval=0.5,
                 what="every orphan to be collected after the restarts")
        assert all(_blob_path(c, d).exists() for d in pushed)
    finally:
        c.stop()
    assert left < len(orphans), "no kill landed after a collection had started deleting"
