"""The REST gateway over the wire: verbs, errors, selectors, paging, finalizers, status, secrets."""
from __future__ import annotations

import threading
from typing import Any, Iterator

import orjson
import pytest

from conftest import Coordinator, job

JOBS = "/apis/nodus.dev/v1/namespaces/default/jobs"
SECRETS = "/apis/nodus.dev/v1/namespaces/default/secrets"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """This module checks the API's own semantics (compare-and-swap, exact watch sequences), so its
    coordinator runs without the controllers, whose status writes would be changes no test made."""
    with Coordinator(tmp_path_factory.mktemp("rest") / "data").start(extra_args=("--controllers", "off")) as c:
        yield c


def create(c: Coordinator, body: dict[str, Any], path: str = JOBS, **params: str) -> Any:
    return c.session().post(c.url(path), json=body, params=params)


def test_discovery_lists_the_kinds(c: Coordinator) -> None:
    s = c.session()
    groups = s.get(c.url("/apis")).json()
    assert groups["kind"] == "APIGroupList"
    versions = {v["version"] for v in groups["groups"][0]["versions"]}
    assert versions == {"v1", "v1beta1"}
    v1 = {r["name"]: r for r in s.get(c.url("/apis/nodus.dev/v1")).json()["resources"]}
    assert {"jobs", "jobs/status", "sweeps", "secrets"} <= set(v1)
    assert v1["jobs"]["kind"] == "Job" and "watch" in v1["jobs"]["verbs"]
    beta = {r["name"] for r in s.get(c.url("/apis/nodus.dev/v1beta1")).json()["resources"]}
    assert {"trainingjobs", "trainingruntimes"} <= beta


