"""Checkpoints in a Job's S3 Connection, end to end: a real coordinator and agent, moto's S3 server.

What must hold: the checkpoint lands in the Connection's bucket (multipart, the manifest last) and the
Job records an s3:// uri; a suspend then resume restores it from S3 with nothing lost; a Connection
whose Secret is missing fails the attempt with a reason that says so; and the keys never appear in
the coordinator's or the agent's log, nor in any object the API returns."""
from __future__ import annotations

import hashlib
import json
import secrets
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest

from conftest import Coordinator, job
from e2e import (ATTEMPTS, JOBS, MERGE, NS, attempts_of, create, patch_state, start_agent, suspend,
                 units, wait_job)
from motoserver import moto_server
from agent_double import AgentProcess, wait_for
from test_recovery_e2e import starts

REGION = "eu-west-1"

# The recovery counter, plus 20 MiB of random bytes in the state dir (so the archive is uploaded in
# several 8 MiB parts); every start records the count and the digest of the bytes it found.
COUNTER = r"""
import hashlib, json, os, signal, sys, time
from nodus import progress
state = os.environ["NODUS_STATE_DIR"]
path, blob = os.path.join(state, "counter"), os.path.join(state, "blob")
target = int(sys.argv[2])
if not os.path.exists(blob):
    with open(blob + ".tmp", "wb") as f:
        f.write(os.urandom(20 << 20))
    os.replace(blob + ".tmp", blob)
n = int(open(path).read()) if os.path.exists(path) else 0
digest = hashlib.sha256(open(blob, "rb").read()).hexdigest()
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"attempt": os.environ["NODUS_ATTEMPT_NUMBER"], "start": n, "blob": digest}) + "\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while n < target:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    progress.report(stage="count", completed=n, total=target)
    time.sleep(0.1)
print("reached", n, flush=True)
"""


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture
def keys() -> dict[str, str]:
    """Distinctive keys, so that a leak is found by a plain search of the logs."""
    return {"accessKeyId": "AKIA" + secrets.token_hex(8).upper(), "secretAccessKey": "sk-NODUS-TEST-SECRET-" + secrets.token_hex(20),
            "sessionToken": "st-NODUS-TEST-SECRET-" + secrets.token_hex(24)}


@pytest.fixture
def s3(moto: str, keys: dict[str, str]) -> Any:
    return boto3.client("s3", endpoint_url=moto, region_name=REGION, aws_access_key_id=keys["accessKeyId"],
                        aws_secret_access_key=keys["secretAccessKey"], aws_session_token=keys["sessionToken"])


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    return name


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    """No free storage inclusion, so billedBytes shows every byte Nodus holds; a sweep every second,
    so retention plays out while the test watches."""
    with Coordinator(tmp_path / "data").start(extra_args=("--free-storage", "0", "--retention-interval", "1s")) as c:
        yield c


@pytest.fixture
def agent(coordinator: Coordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentProcess]:
    # No AWS keys anywhere the agent could find them: what reaches the bucket came from the Connection.
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
              "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with start_agent(coordinator, tmp_path / "agent", "s3-node") as a:
        yield a


