"""The OpenAPI v3 documents `kubectl explain` and kubectl's server-side validation read."""
from __future__ import annotations

from typing import Any, Iterator

import orjson
import pytest

from nodus.coordinator.api.openapi import META, openapi_v3
from nodus.coordinator.api.kinds import KINDS, by_group_version, resolve
from nodus.coordinator.errors import NodusError

GVS = ("nodus.dev/v1", "nodus.dev/v1beta1")


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def schema_at(doc: dict[str, Any], kind_schema: str, dotted: str) -> dict[str, Any]:
    node = doc["components"]["schemas"][kind_schema]
    for part in dotted.split("."):
        node = node["properties"][part]
        if node.get("type") == "array":
            node = node["items"]
    return node


@pytest.mark.parametrize("gv", GVS)
def test_document_is_openapi_3_and_serializable(gv: str) -> None:
    doc = openapi_v3(gv)
    assert doc["openapi"].startswith("3.0")
    assert orjson.loads(orjson.dumps(doc)) == doc


@pytest.mark.parametrize("gv", GVS)
def test_every_ref_resolves(gv: str) -> None:
    doc = openapi_v3(gv)
    found = list(refs(doc))
    assert found
    for ref in found:
        assert ref.startswith("#/components/schemas/")
        assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"], ref


@pytest.mark.parametrize("info", KINDS, ids=[k.kind for k in KINDS])
def test_kind_schema_carries_the_gvk_list(info: Any) -> None:
    doc = openapi_v3(info.api_version)
    schemas = doc["components"]["schemas"]
    name = f"dev.nodus.{info.version}.{info.kind}"
    gvk = {"group": "nodus.dev", "version": info.version, "kind": info.kind}
    assert schemas[name]["x-kubernetes-group-version-kind"] == [gvk]
    assert schemas[name + "List"]["x-kubernetes-group-version-kind"] == [{**gvk, "kind": info.kind + "List"}]
    assert schemas[name]["properties"]["metadata"]["allOf"] == [{"$ref": f"#/components/schemas/{META}ObjectMeta"}]
    assert schemas[name + "List"]["properties"]["items"]["items"] == {"$ref": f"#/components/schemas/{name}"}
    assert schemas[name]["description"]


@pytest.mark.parametrize("info", KINDS, ids=[k.kind for k in KINDS])
def test_operations_carry_the_gvk_object_and_action(info: Any) -> None:
    doc = openapi_v3(info.api_version)
    base = f"/apis/nodus.dev/{info.version}"
    collection = f"{base}/namespaces/{{namespace}}/{info.plural}"
    expected = {
        collection: {"get": "list", "post": "post"},
        collection + "/{name}": {"get": "get", "put": "put", "patch": "patch", "delete": "delete"},
        collection + "/{name}/status": {"get": "get", "put": "put", "patch": "patch"},
        f"{base}/{info.plural}": {"get": "list"},
    }
    gvk = {"group": "nodus.dev", "version": info.version, "kind": info.kind}
    for path, ops in expected.items():
        assert path in doc["paths"], path
        for method, action in ops.items():
            op = doc["paths"][path][method]
            assert op["x-kubernetes-group-version-kind"] == gvk
            assert op["x-kubernetes-action"] == action
            assert op["responses"]["default"]["content"]["application/json"]["schema"] == \
                {"$ref": f"#/components/schemas/{META}Status"}


def test_operation_ids_are_unique() -> None:
    ids = [op["operationId"] for gv in GVS for item in openapi_v3(gv)["paths"].values()
           for key, op in item.items() if key != "parameters"]
    assert len(ids) == len(set(ids))


