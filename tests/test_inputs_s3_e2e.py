"""Bucket inputs through an S3 Connection, end to end: a real coordinator and agent, moto's S3 server.

What must hold (docs/adr/0037, ADR 0014): the agent streams the object with the Connection's keys (it
has none of its own) and the program reads exactly its bytes; a sha256 that does not match, a missing
object and refused keys each fail the attempt with InputFailed naming the input and the cause, and the
program never runs; the keys appear in no log, no file of the agent and nothing the API returns."""
from __future__ import annotations

import hashlib
import os
import secrets
import stat
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
import requests

from agent_double import AgentProcess
from conftest import Coordinator
from e2e import ATTEMPTS, JOBS, NS, attempts_of, create, ended, start_agent
from motoserver import moto_server
from test_checkpoint_s3_e2e import assert_no_leak, connection, secret

REGION = "eu-west-1"
DATA = b"".join(f"row {i}\n".encode() for i in range(50_000))  # ~440 KiB: several chunks of the stream

CONSUME = r"""
import os, sys
from pathlib import Path
Path(sys.argv[1]).write_bytes(Path(os.environ["NODUS_INPUTS_DIR"], "data").read_bytes())
"""


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    """Distinctive keys, so that a leak is found by a plain search."""
    return {"accessKeyId": "AKIA" + secrets.token_hex(8).upper(), "secretAccessKey": "sk-" + secrets.token_hex(20)}


@pytest.fixture(scope="module")
def agent(shared_coordinator: Coordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with pytest.MonkeyPatch.context() as mp:
        # No AWS keys anywhere the agent could find them: what reads the bucket came from the Connection.
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
                  "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
            mp.delenv(k, raising=False)
        mp.setenv("AWS_CONFIG_FILE", "/nonexistent")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with start_agent(shared_coordinator, tmp_path_factory.mktemp("agent"), "s3-inputs-node") as a:
            yield a


def put_object(endpoint: str, keys: dict[str, str], bucket: str, key: str, body: bytes) -> None:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=keys["accessKeyId"],
                      aws_secret_access_key=keys["secretAccessKey"])
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.fixture(scope="module")
def bucket(shared_coordinator: Coordinator, moto: str, keys: dict[str, str]) -> str:
    """A bucket with data/rows.txt, and the Connection "data" that reads it."""
    name = f"in-{uuid.uuid4().hex[:12]}"
    put_object(moto, keys, name, "data/rows.txt", DATA)
    secret(shared_coordinator, "s3-input-keys", keys)
    connection(shared_coordinator, "data", bucket=name, endpoint=moto, region=REGION, secret="s3-input-keys")
    return name


def bucket_job(c: Coordinator, name: str, uri: str, out: Path, connection_name: str = "data",
               sha256: str | None = None, *more: dict[str, Any]) -> None:
    ref = {"uri": uri, "connection": connection_name, **({"sha256": sha256} if sha256 else {})}
    create(c, name, command=[sys.executable, "-c", CONSUME, str(out)],
           inputs=[{"name": "data", "bucket": ref}, *more], backoffLimit=0)


def failed_attempt(c: Coordinator, name: str) -> dict[str, Any]:
    j = ended(c, name, timeout=90)
    assert j["status"]["phase"] == "Failed", j["status"]
    [attempt] = attempts_of(c, name)
    assert attempt["status"]["reason"] == "InputFailed", attempt["status"]
    return attempt["status"]


def test_the_program_reads_the_object_streamed_with_the_connections_keys(
        shared_coordinator: Coordinator, agent: AgentProcess, bucket: str, keys: dict[str, str],
        tmp_path: Path) -> None:
    c, out = shared_coordinator, tmp_path / "read"
    digest = hashlib.sha256(DATA).hexdigest()
    unnamed = {"name": "again", "bucket": {"uri": f"s3://{bucket}/data/rows.txt", "connection": "data"}}
    bucket_job(c, "reads-bucket", f"s3://{bucket}/data/rows.txt", out, "data", digest, unnamed)
    st = ended(c, "reads-bucket", timeout=90)["status"]
    assert st["phase"] == "Succeeded", st
    assert out.read_bytes() == DATA
    # status.inputs: the digest the agent verified, and the one it computed where the Job named none.
    assert sorted((i["name"], i["sha256"]) for i in st["inputs"]) == [("again", digest), ("data", digest)]
    listed = [c.session().get(c.url(p)).text for p in (ATTEMPTS, JOBS, f"{NS}/connections", f"{NS}/secrets")]
    assert_no_leak(keys, c.log.read_text(errors="replace"), agent.log_path.read_text(errors="replace"), *listed)
    assert_no_leak(keys, _texts_under(agent.work_dir))


