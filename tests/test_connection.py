"""Connection: admission (field rules with their paths), updates, the registry and OpenAPI; how the
coordinator turns a Job's S3 Connection and its Secret into the checkpoint store of an assignment;
and kubectl apply, get and explain against a running coordinator."""
from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

import pytest
import yaml

from conftest import Coordinator
from nodus.coordinator import checkpoints
from nodus.coordinator.api import admission, openapi
from nodus.coordinator.api.connection import bucket_problem
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError
from nodus.v1 import agent_pb2

CONNECTION = resolve("connections")
BASE: dict[str, Any] = {
    "apiVersion": "nodus.dev/v1", "kind": "Connection", "metadata": {"name": "ckpt"},
    "spec": {"type": "S3", "s3": {"bucket": "my-checkpoints", "secret": "s3-keys"}},
}


class Nothing:
    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return None


def create(obj: dict[str, Any]) -> admission.Admitted:
    return asyncio.run(admission.admit_create(CONNECTION, obj, Nothing(), project="p"))


def with_s3(**fields: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    for k, v in fields.items():
        if v is None:
            obj["spec"]["s3"].pop(k, None)
        else:
            obj["spec"]["s3"][k] = v
    return obj


# -- admission ---------------------------------------------------------------------------------------

def test_a_minimal_connection_is_admitted_as_written() -> None:
    admitted = create(BASE)
    assert admitted.object["spec"] == BASE["spec"] and not admitted.warnings


def test_every_field_is_admitted() -> None:
    obj = with_s3(endpoint="https://s3.eu-central-1.example.com:9000", region="eu-central-1", prefix="team/a/")
    assert create(obj).object["spec"]["s3"]["endpoint"] == "https://s3.eu-central-1.example.com:9000"


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("type-other", {"type": "WandB"}, "spec.type", 'Unsupported value: "WandB": supported values: "S3", "Postgres"'),
    ("postgres-missing", {"type": "Postgres"}, "spec.postgres", "spec.type is Postgres: set spec.postgres.host"),
    ("type-missing", {"type": None}, "spec.type", "Required value"),
    ("s3-missing", {"s3": None}, "spec.s3", "Required value: spec.type is S3: set spec.s3.bucket and spec.s3.secret"),
    ("bucket-missing", {"s3": {"secret": "k"}}, "spec.s3.bucket", "Required value"),
    ("secret-missing", {"s3": {"bucket": "abc"}}, "spec.s3.secret", "Required value"),
    ("unknown", {"s3": {"bucket": "abc", "secret": "k", "accessKey": "x"}}, "spec.s3.accessKey", "Unknown field"),
]