def test_patch_declares_field_validation_and_patch_types() -> None:
    doc = openapi_v3("nodus.dev/v1")
    patch = doc["paths"]["/apis/nodus.dev/v1/namespaces/{namespace}/jobs/{name}"]["patch"]
    params = {p["name"]: p for p in patch["parameters"]}
    assert params["fieldValidation"]["in"] == "query"
    assert params["fieldValidation"]["schema"]["enum"] == ["Strict", "Warn", "Ignore"]
    assert {"dryRun", "fieldManager"} <= set(params)
    content = set(patch["requestBody"]["content"])
    assert content == {"application/merge-patch+json", "application/json-patch+json"}
    assert "application/strategic-merge-patch+json" not in content


def test_list_and_create_parameters() -> None:
    doc = openapi_v3("nodus.dev/v1")
    item = doc["paths"]["/apis/nodus.dev/v1/namespaces/{namespace}/jobs"]
    listed = {p["name"] for p in item["get"]["parameters"]}
    assert {"watch", "labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "timeoutSeconds",
            "allowWatchBookmarks"} <= listed
    created = {p["name"] for p in item["post"]["parameters"]}
    assert {"dryRun", "fieldValidation", "fieldManager"} <= created
    assert item["parameters"][0] == {"name": "namespace", "in": "path", "required": True, "description": "The project.",
                                     "schema": {"type": "string"}}


def test_descriptions_for_explain() -> None:
    doc = openapi_v3("nodus.dev/v1")
    completions = schema_at(doc, "dev.nodus.v1.Job", "spec.completions")
    assert completions["type"] == "integer" and completions["minimum"] == 1 and completions["maximum"] == 10000
    assert completions["description"].startswith("Completions is how many indexes must succeed (1–10000).")
    assert completions["default"] == 1
    assert schema_at(doc, "dev.nodus.v1.Job", "spec")["description"].startswith("JobSpec describes a Job.")
    env_name = schema_at(doc, "dev.nodus.v1.Job", "spec.env.name")
    assert env_name["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"
    assert schema_at(doc, "dev.nodus.v1.Sweep", "spec.template.spec.completions")["description"] == \
        completions["description"]


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], path + "{}")


@pytest.mark.parametrize("info", KINDS, ids=[k.kind for k in KINDS])
def test_spec_fields_are_typed_and_described(info: Any) -> None:
    schema = openapi_v3(info.api_version)["components"]["schemas"][f"dev.nodus.{info.version}.{info.kind}"]
    for path, node in _walk(schema):
        if "$ref" in node or "allOf" in node:
            continue
        assert "type" in node or "anyOf" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if node.get("type") == "object":
            assert "properties" in node or "additionalProperties" in node or \
                node.get("x-kubernetes-preserve-unknown-fields"), path
        named = path.rsplit(".", 1)[-1]
        if path.startswith(".spec") and not path.endswith(("[]", "{}")) and named:
            assert node.get("description"), f"{path} has no description"


def test_money_durations_and_free_objects() -> None:
    job = openapi_v3("nodus.dev/v1")
    cost = schema_at(job, "dev.nodus.v1.Job", "spec.maxCostUSD")
    assert cost["type"] == "string" and cost["pattern"] and cost["format"] == "decimal"
    timeout = schema_at(job, "dev.nodus.v1.Job", "spec.timeout")
    assert timeout == {"description": timeout["description"], "type": "string", "format": "duration"}
    assert schema_at(job, "dev.nodus.v1.Job", "spec.placement.queueTimeout")["default"] == "24h0m0s"
    training = openapi_v3("nodus.dev/v1beta1")
    params = schema_at(training, "dev.nodus.v1beta1.TrainingJob", "spec.parameters")
    assert params["type"] == "object" and params["x-kubernetes-preserve-unknown-fields"] is True
    assert schema_at(training, "dev.nodus.v1beta1.TrainingRuntime", "spec.parameters")[
        "x-kubernetes-preserve-unknown-fields"] is True


def test_meta_schemas_present() -> None:
    schemas = openapi_v3("nodus.dev/v1")["components"]["schemas"]
    for name in ("ObjectMeta", "ListMeta", "Status", "WatchEvent", "DeleteOptions"):
        assert META + name in schemas
    assert schemas[META + "Status"]["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1",
                                                                            "kind": "Status"}]