def post_object(c: Coordinator, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    r = c.session().post(c.url(f"{NS}/{plural}"), json=body)
    assert r.status_code == 201, r.text
    return r.json()


def secret(c: Coordinator, name: str, values: dict[str, str]) -> None:
    post_object(c, "secrets", {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": name},
                          "stringData": values})


def connection(c: Coordinator, name: str, **s3: str) -> dict[str, Any]:
    return post_object(c, "connections", {"apiVersion": "nodus.dev/v1", "kind": "Connection",
                                          "metadata": {"name": name}, "spec": {"type": "S3", "s3": s3}})


def assert_no_leak(keys: dict[str, str], *texts: str) -> None:
    for what, value in keys.items():
        for i, text in enumerate(texts):
            assert value not in text, f"{what} appears in text {i}"


def test_checkpoints_go_to_the_connection_and_resume_restores_from_s3(
        coordinator: Coordinator, agent: AgentProcess, moto: str, s3: Any, bucket: str, keys: dict[str, str],
        tmp_path: Path) -> None:
    secret(coordinator, "s3-keys", keys)
    connection(coordinator, "ckpt", bucket=bucket, endpoint=moto, region=REGION, prefix="nodus/ckpt",
               secret="s3-keys")
    marker = tmp_path / "starts"
    body = job("count", command=[sys.executable, "-c", COUNTER, str(marker), "80"], connections=["ckpt"])
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_job(coordinator, "count", lambda j: units(j) >= 8, what="the counter to pass 8")

    j = suspend(coordinator, "count")
    first = attempts_of(coordinator, "count")[0]
    assert first["status"]["reason"] == "Suspended", first["status"]
    committed = first["status"]["checkpoints"][-1]
    prefix = f"nodus/ckpt/default/count/0/{first['spec']['id']}/"
    assert committed["uri"] == f"s3://{bucket}/{prefix}{committed['seq']:010d}.manifest.json", committed
    assert j["status"]["checkpoint"]["seq"] >= 1 and j["status"]["checkpoint"]["seq"] == committed["seq"]

    # In the bucket: the archive (multipart: several 8 MiB parts), then its manifest, and no upload left open.
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}{committed['seq']:010d}.manifest.json")
                          ["Body"].read())
    assert manifest["sha256"] == committed["sha256"] and manifest["size"] == committed["size"]
    assert manifest["attempt"] == first["spec"]["id"]
    archive = listed[prefix + manifest["archive"]]
    assert archive["Size"] == committed["size"] > 16 << 20
    assert "-" in s3.head_object(Bucket=bucket, Key=prefix + manifest["archive"])["ETag"]  # a multipart ETag
    data = s3.get_object(Bucket=bucket, Key=prefix + manifest["archive"])["Body"].read()
    assert hashlib.sha256(data).hexdigest() == committed["sha256"]
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    suspended_at = units(j)

    patch_state(coordinator, "count", "Running")
    j = wait_job(coordinator, "count", lambda j: j["status"].get("phase") in ("Succeeded", "Failed"),
                 timeout=120, what="the resumed Job to finish")
    assert j["status"]["phase"] == "Succeeded", j["status"]
    assert j["status"]["checkpoint"]["restoredFromSeq"] == committed["seq"]
    runs = starts(marker)
    assert [r["attempt"] for r in runs] == ["1", "2"]
    assert 8 <= runs[1]["start"] <= suspended_at, runs
    assert runs[1]["blob"] == runs[0]["blob"]  # 20 MiB restored from the bucket, byte for byte

    # The bucket is the customer's: its checkpoints count as the Job's bytes, never as billed ones.
    records = [c for a in attempts_of(coordinator, "count") for c in a["status"].get("checkpoints") or []]
    assert records and all(c["connection"] == "ckpt" for c in records), records
    assert j["status"]["storage"] == {"bytes": sum(c["size"] for c in records), "billedBytes": 0}, j["status"]
    job_prefix = "nodus/ckpt/default/count/"
    assert s3.list_objects_v2(Bucket=bucket, Prefix=job_prefix).get("KeyCount")

    # The CLI lists them where they are, and sends whoever asks Nodus for the bytes to the bucket.
    listed = coordinator.run("nodus", "checkpoint", "ls", "--job", "count").stdout
    assert f"s3://{bucket}/{prefix}" in listed, listed
    refused = coordinator.run("nodus", "checkpoint", "get", "count", "-o", str(tmp_path / "x"), check=False)
    assert refused.returncode == 1 and "is in the Connection's bucket" in refused.stderr, refused.stderr
    assert f"nodus checkpoint restore s3://{bucket}/{prefix.rstrip('/')} --seq" in refused.stderr

    # Retention ends: the sweep deletes them from the bucket with the Connection's keys, then the records.
    r = coordinator.session().patch(coordinator.url(f"{JOBS}/count"), headers=MERGE,
                                    data=json.dumps({"spec": {"recovery": {"checkpoint": {"retainAfterFinish": "0s"}}}}))
    assert r.status_code == 200, r.text
    wait_for(lambda: not s3.list_objects_v2(Bucket=bucket, Prefix=job_prefix).get("KeyCount"), 30, interval=0.2,
             what="the bucket to lose the Job's checkpoints")
    j = wait_job(coordinator, "count", lambda j: "storage" not in j["status"], what="status.storage to go")
    assert "checkpoint" not in j["status"], j["status"]
    # The sweep deletes the archives, then drops the Attempts' records one write each; the Job's status follows
    # the same clock on its own, so it may be ahead of the last record's write.
    wait_for(lambda: not [c for a in attempts_of(coordinator, "count") for c in a["status"].get("checkpoints") or []],
             30, interval=0.2, what="the Attempts' checkpoint records to go")

    # The keys: in no log, and in nothing the API returns (Attempts, the Job, the Connection).
    listed_api = [coordinator.session().get(coordinator.url(p)).text
                  for p in (ATTEMPTS, JOBS, f"{NS}/connections", f"{NS}/secrets")]
    assert_no_leak(keys, coordinator.log.read_text(errors="replace"), agent.log_path.read_text(errors="replace"),
                   *listed_api)
    agent_dir = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "agent").rglob("*")
                          if p.is_file() and p.stat().st_size < 1 << 20)
    assert_no_leak(keys, agent_dir)