def test_create_writes_defaults_and_answers_201(c: Coordinator) -> None:
    r = create(c, job("defaults-1", completions=4))
    assert r.status_code == 201, r.text
    assert r.headers["X-Request-Id"].startswith("req_")
    got = c.session().get(c.url(f"{JOBS}/defaults-1")).json()
    assert got["spec"]["parallelism"] == 1 and got["spec"]["backoffLimit"] == 6
    assert got["spec"]["placement"]["queueTimeout"] == "24h0m0s"
    assert got["metadata"]["generation"] == 1 and got["metadata"]["uid"]
    assert int(got["metadata"]["resourceVersion"]) > 0
    # The 201 answers the object as admitted, not read back from the store (ADR 0078): the same document,
    # resourceVersion included, that a GET reads (no controller writes here in between).
    assert r.json() == got
    again = create(c, job("defaults-1"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"


def test_invalid_object_is_a_status_with_every_cause(c: Coordinator) -> None:
    body = job("bad-many", completions=0, parallelism=0)
    body["spec"]["nope"] = True
    r = create(c, body)
    assert r.status_code == 422
    status = r.json()
    assert status["kind"] == "Status" and status["apiVersion"] == "v1" and status["reason"] == "Invalid"
    fields = {cause["field"] for cause in status["details"]["causes"]}
    assert {"spec.completions", "spec.parallelism", "spec.nope"} <= fields
    assert status["docs"].endswith("/Invalid") and status["fix"] and status["requestId"].startswith("req_")
    assert status["requestId"] == r.headers["X-Request-Id"]
    assert c.session().get(c.url(f"{JOBS}/bad-many")).status_code == 404


def test_dry_run_stores_nothing(c: Coordinator) -> None:
    r = create(c, job("dry-1"), dryRun="All")
    assert r.status_code == 201 and r.json()["spec"]["completions"] == 1
    assert r.headers.get("ETag")
    assert c.session().get(c.url(f"{JOBS}/dry-1")).status_code == 404
    bad = create(c, job("dry-2"), dryRun="Some")
    assert bad.status_code == 400


def test_field_validation_modes(c: Coordinator) -> None:
    body = job("fv-warn")
    body["spec"]["extra"] = 1
    warn = create(c, body, fieldValidation="Warn")
    assert warn.status_code == 201 and "spec.extra" in warn.headers["Warning"]
    assert "extra" not in warn.json()["spec"]
    body["metadata"]["name"] = "fv-ignore"
    ignore = create(c, body, fieldValidation="Ignore")
    assert ignore.status_code == 201 and "Warning" not in ignore.headers
    assert create(c, body, fieldValidation="Loose").status_code == 400


def test_replace_needs_current_resource_version(c: Coordinator) -> None:
    s = c.session()
    obj = create(c, job("cas-1")).json()
    obj["spec"]["parallelism"] = 1
    obj["spec"]["backoffLimit"] = 2
    ok = s.put(c.url(f"{JOBS}/cas-1"), json=obj)
    assert ok.status_code == 200 and ok.json()["metadata"]["generation"] == 2
    stale = s.put(c.url(f"{JOBS}/cas-1"), json=obj)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    del obj["metadata"]["resourceVersion"]
    missing = s.put(c.url(f"{JOBS}/cas-1"), json=obj)
    assert missing.status_code == 422 and "resourceVersion" in missing.json()["message"]


def test_patches(c: Coordinator) -> None:
    s = c.session()
    created = create(c, job("patch-1", completions=3, parallelism=1)).json()
    same = s.patch(c.url(f"{JOBS}/patch-1"), data=b'{"spec":{"parallelism":1}}', headers=MERGE)
    assert same.status_code == 200
    assert same.json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    changed = s.patch(c.url(f"{JOBS}/patch-1"), data=b'{"spec":{"parallelism":3}}', headers=MERGE).json()
    assert changed["spec"]["parallelism"] == 3 and changed["metadata"]["generation"] == 2
    jp = s.patch(c.url(f"{JOBS}/patch-1"), data=b'[{"op":"replace","path":"/spec/backoffLimit","value":9}]',
                 headers={"Content-Type": "application/json-patch+json"})
    assert jp.status_code == 200 and jp.json()["spec"]["backoffLimit"] == 9
    too_many = s.patch(c.url(f"{JOBS}/patch-1"), data=b'{"spec":{"parallelism":4}}', headers=MERGE)
    assert too_many.status_code == 422 and too_many.json()["details"]["causes"][0]["field"] == "spec.parallelism"
    immutable = s.patch(c.url(f"{JOBS}/patch-1"), data=b'{"spec":{"completions":5}}', headers=MERGE)
    assert immutable.status_code == 422 and "immutable" in immutable.text
    smp = s.patch(c.url(f"{JOBS}/patch-1"), data=b'{"spec":{"parallelism":2}}',
                  headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert smp.status_code == 415 and "--type json" in smp.json()["fix"]


def test_max_cost_may_only_be_raised(c: Coordinator) -> None:
    s = c.session()
    create(c, job("cost-1", maxCostUSD="10.00"))
    lower = s.patch(c.url(f"{JOBS}/cost-1"), data=b'{"spec":{"maxCostUSD":"5.00"}}', headers=MERGE)
    assert lower.status_code == 422 and lower.json()["details"]["causes"][0]["field"] == "spec.maxCostUSD"
    higher = s.patch(c.url(f"{JOBS}/cost-1"), data=b'{"spec":{"maxCostUSD":"20.50"}}', headers=MERGE)
    assert higher.status_code == 200 and higher.json()["spec"]["maxCostUSD"] == "20.50"


def test_label_and_field_selectors_and_paging(c: Coordinator) -> None:
    s = c.session()
    for i in range(7):
        body = job(f"page-{i}")
        body["metadata"]["labels"] = {"batch": "paging", "parity": "even" if i % 2 == 0 else "odd"}
        assert create(c, body).status_code == 201
    even = s.get(c.url(JOBS), params={"labelSelector": "batch=paging,parity in (even)"}).json()
    assert sorted(o["metadata"]["name"] for o in even["items"]) == ["page-0", "page-2", "page-4", "page-6"]
    one = s.get(c.url(JOBS), params={"fieldSelector": "metadata.name=page-3"}).json()
    assert [o["metadata"]["name"] for o in one["items"]] == ["page-3"]
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        params = {"labelSelector": "batch=paging", "limit": "3"}
        if token:
            params["continue"] = token
        page = s.get(c.url(JOBS), params=params).json()
        names += [o["metadata"]["name"] for o in page["items"]]
        pages += 1
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert pages == 3 and names == [f"page-{i}" for i in range(7)]
    bad = s.get(c.url(JOBS), params={"fieldSelector": "spec.image=x"})
    assert bad.status_code == 400 and "metadata.name" in bad.json()["fix"]


def test_tables_for_kubectl_get(c: Coordinator) -> None:
    create(c, job("table-1", completions=2))
    t = c.session().get(c.url(JOBS), headers={"Accept": TABLE}).json()
    assert t["kind"] == "Table"
    names = [col["name"] for col in t["columnDefinitions"]]
    assert names[:3] == ["Name", "Phase", "Completions"]
    row = next(r for r in t["rows"] if r["cells"][0] == "table-1")
    assert row["cells"][names.index("Completions")] == "0/2"
    assert row["object"]["kind"] == "PartialObjectMetadata"


def test_finalizers_hold_deletion(c: Coordinator) -> None:
    s = c.session()
    body = job("fin-1")
    body["metadata"]["finalizers"] = ["example.com/cleanup"]
    create(c, body)
    first = s.delete(c.url(f"{JOBS}/fin-1"), json={"propagationPolicy": "Background"})
    assert first.status_code == 200 and first.json()["metadata"]["deletionTimestamp"]
    assert s.get(c.url(f"{JOBS}/fin-1")).status_code == 200
    done = s.patch(c.url(f"{JOBS}/fin-1"), data=b'{"metadata":{"finalizers":null}}', headers=MERGE)
    assert done.status_code == 200
    assert s.get(c.url(f"{JOBS}/fin-1")).status_code == 404


def test_status_subresource(c: Coordinator) -> None:
    s = c.session()
    obj = create(c, job("status-1")).json()
    obj["status"] = {"phase": "Running", "active": 1}
    obj["spec"]["parallelism"] = 1
    r = s.put(c.url(f"{JOBS}/status-1/status"), json=obj)
    assert r.status_code == 200, r.text
    assert r.json()["status"]["phase"] == "Running"
    assert r.json()["metadata"]["generation"] == 1
    # status sent to the main resource is ignored
    main = s.patch(c.url(f"{JOBS}/status-1"), data=b'{"status":{"phase":"Failed"}}', headers=MERGE).json()
    assert main["status"]["phase"] == "Running"
    editor = c.grpc_token("default", "editor")
    denied = c.session(editor).patch(c.url(f"{JOBS}/status-1/status"), data=b'{"status":{"phase":"Failed"}}',
                                     headers=MERGE)
    assert denied.status_code == 403


def test_an_integer_past_64_bits_is_refused_naming_its_field_and_stores_nothing(c: Coordinator) -> None:
    """JSON numbers past int64 (orjson reads them as floats, YAML as Python ints) cannot be stored: 422 naming
    the field, on a create and on a status write alike (a status write once answered 500 for it)."""
    s = c.session()
    big = 2 ** 70
    body = job("big-1")
    body["spec"]["completions"] = big
    r = create(c, body)
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"][0]["field"] == "spec.completions"
    assert "64-bit" in r.json()["message"]
    assert s.get(c.url(f"{JOBS}/big-1")).status_code == 404
    obj = create(c, job("big-2")).json()
    before = s.get(c.url(f"{JOBS}/big-2")).json()
    r = s.put(c.url(f"{JOBS}/big-2/status"), data=orjson.dumps({**obj, "status": {"phase": "Running"}})
              .replace(b'"phase":"Running"', b'"phase":"Running","active":' + str(big).encode()),
              headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["details"]["causes"][0]["field"] == "status.active"
    assert s.get(c.url(f"{JOBS}/big-2")).json() == before


def test_if_match_on_a_create_with_no_estimate_to_bind_is_refused(c: Coordinator) -> None:
    """If-Match binds a Job or Sweep create to its estimate; on a Secret it binds nothing, and is refused
    naming the header rather than ignored."""
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "bound"},
              "stringData": {"K": "NODUS-TEST-SECRET-bound-1"}}
    r = c.session().post(c.url(SECRETS), json=secret, headers={"If-Match": '"est-0123"'})
    assert r.status_code == 400, r.text
    assert "If-Match" in r.json()["message"] and "drop the If-Match header" in r.json()["fix"]
    assert c.session().get(c.url(f"{SECRETS}/bound")).status_code == 404


def test_secret_values_are_write_only_and_versioned(c: Coordinator) -> None:
    s = c.session()
    secret = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "hf"},
              "stringData": {"HF_TOKEN": "NODUS-TEST-SECRET-hf-1"}}
    r = create(c, secret, SECRETS)
    assert r.status_code == 201, r.text
    assert "NODUS-TEST-SECRET-hf-1" not in r.text
    got = s.get(c.url(f"{SECRETS}/hf"))
    assert "NODUS-TEST-SECRET-hf-1" not in got.text and got.json()["status"]["version"] == 1
    assert got.json()["status"]["keys"] == ["HF_TOKEN"]
    same = s.patch(c.url(f"{SECRETS}/hf"), data=b'{"stringData":{"HF_TOKEN":"NODUS-TEST-SECRET-hf-1"}}',
                   headers=MERGE)
    assert same.status_code == 200 and same.json()["status"]["version"] == 1
    new = s.patch(c.url(f"{SECRETS}/hf"), data=b'{"stringData":{"HF_TOKEN":"NODUS-TEST-SECRET-hf-2"}}', headers=MERGE)
    assert new.status_code == 200 and new.json()["status"]["version"] == 2
    assert "NODUS-TEST-SECRET-hf-2" not in new.text
    listed = s.get(c.url(SECRETS)).text
    assert "NODUS-TEST-SECRET-hf-2" not in listed and "NODUS-TEST-SECRET-hf-1" not in listed
    pinned = create(c, job("uses-secret", secrets=["hf"],
                           env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]))
    assert pinned.status_code == 201, pinned.text
    assert pinned.json()["status"]["secretVersions"] == {"hf": 2}
    missing = create(c, job("uses-missing", secrets=["nope"]))
    assert missing.status_code == 422 and "spec.secrets[0]" in missing.text