def test_group_versions_hold_their_kinds() -> None:
    v1 = openapi_v3("nodus.dev/v1")["components"]["schemas"]
    beta = openapi_v3("nodus.dev/v1beta1")["components"]["schemas"]
    assert {"dev.nodus.v1.Job", "dev.nodus.v1.Sweep", "dev.nodus.v1.Secret"} <= set(v1)
    assert {"dev.nodus.v1beta1.TrainingJob", "dev.nodus.v1beta1.TrainingRuntime"} <= set(beta)
    assert not any("TrainingJob" in k for k in v1)
    with pytest.raises(NodusError) as info:
        openapi_v3("nodus.dev/v2")
    assert info.value.reason == "NotFound"


# -- the kinds registry ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kind", [
    ("jobs", "Job"), ("job", "Job"), ("Job", "Job"), ("JOBS", "Job"), ("nj", "Job"), ("jobs.nodus.dev", "Job"),
    ("jobs.v1.nodus.dev", "Job"), ("sweeps", "Sweep"), ("sw", "Sweep"), ("tj", "TrainingJob"),
    ("trainingjob", "TrainingJob"), ("TrainingRuntime", "TrainingRuntime"), ("tr", "TrainingRuntime"),
    ("trainingruntimes.nodus.dev", "TrainingRuntime"), ("secrets", "Secret"), ("secret.nodus.dev", "Secret"),
])
def test_resolve(name: str, kind: str) -> None:
    assert resolve(name).kind == kind


@pytest.mark.parametrize("name", ["pods", "jobs.batch", "jobs.v1beta1.nodus.dev", ""])
def test_resolve_unknown(name: str) -> None:
    with pytest.raises(NodusError) as info:
        resolve(name)
    assert info.value.reason == "NotFound" and "jobs" in (info.value.fix or "")


def test_registry() -> None:
    assert [k.kind for k in KINDS][:5] == ["Job", "Sweep", "TrainingJob", "TrainingRuntime", "Secret"]
    assert {"Volume"} <= {k.kind for k in KINDS}  # supporting kinds follow the four public ones
    assert [k.kind for k in by_group_version("nodus.dev/v1beta1")] == ["TrainingJob", "TrainingRuntime"]
    job = resolve("jobs")
    assert job.api_version == "nodus.dev/v1" and job.namespaced and job.has_status
    columns = {c.name: c for c in job.columns}
    assert [c.name for c in job.columns if c.priority == 0] == ["Phase", "Completions", "Progress", "Cost", "Age"]
    assert [c.name for c in job.columns if c.priority == 1] == ["Reason", "Active", "Failed"]
    obj = {"metadata": {"creationTimestamp": "2025-01-01T00:00:00Z"}, "spec": {"completions": 4},
           "status": {"phase": "Running", "succeeded": 1, "cost": {"totalUSD": "1.20"}, "active": 2}}
    assert columns["Completions"].cell(obj) == "1/4"
    assert columns["Cost"].cell(obj) == "1.20" and columns["Age"].type == "date"
    assert columns["Age"].cell(obj) == "2025-01-01T00:00:00Z" and columns["Active"].cell(obj) == 2
    assert columns["Reason"].cell(obj) is None
    tj = resolve("tj")
    progress = next(c for c in tj.columns if c.name == "Progress")
    assert progress.cell({"status": {"progress": {"stage": "Training"}, "metrics": {"step": 5, "totalSteps": 10}}}) \
        == "Training 5/10"
    assert [c.name for c in resolve("tr").columns] == ["Task", "Launcher", "Phase", "Age"]
    secret = resolve("secrets")
    assert [c.cell({"status": {"version": 3, "keys": ["a", "b"]}}) for c in secret.columns[:2]] == [3, 2]