def _texts_under(root: Path) -> str:
    """Every small file under `root`, read while the agent may still be removing the ended attempt's
    directories (os.walk passes over a directory gone meanwhile; a file gone meanwhile is skipped)."""
    texts = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size >= 1 << 20:
                    continue  # as Path.is_file (a FIFO would block the read) and the size limit before
                with open(path, "rb") as f:
                    texts.append(f.read().decode(errors="replace"))
            except FileNotFoundError:
                continue
    return "\n".join(texts)


def test_a_sha256_that_does_not_match_fails_the_attempt(shared_coordinator: Coordinator, agent: AgentProcess,
                                                        bucket: str, tmp_path: Path) -> None:
    c, out = shared_coordinator, tmp_path / "read"
    bucket_job(c, "bucket-digest", f"s3://{bucket}/data/rows.txt", out, sha256="0" * 64)
    st = failed_attempt(c, "bucket-digest")
    assert st["message"].startswith("input data: sha256 mismatch: expected " + "0" * 64), st
    assert hashlib.sha256(DATA).hexdigest() in st["message"]
    assert not out.exists(), "the program never ran"


def test_a_missing_object_fails_the_attempt_naming_it(shared_coordinator: Coordinator, agent: AgentProcess,
                                                      bucket: str, tmp_path: Path) -> None:
    c, out = shared_coordinator, tmp_path / "read"
    bucket_job(c, "bucket-missing", f"s3://{bucket}/data/nope.txt", out)
    st = failed_attempt(c, "bucket-missing")
    assert f"input data: s3://{bucket}/data/nope.txt: the object does not exist (NoSuchKey)" in st["message"], st
    assert not out.exists()


def test_a_missing_connection_fails_the_assignment_naming_it(shared_coordinator: Coordinator, agent: AgentProcess,
                                                             bucket: str, tmp_path: Path) -> None:
    c, out = shared_coordinator, tmp_path / "read"
    bucket_job(c, "bucket-no-conn", f"s3://{bucket}/data/rows.txt", out, connection_name="nowhere")
    j = ended(c, "bucket-no-conn", timeout=90)
    [attempt] = attempts_of(c, "bucket-no-conn")
    assert attempt["status"]["reason"] == "InvalidAssignment", attempt["status"]
    assert 'Connection "nowhere" (spec.inputs[0].bucket.connection) does not exist' in attempt["status"]["message"]
    assert j["status"]["phase"] == "Failed" and not out.exists()


def test_refused_keys_fail_the_attempt_naming_the_cause(shared_coordinator: Coordinator, agent: AgentProcess,
                                                        tmp_path: Path) -> None:
    """A moto server of its own that enforces IAM once the object is in place: the Connection's keys
    belong to no IAM user there, so S3 refuses them."""
    c, out = shared_coordinator, tmp_path / "read"
    strangers = {"accessKeyId": "AKIA" + secrets.token_hex(8).upper(), "secretAccessKey": secrets.token_hex(20)}
    with moto_server(tmp_path) as endpoint:
        put_object(endpoint, strangers, "locked", "k", b"secret data")
        assert requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10).ok  # enforce IAM from now
        secret(c, "stranger-keys", strangers)
        connection(c, "locked", bucket="locked", endpoint=endpoint, region=REGION, secret="stranger-keys")
        bucket_job(c, "bucket-refused", "s3://locked/k", out, connection_name="locked")
        st = failed_attempt(c, "bucket-refused")
    assert "input data: the keys of its Connection were refused reading s3://locked/k (InvalidAccessKeyId" \
        in st["message"], st
    assert strangers["secretAccessKey"] not in st["message"] and not out.exists()
