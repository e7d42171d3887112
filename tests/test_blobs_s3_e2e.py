"""`nodus-coordinator --blob-url s3://…` end to end: a real coordinator, two real agents and moto's S3
server. A Job checkpoints (through the agent's BlobService, into the bucket), is restored on the
other node after its agent is killed, commits an output, and its logs are read with `nodus logs`
(once finished, and followed while it runs): every byte of it lives in the bucket and none in the data
dir. A bucket that is not there stops the coordinator at start with a message naming --blob-url."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from agent_double import AgentProcess, wait_for
from conftest import BIN, Coordinator, job
from e2e import JOBS, MERGE, NS, attempts_of, following, joined, patch_state, suspend, units, wait_job
from motoserver import moto_server
from test_recovery_e2e import node_of, starts
from test_volume import tar_zst, unpack

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true"}
PREFIX = "nodus/prod"

# A counter that survives restarts through its state dir, with 3 MiB of random bytes beside it (so the
# checkpoint is more than a few bytes); every start records itself, the end writes the output.
COUNTER = r"""
import hashlib, json, os, signal, sys, time
from nodus import progress
state = os.environ["NODUS_STATE_DIR"]
path, blob = os.path.join(state, "counter"), os.path.join(state, "blob")
target = int(sys.argv[2])
if not os.path.exists(blob):
    with open(blob + ".tmp", "wb") as f:
        f.write(os.urandom(3 << 20))
    os.replace(blob + ".tmp", blob)