@pytest.mark.parametrize("spec_patch, field, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_spec_is_refused_with_the_field(spec_patch: dict[str, Any], field: str, message: str) -> None:
    obj = copy.deepcopy(BASE)
    for k, v in spec_patch.items():
        if v is None:
            obj["spec"].pop(k)
        else:
            obj["spec"][k] = v
    with pytest.raises(NodusError) as e:
        create(obj)
    assert e.value.reason == "Invalid"
    causes = {c.field: c.message for c in e.value.causes}
    assert field in causes and message in causes[field], causes


S3_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("bucket-upper", {"bucket": "My-Bucket"}, "spec.s3.bucket", "must be a valid S3 bucket name"),
    ("bucket-short", {"bucket": "ab"}, "spec.s3.bucket", "3-63 lowercase letters"),
    ("bucket-long", {"bucket": "a" * 64}, "spec.s3.bucket", "3-63 lowercase letters"),
    ("bucket-underscore", {"bucket": "my_bucket"}, "spec.s3.bucket", "must be a valid S3 bucket name"),
    ("bucket-dots", {"bucket": "my..bucket"}, "spec.s3.bucket", "two adjacent periods"),
    ("bucket-dash-dot", {"bucket": "my-.bucket"}, "spec.s3.bucket", "'-' next to a '.'"),
    ("bucket-ip", {"bucket": "192.168.5.4"}, "spec.s3.bucket", "must not be formatted as an IP address"),
    ("bucket-xn", {"bucket": "xn--bucket"}, "spec.s3.bucket", "reserved prefix 'xn--'"),
    ("bucket-alias", {"bucket": "bucket-s3alias"}, "spec.s3.bucket", "reserved suffix '-s3alias'"),
    ("bucket-type", {"bucket": 5}, "spec.s3.bucket", "must be of type string"),
    ("endpoint-scheme", {"endpoint": "ftp://minio:9000"}, "spec.s3.endpoint", "must be an http or https URL"),
    ("endpoint-bare", {"endpoint": "minio:9000"}, "spec.s3.endpoint", "must be an http or https URL"),
    ("endpoint-path", {"endpoint": "https://minio:9000/my-bucket"}, "spec.s3.endpoint", "must not have a path"),
    ("endpoint-query", {"endpoint": "https://minio?x=1"}, "spec.s3.endpoint", "must not have a query"),
    ("endpoint-port", {"endpoint": "https://minio:99999"}, "spec.s3.endpoint", "must be an http or https URL"),
    ("region-upper", {"region": "EU-West-1"}, "spec.s3.region", "must be a region name"),
    ("prefix-absolute", {"prefix": "/ckpt"}, "spec.s3.prefix", "must not start with '/'"),
    ("prefix-dotdot", {"prefix": "a/../b"}, "spec.s3.prefix", "without empty, '.' or '..' parts"),
    ("prefix-empty-part", {"prefix": "a//b"}, "spec.s3.prefix", "without empty"),
    ("prefix-long", {"prefix": "a" * 513}, "spec.s3.prefix", "Too long"),
    ("secret-name", {"secret": "S3_Keys"}, "spec.s3.secret", "must be a lowercase RFC 1123 label"),
]