def test_a_missing_secret_fails_the_attempt_with_the_reason(coordinator: Coordinator, agent: AgentProcess,
                                                            bucket: str, moto: str) -> None:
    connection(coordinator, "no-keys", bucket=bucket, endpoint=moto, secret="missing-keys")
    body = job("orphan", command=[sys.executable, "-c", "print('hi')"], connections=["no-keys"], backoffLimit=0)
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    failed = wait_for(lambda: next((a for a in attempts_of(coordinator, "orphan")
                                    if a["status"].get("phase") == "Failed"), None), 30, interval=0.1,
                      what="the attempt to fail")
    assert failed["status"]["reason"] == "InvalidAssignment"
    message = failed["status"]["message"]
    assert 'Secret "missing-keys" (spec.s3.secret of Connection "no-keys") does not exist' in message, message
    assert "accessKeyId and secretAccessKey" in message  # the fix says what the Secret must hold
    wait_job(coordinator, "orphan", lambda j: j["status"].get("phase") == "Failed", what="the Job to fail")


def test_a_missing_connection_fails_the_attempt_with_the_reason(coordinator: Coordinator,
                                                                agent: AgentProcess) -> None:
    body = job("early", command=[sys.executable, "-c", "print('hi')"], connections=["later"], backoffLimit=0)
    r = coordinator.session().post(coordinator.url(JOBS), json=body)
    assert r.status_code == 201, r.text  # admitted: the Connection may be created after the Job (ADR 0014)
    failed = wait_for(lambda: next((a for a in attempts_of(coordinator, "early")
                                    if a["status"].get("phase") == "Failed"), None), 30, interval=0.1,
                      what="the attempt to fail")
    assert 'Connection "later" (named in spec.connections of Job "early") does not exist' in \
        failed["status"]["message"], failed["status"]


def test_after_an_agent_restart_the_checkpoint_still_goes_to_the_connection(
        coordinator: Coordinator, agent: AgentProcess, moto: str, bucket: str, keys: dict[str, str],
        tmp_path: Path) -> None:
    """The keys live in the agent's memory only: a restarted agent takes them again from the FullState's
    assignment of the attempt it re-adopts, so the suspend's checkpoint lands in the bucket."""
    secret(coordinator, "s3-keys", keys)
    connection(coordinator, "ckpt", bucket=bucket, endpoint=moto, region=REGION, secret="s3-keys")
    marker = tmp_path / "starts"
    body = job("survivor", command=[sys.executable, "-c", COUNTER, str(marker), "3000"], connections=["ckpt"])
    assert coordinator.session().post(coordinator.url(JOBS), json=body).status_code == 201
    wait_job(coordinator, "survivor", lambda j: units(j) >= 3, what="the counter to start")
    assert agent.stop()
    agent.start()
    wait_for(lambda: "re-adopted attempt" in agent.log_path.read_text(errors="replace"), 20, what="the re-adoption")
    patch_state(coordinator, "survivor", "Suspended")
    j = wait_job(coordinator, "survivor", lambda j: (j["status"].get("checkpoint") or {}).get("seq", 0) >= 1
                 or j["status"].get("suspendFailures"), timeout=60, what="the suspend's checkpoint")
    assert not j["status"].get("suspendFailures"), j["status"]
    first = attempts_of(coordinator, "survivor")[0]
    uris = [c["uri"] for c in first["status"].get("checkpoints") or []]
    assert uris and all(u.startswith("s3://") for u in uris), first["status"]
    assert j["status"]["checkpoint"]["seq"] >= 1
    patch_state(coordinator, "survivor", "Cancelled")