n = int(open(path).read()) if os.path.exists(path) else 0
digest = hashlib.sha256(open(blob, "rb").read()).hexdigest()
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"attempt": os.environ["NODUS_ATTEMPT_NUMBER"], "start": n, "blob": digest}) + "\n")
print("attempt", os.environ["NODUS_ATTEMPT_NUMBER"], "starts at", n, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while n < target:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    progress.report(stage="count", completed=n, total=target)
    print("count", n, flush=True)
    time.sleep(0.1)
with open(os.path.join(state, "result.txt"), "w") as f:
    f.write("reached %d from blob %s\n" % (n, digest))
print("reached", n, flush=True)
"""


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto"), AWS_ENV) as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator (a child of this process) finds its keys where boto3 looks: the environment."""
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def s3(moto: str) -> Any:
    return boto3.client("s3", endpoint_url=moto, region_name="us-east-1")


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"nodus-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def cluster(tmp_path: Path, moto: str, bucket: str) -> Iterator[tuple[Coordinator, dict[str, AgentProcess]]]:
    """A coordinator on the bucket (short node leases), and two real agents."""
    args = ("--blob-url", f"s3://{bucket}/{PREFIX}", "--blob-endpoint", moto,
            "--lease-duration", "2s", "--heartbeat-interval", "0.4s", "--retention-interval", "1s")
    with Coordinator(tmp_path / "data").start(extra_args=args) as c:
        with joined([AgentProcess(tmp_path / n, c.grpc, c.join_token, node=n).start()
                     for n in ("s3-node-a", "s3-node-b")], c) as started:
            yield c, {a.node: a for a in started}


def keys(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.update({o["Key"]: o["Size"] for o in page.get("Contents") or []})
    return found


def blob_key(sha256: str) -> str:
    return f"{PREFIX}/blobs/sha256/{sha256[:2]}/{sha256[2:]}"


def test_checkpoint_restore_after_agent_loss_output_and_logs_on_s3(
        cluster: tuple[Coordinator, dict[str, AgentProcess]], s3: Any, bucket: str, tmp_path: Path) -> None:
    c, agents = cluster
    marker = tmp_path / "starts"
    body = job("on-s3", command=[sys.executable, "-c", COUNTER, str(marker), "60"],
               outputs=[{"name": "result", "path": "/nodus/state/result.txt"}])
    assert c.session().post(c.url(JOBS), json=body).status_code == 201
    wait_job(c, "on-s3", lambda j: units(j) >= 8, what="the counter to pass 8")

    # Checkpoint 1 (a suspend), saved through the agent's BlobService: it is in the bucket.
    suspend(c, "on-s3")
    first = attempts_of(c, "on-s3")[0]
    committed = first["status"]["checkpoints"][-1]
    stored = keys(s3, bucket, f"{PREFIX}/blobs/sha256/")
    assert stored.get(blob_key(committed["sha256"])) == committed["size"] > 3 << 20, (committed, stored)
    data = s3.get_object(Bucket=bucket, Key=blob_key(committed["sha256"]))["Body"].read()
    assert hashlib.sha256(data).hexdigest() == committed["sha256"]
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "no upload is left open"

    # Resume (attempt 2 restores from the bucket), then its node dies with its work while a user follows.
    patch_state(c, "on-s3", "Running")
    wait_job(c, "on-s3", lambda j: (j["status"].get("checkpoint") or {}).get("restoredFromSeq") == 1
             and j["status"].get("phase") == "Running", what="attempt 2 to restore and run")
    wait_for(lambda: "2" in [r["attempt"] for r in starts(marker)], 30, what="attempt 2's program to start")
    with following(c, "on-s3", tmp_path / "followed.txt") as follower:
        wait_for(lambda: b"count" in (tmp_path / "followed.txt").read_bytes(), 30, what="the follower to print")
        lost = node_of(c, "on-s3", 2)
        victim = agents[lost]
        victim.proc.kill()
        victim.proc.wait()
        victim._kill_workloads()
        j = wait_job(c, "on-s3", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"), timeout=90,
                     what="the replacement to finish")
        follower.wait(60)
    assert j["status"]["phase"] == "Succeeded", j["status"]
    attempts = attempts_of(c, "on-s3")
    assert attempts[1]["status"]["phase"] == "Lost"
    assert attempts[2]["spec"]["node"] != lost and attempts[2]["status"]["restoredFromSeq"] == 1
    runs = starts(marker)
    assert [r["attempt"] for r in runs] == ["1", "2", "3"]
    assert runs[2]["start"] == runs[1]["start"] >= 8, runs  # both restored checkpoint 1 from the bucket
    assert runs[0]["blob"] == runs[1]["blob"] == runs[2]["blob"]  # 3 MiB, byte for byte

    # The output: committed into the bucket, and downloaded from it over REST.
    out = next(o for o in j["status"]["outputs"] if o["name"] == "result")
    r = c.session().get(c.url(f"{JOBS}/on-s3/outputs/result"))
    assert r.status_code == 200, r.text
    assert r.content == f"reached 60 from blob {runs[0]['blob']}\n".encode()
    assert hashlib.sha256(r.content).hexdigest() == out["sha256"]
    assert keys(s3, bucket, blob_key(out["sha256"])) == {blob_key(out["sha256"]): len(r.content)}

    # The logs: each attempt's in the bucket, read back with `nodus logs` (the latest, and attempt 1).
    last = c.run("nodus", "logs", "on-s3").stdout
    assert "attempt 3 starts at" in last and last.rstrip().endswith("reached 60"), last
    assert "count 60" in last and "count 1\n" not in last
    one = c.run("nodus", "logs", "on-s3", "--attempt", "1").stdout
    assert one.startswith("attempt 1 starts at 0\ncount 1\n") and "reached" not in one, one
    followed = (tmp_path / "followed.txt").read_text()
    assert followed.startswith("attempt 2 starts at") and "count" in followed, followed
    for a in (attempts[0], attempts[2]):
        log_keys = keys(s3, bucket, f"{PREFIX}/logs/{a['spec']['id']}/")
        assert f"{PREFIX}/logs/{a['spec']['id']}/eof" in log_keys, log_keys
    # ... and nothing of it in the data dir.
    assert [p for d in ("blobs", "logs") for p in (c.data_dir / d).rglob("*") if p.is_file()] == []

    # Retention ends: the sweep deletes the checkpoints from the bucket.
    ckpts = {blob_key(k["sha256"]) for a in attempts for k in a["status"].get("checkpoints") or []}
    assert ckpts and ckpts <= set(keys(s3, bucket, f"{PREFIX}/blobs/"))
    r = c.session().patch(c.url(f"{JOBS}/on-s3"), headers=MERGE,
                          data=json.dumps({"spec": {"recovery": {"checkpoint": {"retainAfterFinish": "0s"}}}}))
    assert r.status_code == 200, r.text
    wait_for(lambda: not ckpts & set(keys(s3, bucket, f"{PREFIX}/blobs/")), 30, interval=0.2,
             what="the bucket to lose the Job's checkpoints")
    assert blob_key(out["sha256"]) in keys(s3, bucket, f"{PREFIX}/blobs/"), "the output stays"


def test_volume_revisions_are_pushed_to_and_served_from_the_bucket(tmp_path: Path, moto: str, s3: Any,
                                                                    bucket: str) -> None:
    args = ("--blob-url", f"s3://{bucket}/{PREFIX}", "--blob-endpoint", moto)
    with Coordinator(tmp_path / "data").start(extra_args=args) as c:
        def push(body: bytes, **headers: str) -> Any:
            return c.session().post(c.url(f"{NS}/volumes/corpus/revisions"), data=body,
                                    headers={"Content-Type": "application/zstd", **headers})
        files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(1 << 20)}
        archive = tar_zst(files)
        r = push(archive, **{"X-Content-SHA256": hashlib.sha256(archive).hexdigest()})
        assert r.status_code == 201, r.text
        assert r.json()["files"] == 2 and r.json()["sha256"] == hashlib.sha256(archive).hexdigest(), r.json()
        assert blob_key(r.json()["sha256"]) in keys(s3, bucket, f"{PREFIX}/blobs/sha256/")
        got = c.session().get(c.url(f"{NS}/volumes/corpus/revisions/latest"))
        assert got.status_code == 200 and got.content == archive and unpack(got.content) == files
        ranged = c.session().get(c.url(f"{NS}/volumes/corpus/revisions/1"), headers={"Range": "bytes=4-9"})
        assert ranged.status_code == 206 and ranged.content == archive[4:10]

        before = keys(s3, bucket, f"{PREFIX}/blobs/")
        garbage = push(b"this is not an archive")
        assert garbage.status_code == 400 and "not a tar.zst archive" in garbage.json()["message"]
        escape = push(tar_zst({"../outside.txt": b"x"}))
        assert escape.status_code == 400 and "leaves the volume" in escape.json()["message"]
        wrong = push(tar_zst({"ok.txt": b"fine"}), **{"X-Content-SHA256": "0" * 64})
        assert wrong.status_code == 422 and wrong.json()["reason"] == "DigestMismatch"
        assert keys(s3, bucket, f"{PREFIX}/blobs/") == before, "nothing refused is kept in the bucket"
        assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
        assert [p for p in (c.data_dir / "blobs-spool").rglob("*") if p.is_file()] == [], "the spool is emptied"


def test_a_missing_bucket_or_a_bad_url_stops_the_coordinator(moto: str, tmp_path: Path) -> None:
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "nodus-coordinator"), "--data-dir", str(tmp_path / "data"),
                               "--http-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", *args],
                              capture_output=True, text=True, timeout=60, env={**os.environ})

    missing = start("--blob-url", "s3://no-such-nodus-bucket/x", "--blob-endpoint", moto)
    assert missing.returncode != 0
    assert "--blob-url s3://no-such-nodus-bucket/x/: the bucket does not exist" in missing.stderr, missing.stderr
    assert "aws s3 mb" in missing.stderr
    bad = start("--blob-url", "s3://Not_A_Bucket")
    assert bad.returncode != 0 and "is not an s3://BUCKET[/PREFIX] URL" in bad.stderr, bad.stderr
    assert not (tmp_path / "data" / "endpoints.json").exists(), "it never served"