@pytest.mark.parametrize("fields, field, message", [c[1:] for c in S3_CASES], ids=[c[0] for c in S3_CASES])
def test_s3_fields_are_refused_with_the_field(fields: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(NodusError) as e:
        create(with_s3(**fields))
    causes = {c.field: c.message for c in e.value.causes}
    assert field in causes and message in causes[field], causes
    assert len(causes) == 1, causes


def test_credentials_in_the_endpoint_are_refused_without_echoing_them() -> None:
    with pytest.raises(NodusError) as e:
        create(with_s3(endpoint="https://AKIAEXAMPLE:hunter2@minio:9000"))
    assert [c.field for c in e.value.causes] == ["spec.s3.endpoint"]
    assert "must not carry credentials" in e.value.message
    assert "hunter2" not in e.value.message and "AKIAEXAMPLE" not in e.value.message


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(NodusError) as e:
        create(with_s3(bucket="A", endpoint="nope", prefix="/x", secret="_"))
    assert {c.field for c in e.value.causes} == {"spec.s3.bucket", "spec.s3.endpoint", "spec.s3.prefix",
                                                 "spec.s3.secret"}


def test_no_spec_is_refused() -> None:
    obj = copy.deepcopy(BASE)
    del obj["spec"]
    with pytest.raises(NodusError) as e:
        create(obj)
    assert [c.field for c in e.value.causes] == ["spec"]


@pytest.mark.parametrize("name", ["abc", "my.bucket-1", "a" * 63, "1-2-3"])
def test_valid_bucket_names(name: str) -> None:
    assert bucket_problem(name) is None


def test_s3_may_change_but_type_may_not() -> None:
    old = create(BASE).object
    new = with_s3(bucket="other-bucket", prefix="p")
    assert asyncio.run(admission.admit_update(CONNECTION, old, new, Nothing(), project="p")).object["spec"]["s3"][
        "bucket"] == "other-bucket"
    changed = copy.deepcopy(BASE)
    changed["spec"] = {"type": "Postgres", "postgres": {"host": "db", "database": "d", "secret": "k"}}
    with pytest.raises(NodusError) as e:
        asyncio.run(admission.admit_update(CONNECTION, old, changed, Nothing(), project="p"))
    assert "spec.type" in {c.field for c in e.value.causes}


def test_registry_table_and_openapi() -> None:
    assert resolve("conn") is CONNECTION and resolve("connection.nodus.dev") is CONNECTION
    assert CONNECTION.namespaced and CONNECTION.api_version == "nodus.dev/v1"
    obj = create(with_s3(endpoint="http://minio:9000")).object
    cells = {c.name: c.cell(obj) for c in CONNECTION.columns if c.priority == 0}
    assert list(cells) == ["Type", "Bucket", "Endpoint", "Age"]
    assert cells["Type"] == "S3" and cells["Bucket"] == "my-checkpoints" and cells["Endpoint"] == "http://minio:9000"
    doc = openapi.openapi_v3("nodus.dev/v1")
    schema = doc["components"]["schemas"]["dev.nodus.v1.Connection"]
    s3 = schema["properties"]["spec"]["properties"]["s3"]
    assert s3["required"] == ["bucket", "secret"] and "accessKeyId" in s3["properties"]["secret"]["description"]
    assert schema["properties"]["spec"]["properties"]["type"]["enum"] == ["S3", "Postgres", "Git"]
    git = schema["properties"]["spec"]["properties"]["git"]
    assert git["required"] == ["urlPrefix", "secret"] and "username" in git["properties"]["secret"]["description"]


# -- the checkpoint store of an assignment -------------------------------------------------------------

KEYS = {"accessKeyId": "AKIATEST", "secretAccessKey": "shh", "sessionToken": "tok"}


class Vault:
    def __init__(self, values: dict[tuple[str, str, int], dict[str, str]]) -> None:
        self.values = values

    async def get(self, project: str, name: str, version: int) -> dict[str, str]:
        return self.values[(project, name, version)]


def world(connections: dict[str, dict[str, Any]], secrets: dict[str, dict[str, str]]) -> tuple[Any, Vault]:
    async def read(plural: str, project: str, name: str) -> dict[str, Any] | None:
        if plural == "connections" and name in connections:
            return {"metadata": {"name": name, "namespace": project}, "spec": connections[name]}
        if plural == "secrets" and name in secrets:
            return {"metadata": {"name": name}, "status": {"version": 2, "keys": sorted(secrets[name])}}
        return None
    vault = Vault({("p", name, 2): {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
                   for name, values in secrets.items()})
    return read, vault


def a_job(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "p", "uid": "u1"}, "spec": spec}


S3 = {"type": "S3", "s3": {"bucket": "ckpt", "endpoint": "http://minio:9000", "region": "eu-west-1",
                           "prefix": "team/", "secret": "keys"}}


def store_of(job: dict[str, Any], connections: dict[str, Any], secrets: dict[str, Any]) -> Any:
    read, vault = world(connections, secrets)
    return asyncio.run(checkpoints.checkpoint_store(read, vault, job))  # type: ignore[arg-type]


def test_the_first_s3_connection_becomes_the_store_with_the_secrets_keys() -> None:
    store = store_of(a_job(connections=["ckpt", "other"]), {"ckpt": S3, "other": S3}, {"keys": {**KEYS, "x": "y"}})
    assert store.uri == "s3://ckpt/team/p/train/"
    assert dict(store.credentials) == {**KEYS, "endpoint": "http://minio:9000", "region": "eu-west-1"}


def test_no_connection_or_no_checkpoints_is_the_blob_store() -> None:
    assert store_of(a_job(), {}, {}) is None
    ephemeral = a_job(connections=["ckpt"], recovery={"continuity": "Ephemeral"})
    assert store_of(ephemeral, {}, {}) is None  # nothing is resolved for a Job that never checkpoints


@pytest.mark.parametrize("connections, secrets, message", [
    ({}, {}, 'Connection "ckpt" (named in spec.connections of Job "train") does not exist in project "p"'),
    ({"ckpt": S3}, {}, 'Secret "keys" (spec.s3.secret of Connection "ckpt") does not exist in project "p"'),
    ({"ckpt": S3}, {"keys": {"accessKeyId": "a"}}, 'Secret "keys" (spec.s3.secret of Connection "ckpt") has no key '
                                                   '"secretAccessKey"'),
], ids=["no-connection", "no-secret", "no-key"])
def test_what_is_missing_is_named(connections: dict[str, Any], secrets: dict[str, Any], message: str) -> None:
    with pytest.raises(NodusError) as e:
        store_of(a_job(connections=["ckpt"]), connections, secrets)
    assert message in e.value.message and e.value.fix
    assert "AKIA" not in e.value.message


def test_prepare_puts_the_store_and_gives_an_s3_restore_the_same_credentials() -> None:
    store = agent_pb2.Location(uri="s3://ckpt/p/train/", credentials={**KEYS, "endpoint": "http://minio:9000"})
    record = {"seq": 3, "sha256": "a" * 64, "size": 10, "uri": "s3://ckpt/p/train/0/att-1/0000000003.manifest.json",
              "attempt": "att-1", "time": "2026-01-01T00:00:00Z"}
    first = {"metadata": {"name": "train-0-1", "namespace": "p"},
             "spec": {"id": "att-1", "job": "train", "jobUID": "u1", "index": 0, "number": 1},
             "status": {"phase": "Cancelled", "checkpoints": [record]}}
    second = {"metadata": {"name": "train-0-2", "namespace": "p"},
              "spec": {"id": "att-2", "job": "train", "jobUID": "u1", "index": 0, "number": 2}, "status": {}}
    out = agent_pb2.Assignment()
    checkpoints.prepare(out, second, a_job(connections=["ckpt"]), [first, second], store)
    assert out.checkpoint.store.uri == "s3://ckpt/p/train/" and out.checkpoint.store.credentials["accessKeyId"]
    assert out.restore_from.seq == 3 and out.restore_from.manifest.uri == record["uri"]
    assert dict(out.restore_from.manifest.credentials) == dict(store.credentials)
    blob = agent_pb2.Assignment()
    checkpoints.prepare(blob, second, a_job(), [first, second])
    assert blob.checkpoint.store.uri == "blob://sha256/" and not blob.checkpoint.store.credentials


# -- kubectl -------------------------------------------------------------------------------------------

def test_kubectl_apply_get_and_explain(shared_coordinator: Coordinator) -> None:
    c = shared_coordinator
    manifest = {"apiVersion": "nodus.dev/v1", "kind": "Connection", "metadata": {"name": "kc-conn"},
                "spec": {"type": "S3", "s3": {"bucket": "kc-bucket", "endpoint": "http://minio:9000",
                                              "secret": "kc-keys"}}}
    out = c.run("kubectl", "apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout
    assert "connection.nodus.dev/kc-conn created" in out, out
    again = c.run("kubectl", "apply", "-f", "-", input=yaml.safe_dump(manifest)).stdout
    assert "unchanged" in again, again
    header, *rows = c.run("kubectl", "get", "connections").stdout.splitlines()
    assert header.split() == ["NAME", "TYPE", "BUCKET", "ENDPOINT", "AGE"], header
    assert [r.split()[:4] for r in rows if r.startswith("kc-conn ")] == [
        ["kc-conn", "S3", "kc-bucket", "http://minio:9000"]]
    assert "kc-conn" in c.run("kubectl", "get", "conn", "-o", "name").stdout
    explained = c.run("kubectl", "explain", "connection.spec.s3").stdout
    assert "bucket" in explained and "secretAccessKey" in explained, explained
    bad = {**manifest, "metadata": {"name": "kc-bad"}, "spec": {"type": "WandB"}}
    refused = c.run("kubectl", "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0 and 'spec.type: Unsupported value: "WandB"' in refused.stderr, refused.stderr