def test_a_connection_changed_while_the_job_runs_reaches_its_next_checkpoint(
        coordinator: Coordinator, agent: AgentProcess, moto: str, bucket: str, keys: dict[str, str],
        tmp_path: Path) -> None:
    """Every checkpoint request carries the store as the Connection and its Secret are at that moment
    (rotated keys, a moved endpoint): the attempt was assigned an endpoint where nothing listens, the
    Connection is corrected while it runs, and the suspend's checkpoint lands in the bucket."""
    secret(coordinator, "s3-keys", keys)
    connection(coordinator, "ckpt", bucket=bucket, endpoint="http://127.0.0.1:9", region=REGION, secret="s3-keys")
    marker = tmp_path / "starts"
    create(coordinator, "moved", command=[sys.executable, "-c", COUNTER, str(marker), "3000"], connections=["ckpt"])
    wait_job(coordinator, "moved", lambda j: units(j) >= 3, what="the counter to start")
    r = coordinator.session().patch(coordinator.url(f"{NS}/connections/ckpt"), headers=MERGE,
                                    data=json.dumps({"spec": {"s3": {"endpoint": moto}}}))
    assert r.status_code == 200, r.text
    patch_state(coordinator, "moved", "Suspended")
    j = wait_job(coordinator, "moved", lambda j: (j["status"].get("checkpoint") or {}).get("seq", 0) >= 1
                 or j["status"].get("suspendFailures"), timeout=90, what="the suspend's checkpoint")
    assert not j["status"].get("suspendFailures"), j["status"]
    [record] = attempts_of(coordinator, "moved")[0]["status"]["checkpoints"]
    assert record["uri"].startswith(f"s3://{bucket}/"), record
    patch_state(coordinator, "moved", "Cancelled")


def test_a_reconnect_does_not_fail_a_running_attempt_whose_secret_is_gone(
        coordinator: Coordinator, agent: AgentProcess, moto: str, bucket: str, keys: dict[str, str],
        tmp_path: Path) -> None:
    """FullState after an agent restart assigns every running attempt again; a Secret deleted meanwhile
    fails only new assignments, never an attempt that is already running."""
    secret(coordinator, "s3-keys", keys)
    connection(coordinator, "ckpt", bucket=bucket, endpoint=moto, region=REGION, secret="s3-keys")
    create(coordinator, "steady", command=[sys.executable, "-c", COUNTER, str(tmp_path / "starts"), "3000"],
           connections=["ckpt"])
    wait_job(coordinator, "steady", lambda j: units(j) >= 3, what="the counter to start")
    r = coordinator.session().delete(coordinator.url(f"{NS}/secrets/s3-keys"))
    assert r.status_code == 200, r.text
    assert agent.stop()
    agent.start()
    wait_for(lambda: "epoch 2" in agent.log_path.read_text(errors="replace"), 20, what="the agent to register again")
    before = units(wait_job(coordinator, "steady", lambda j: True))
    # Its FullState came with the registration: the program is still counting, as the same attempt.
    wait_job(coordinator, "steady", lambda j: units(j) > before + 5, timeout=30, what="the counter to go on")
    [running] = attempts_of(coordinator, "steady")
    assert running["status"]["phase"] == "Running", running["status"]
    patch_state(coordinator, "steady", "Cancelled")


def _snapshot(tmp_path: Path, seq: int, text: str) -> Any:
    from nodus.agent.checkpointing import Snapshot
    from nodus.checkpoint import save_file

    staging = tmp_path / f"staging-{uuid.uuid4().hex[:8]}"
    (staging / "nodus" / "state").mkdir(parents=True)
    (staging / "nodus" / "state" / "f").write_text(text)
    out = tmp_path / f"{staging.name}.tar.zst"
    m = save_file(["nodus/state"], out, root=staging)
    return Snapshot(seq, out, m.sha256, m.size, ("/nodus/state",), 0.0, "none", m.files, m.unpacked_size, m.level)