def test_unauthenticated_and_bad_tokens(c: Coordinator) -> None:
    for token in ("", "nodus_000000000000_notarealsecretatallxx", "garbage"):
        r = c.session(token).get(c.url(JOBS))
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"


def test_watch_streams_changes_with_bookmarks(c: Coordinator) -> None:
    s = c.session()
    rv = s.get(c.url(JOBS)).json()["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []

    def consume() -> None:
        with c.session().get(c.url(JOBS), params={"watch": "true", "resourceVersion": rv,
                                                  "fieldSelector": "metadata.name=watch-1",
                                                  "timeoutSeconds": "10"}, stream=True) as resp:
            for line in resp.iter_lines():
                if line:
                    events.append(orjson.loads(line))
                    if events[-1]["type"] == "DELETED":
                        return

    t = threading.Thread(target=consume)
    t.start()
    create(c, job("watch-1"))
    create(c, job("watch-other"))
    s.patch(c.url(f"{JOBS}/watch-1"), data=b'{"spec":{"backoffLimit":1}}', headers=MERGE)
    s.delete(c.url(f"{JOBS}/watch-1"))
    t.join(15)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert all(e["object"]["metadata"]["name"] == "watch-1" for e in events)


def test_watch_list_protocol_for_kubectl_wait(c: Coordinator) -> None:
    create(c, job("wl-1"))
    lines: list[dict[str, Any]] = []
    with c.session().get(c.url(JOBS), params={
            "watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan", "fieldSelector": "metadata.name=wl-1",
            "timeoutSeconds": "2"}, stream=True) as resp:
        for line in resp.iter_lines():
            if line:
                lines.append(orjson.loads(line))
                if lines[-1]["type"] == "BOOKMARK":
                    break
    assert [e["type"] for e in lines] == ["ADDED", "BOOKMARK"]
    assert lines[0]["object"]["metadata"]["name"] == "wl-1"
    mark = lines[1]["object"]
    assert mark["kind"] == "Job" and mark["apiVersion"] == "nodus.dev/v1"
    assert mark["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"


def test_health_metrics_and_openapi(c: Coordinator) -> None:
    s = c.session()
    assert s.get(c.url("/healthz")).text == "ok"
    assert s.get(c.url("/readyz")).text == "ok"
    metrics = s.get(c.url("/metrics")).text
    assert "nodus_api_requests_total" in metrics and "nodus_store_revision" in metrics
    index = s.get(c.url("/openapi/v3")).json()
    url = index["paths"]["apis/nodus.dev/v1"]["serverRelativeURL"]
    doc = s.get(c.url(url))
    assert doc.status_code == 200 and doc.headers["ETag"]
    assert "immutable" in doc.headers["Cache-Control"]
    assert s.get(c.url(url), headers={"If-None-Match": doc.headers["ETag"]}).status_code == 304
    schema = doc.json()["components"]["schemas"]["dev.nodus.v1.Job"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "nodus.dev", "version": "v1", "kind": "Job"}]


def test_unknown_paths_and_methods_answer_status(c: Coordinator) -> None:
    s = c.session()
    r = s.get(c.url("/apis/nodus.dev/v1/namespaces/default/widgets"))
    assert r.status_code == 404 and r.json()["kind"] == "Status"
    r = s.delete(c.url(JOBS))
    assert r.status_code == 405 and r.json()["reason"] == "MethodNotAllowed"
    r = s.post(c.url(JOBS), data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["reason"] == "BadRequest"
    r = s.post(c.url("/apis/nodus.dev/v1/namespaces/ghost/jobs"), json=job("x"))
    assert r.status_code == 404 and "nodus project create ghost" in r.json()["fix"]
    big = job("big")
    big["metadata"]["annotations"] = {"pad": "x" * (4 * 1024 * 1024)}
    r = s.post(c.url(JOBS), json=big)
    assert r.status_code == 413 and r.json()["reason"] == "RequestEntityTooLarge"


def test_secret_status_cannot_be_rewritten(c: Coordinator) -> None:
    s = c.session()
    assert create(c, {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "st-1"},
                      "stringData": {"K": "v"}}, SECRETS).status_code == 201
    r = s.patch(c.url(f"{SECRETS}/st-1/status"), data=b'{"status":{"version":9}}', headers=MERGE)
    assert r.status_code == 404
    assert s.get(c.url(f"{SECRETS}/st-1")).json()["status"]["version"] == 1