def test_the_agents_s3_upload_keeps_a_seq_and_its_restore_refuses_what_does_not_match(
        moto: str, s3: Any, bucket: str, keys: dict[str, str], tmp_path: Path) -> None:
    """The agent's two S3 steps without the daemons: a seq is committed once (the same attempt asked
    again gets the committed one back; another writer is refused), and a restore refuses a manifest
    whose digest is not the recorded one and an archive whose bytes are not the manifest's."""
    from nodus.agent.checkpointing import CheckpointFailed, fetch_s3, restore, s3_store, upload_s3
    from nodus.agent.layout import AttemptLayout

    credentials = {**keys, "endpoint": moto, "region": REGION}
    store = s3_store(f"s3://{bucket}/t/p/j/0/att-1/", credentials)
    uri, first = upload_s3(store, _snapshot(tmp_path, 1, "one"), attempt="att-1", epoch=0, format="Snapshot")
    assert uri == f"s3://{bucket}/t/p/j/0/att-1/0000000001.manifest.json"
    assert (first.unpacked_size, first.files) == (3, 1), "the manifest says what the archive holds"
    again_uri, again = upload_s3(store, _snapshot(tmp_path, 1, "other"), attempt="att-1", epoch=0, format="Snapshot")
    assert (again_uri, again.sha256) == (uri, first.sha256)  # the committed seq is kept, the new archive dropped
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="t/p/j/0/att-1/")["Contents"]]
    assert len(stored) == 2 and sum(k.endswith(".tar.zst") for k in stored) == 1, stored
    with pytest.raises(CheckpointFailed, match="was committed by attempt att-1, not att-2"):
        upload_s3(store, _snapshot(tmp_path, 1, "third"), attempt="att-2", epoch=0, format="Snapshot")

    layout = AttemptLayout(tmp_path / "attempt")
    layout.run.mkdir(parents=True)
    dest = layout.run / "restore.tar.zst"
    fetch_s3(uri, credentials, first.sha256, dest)
    restore(layout, dest, first.sha256, first.size)
    assert (layout.state / "f").read_text() == "one"

    with pytest.raises(CheckpointFailed, match="not the recorded"):
        fetch_s3(uri, credentials, "0" * 64, dest)
    s3.put_object(Bucket=bucket, Key=f"t/p/j/0/att-1/{first.archive}", Body=b"not the archive")
    fetch_s3(uri, credentials, first.sha256, dest)
    with pytest.raises(CheckpointFailed, match="DigestMismatch"):
        restore(layout, dest, first.sha256, first.size)
    assert (layout.state / "f").read_text() == "one"  # nothing was extracted over the state


def test_retention_deletes_one_seq_or_an_attempts_whole_prefix_with_the_connections_keys(
        moto: str, s3: Any, bucket: str, keys: dict[str, str], tmp_path: Path) -> None:
    """The coordinator's S3 deletion (coordinator/checkpoints.py delete_s3) against the bucket: a
    superseded seq loses its manifest and archive and nothing else; deleting it again is a no-op; a
    released attempt's prefix is emptied, torn uploads included, and another attempt's is not."""
    from nodus.agent.checkpointing import s3_store, upload_s3
    from nodus.coordinator.checkpoints import delete_s3
    from nodus.coordinator.controllers.checkpoints import S3Archive

    fields = {**keys, "endpoint": moto, "region": REGION}
    prefix, other = f"s3://{bucket}/r/p/j/0/att-1/", f"s3://{bucket}/r/p/j/0/att-2/"
    for seq in (1, 2, 3):
        upload_s3(s3_store(prefix, fields), _snapshot(tmp_path, seq, f"s{seq}"), attempt="att-1", epoch=0,
                  format="Snapshot")
    upload_s3(s3_store(other, fields), _snapshot(tmp_path, 1, "o"), attempt="att-2", epoch=0, format="Snapshot")
    s3.create_multipart_upload(Bucket=bucket, Key="r/p/j/0/att-1/0000000004-torn.tar.zst")

    def keys_under(p: str) -> list[str]:
        return sorted(o["Key"].rsplit("/", 1)[1] for o in s3.list_objects_v2(Bucket=bucket, Prefix=p).get("Contents", []))

    delete_s3(S3Archive("p", "ckpt", prefix, 2), fields)
    left = keys_under("r/p/j/0/att-1/")
    assert not [k for k in left if k.startswith("0000000002")] and len(left) == 4, left
    delete_s3(S3Archive("p", "ckpt", prefix, 2), fields)  # already gone: nothing to do, no error

    delete_s3(S3Archive("p", "ckpt", prefix, 0), fields)
    assert keys_under("r/p/j/0/att-1/") == []
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix="r/p/j/0/att-1/").get("Uploads")
    assert len(keys_under("r/p/j/0/att-2/")) == 2, "another attempt's checkpoints stay"
