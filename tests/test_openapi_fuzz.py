"""Fuzz every operation of the coordinator's own OpenAPI v3 documents with schemathesis: valid and
invalid (negative) requests, junk bodies included. The one rule: no 5xx, ever. 4xx are fine.

Requests go to a real coordinator (HTTPS, admin bearer token). Besides freely generated paths, every
operation is also aimed at `default` and (for the kinds in FIXTURES) at an object that exists there;
such a request is sometimes mended (`Fuzzer.repair`: a valid envelope, the current resourceVersion, the
generated spec laid over a valid one) so that its junk gets past the first check into admission and
the store. A dropped connection counts as a 5xx. The end of this module pins, request by request, the
5xx the fuzzer found (all fixed since).

Deterministic by default (hypothesis derandomized); NODUS_FUZZ_RANDOM=1 explores new inputs, and
NODUS_FUZZ_EXAMPLES=N changes the examples per operation.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from conftest import Coordinator, job

EXAMPLES = int(os.environ.get("NODUS_FUZZ_EXAMPLES", "30"))
RANDOM = os.environ.get("NODUS_FUZZ_RANDOM") == "1"
PROJECT = "default"

# One existing object per kind, in `default`, that object operations are aimed at.
FIXTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "secrets": ("v1", {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "fuzz-secret"},
                       "stringData": {"HF_TOKEN": "hf_fuzz"}}),
    "jobs": ("v1", job("fuzz-job")),
    "sweeps": ("v1", {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": "fuzz-sweep"},
                      "spec": {"matrix": {"params": {"LR": ["1e-4", "3e-4"]}},
                               "template": {"spec": {"image": "ghcr.io/acme/train:1",
                                                     "command": ["python", "train.py"]}}}}),
    "trainingruntimes": ("v1beta1", {
        "apiVersion": "nodus.dev/v1beta1", "kind": "TrainingRuntime", "metadata": {"name": "fuzz-rt"},
        "spec": {"image": "ghcr.io/nodus/sft@sha256:" + "a" * 64, "task": "SFT",
                 "command": ["python", "-m", "trainer"], "modes": ["Train"]}}),
    "trainingjobs": ("v1beta1", {
        "apiVersion": "nodus.dev/v1beta1", "kind": "TrainingJob", "metadata": {"name": "fuzz-tj"},
        "spec": {"runtime": "fuzz-rt", "model": {"uri": "hf://Qwen/Qwen3-0.6B", "secret": "fuzz-secret"}}}),
}
_PATH = re.compile(r"^/apis/nodus\.dev/(?P<version>[^/]+)/(?:namespaces/\{namespace\}/)?(?P<plural>[^/{]+)"
                   r"(?P<item>/\{name\})?(?P<sub>/status)?$")


def _collection(version: str, plural: str) -> str:
    return f"/apis/nodus.dev/{version}/namespaces/{PROJECT}/{plural}"


def _fixture_name(plural: str) -> str:
    return FIXTURES[plural][1]["metadata"]["name"]


def _merge(base: Any, over: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base.get(k), v)
    return out


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _allowed_5xx(response: requests.Response) -> bool:
    """Kubernetes answers a list at a resourceVersion from the future with 504 Timeout
    ("Too large resource version"); that one 5xx is the documented behaviour, not a crash."""
    if response.status_code != 504:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return body.get("reason") == "Timeout" and "Too large resource version" in body.get("message", "")


@dataclass
class Fuzzer:
    c: Coordinator
    session: requests.Session
    failures: list[str] = field(default_factory=list)
    statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    serial: int = 0

    def ensure(self, plural: str) -> None:
        """Puts the kind's fixture object back if a fuzzed DELETE (or PATCH) removed or doomed it."""
        version, body = FIXTURES[plural]
        url = self.c.url(f"{_collection(version, plural)}/{_fixture_name(plural)}")
        got = self.session.get(url, timeout=30)
        if got.status_code == 200 and got.json()["metadata"].get("deletionTimestamp"):
            self.session.patch(url, data=b'{"metadata":{"finalizers":null}}',
                               headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
            got = self.session.get(url, timeout=30)
        if got.status_code == 404:
            r = self.session.post(self.c.url(_collection(version, plural)), json=body, timeout=30)
            assert r.status_code == 201, f"cannot restore the {plural} fixture: {r.status_code} {r.text}"

    def current_rv(self, plural: str) -> str | None:
        version, _ = FIXTURES[plural]
        r = self.session.get(self.c.url(f"{_collection(version, plural)}/{_fixture_name(plural)}"), timeout=30)
        return r.json()["metadata"]["resourceVersion"] if r.status_code == 200 else None

    def repair(self, case: Any, plural: str, how: str) -> None:
        """Mends a generated request just enough that it gets past the first check, so the rest of it
        (the spec above all) reaches admission and the store: a valid envelope, a dryRun that is
        supported, the current resourceVersion on a PUT; "overlay" lays the generated spec over the
        fixture's (metadata too), so odd fields sit among valid ones."""
        if case.query and case.query.get("dryRun") not in (None, "All"):
            case.query.pop("dryRun")
        method = case.method.upper()
        if method not in ("POST", "PUT") or not isinstance(case.body, dict):
            return
        version, template = FIXTURES[plural]
        body = case.body
        if how == "overlay":
            base = copy.deepcopy(template)
            body = _merge(base, {k: v for k, v in body.items() if k not in ("apiVersion", "kind")})
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        meta.pop("namespace", None)
        self.serial += 1
        meta["name"] = f"fz-{self.serial}" if method == "POST" else _fixture_name(plural)
        if method == "PUT":
            meta["resourceVersion"] = self.current_rv(plural)
        body.update(apiVersion=template["apiVersion"], kind=template["kind"], metadata=meta)
        case.body = body

    def send(self, case: Any, plural: str | None, aimed: bool, how: str) -> None:
        if case.query and "watch" in case.query:
            case.query["timeoutSeconds"] = 1  # a watch streams until then; it must not hold the fuzzer
        if aimed and plural and how != "none":
            self.repair(case, plural, how)
        try:
            response = case.call(base_url=self.c.http, session=self.session, verify=str(self.c.ca), timeout=30)
        except requests.RequestException as e:
            alive = self.c.proc is not None and self.c.proc.poll() is None
            if not alive:
                raise AssertionError(f"the coordinator died on {case.method} {case.formatted_path}:\n"
                                     f"{case.as_curl_command(verify=False)}") from None
            self.failures.append(f"no answer ({e!r}) for {case.method.upper()} {case.formatted_path}\n"
                                 f"  {case.as_curl_command(verify=False)}")
            return
        label = f"{case.method.upper()} {case.path}"
        counts = self.statuses.setdefault(label, {})
        counts[response.status_code] = counts.get(response.status_code, 0) + 1
        if response.status_code >= 500 and not _allowed_5xx(response):
            self.failures.append(
                f"{response.status_code} for {case.method.upper()} {response.request.url}\n"
                f"  Content-Type: {response.request.headers.get('Content-Type')}\n"
                f"  body: {response.request.body!r:.600}\n  answer: {response.text:.600}\n"
                f"  {case.as_curl_command(verify=False)}")
        if aimed and plural and case.method.upper() in ("DELETE", "PATCH", "PUT") and response.status_code < 300:
            self.ensure(plural)


@pytest.fixture(scope="module")
def fuzz_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with Coordinator(tmp_path_factory.mktemp("fuzz") / "data").start() as c:
        yield c


@pytest.fixture(scope="module")
def fuzzer(fuzz_coordinator: Coordinator) -> Fuzzer:
    c = fuzz_coordinator
    s = c.session()
    f = Fuzzer(c, s)
    for plural in FIXTURES:  # order matters: the training job needs the secret and the runtime
        f.ensure(plural)
    return f


def _operations(fuzzer: Fuzzer, version: str) -> list[tuple[Any, str | None, bool]]:
    r = fuzzer.session.get(fuzzer.c.url(f"/openapi/v3/apis/nodus.dev/{version}"), timeout=30)
    assert r.status_code == 200, r.text
    schema = schemathesis.openapi.from_dict(r.json())
    out = []
    for result in schema.get_all_operations():
        op = result.ok()
        m = _PATH.match(op.path)
        assert m, f"unexpected path in the OpenAPI document: {op.path}"
        plural = m.group("plural")
        out.append((op, plural if plural in FIXTURES else None, "{namespace}" in op.path))
    return out


def _strategy(op: Any, plural: str | None, namespaced: bool) -> st.SearchStrategy[Any]:
    """(aimed, case) pairs: free generation, and (for a namespaced path) the path pinned to `default`
    and the kind's fixture object; each in positive and negative mode."""
    pinned: dict[str, str] | None = None
    if namespaced:
        pinned = {"namespace": PROJECT}
        if "{name}" in op.path and plural:
            pinned["name"] = _fixture_name(plural)
    parts: list[st.SearchStrategy[Any]] = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for params in ([None, pinned] if pinned else [None]):
            try:
                strategy = op.as_strategy(mode, path_parameters=params) if params else op.as_strategy(mode)
            except Exception:  # noqa: BLE001 - e.g. nothing to negate in an operation without inputs
                continue
            parts.append(st.tuples(st.just(params is not None), strategy))
    assert parts, f"no strategy for {op.label}"
    return st.one_of(parts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_no_5xx_for_any_generated_request(fuzzer: Fuzzer, version: str) -> None:
    fuzzer.failures.clear()
    operations = _operations(fuzzer, version)
    verbs = {op.method.upper() for op, _, _ in operations}
    assert {"GET", "POST", "PUT", "PATCH", "DELETE"} <= verbs
    assert any(op.path.endswith("/status") for op, _, _ in operations)
    for op, plural, namespaced in operations:
        strategy = _strategy(op, plural, namespaced)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not RANDOM,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                  report_multiple_bugs=False)
        @given(pair=strategy, how=st.sampled_from(["none", "envelope", "overlay"]))
        def run(pair: tuple[bool, Any], how: str) -> None:
            aimed, case = pair
            fuzzer.send(case, plural, aimed, how)

        run()
        if plural and namespaced:
            fuzzer.ensure(plural)
    for label, counts in sorted(fuzzer.statuses.items()):
        if f"/{version}/" in label:
            print(f"{label}: {dict(sorted(counts.items()))}")  # shown with -s, or on failure
    assert fuzzer.c.proc is not None and fuzzer.c.proc.poll() is None, "the coordinator died"
    health = fuzzer.session.get(fuzzer.c.url("/healthz"), timeout=10)
    assert health.status_code == 200
    assert not fuzzer.failures, (f"{len(fuzzer.failures)} requests answered 5xx (or no answer):\n\n"
                                 + "\n\n".join(fuzzer.failures[:20]))
    for op, _, _ in operations:
        assert f"{op.method.upper()} {op.path}" in fuzzer.statuses, f"{op.label} was never sent"


# -- the 5xx (and dropped connections) the fuzzer found, one request each -------------------------

@pytest.mark.parametrize("body", [b"1", b"[]", b"null", b'"x"', b'{"preconditions":"x"}', b'{"dryRun":5}'])
def test_delete_with_a_body_that_is_not_delete_options_answers_400(fuzzer: Fuzzer, body: bytes) -> None:
    c = fuzzer.c
    r = fuzzer.session.delete(c.url(f"{_collection('v1', 'jobs')}/fuzz-job"), data=body,
                              headers={"Content-Type": "application/json"}, timeout=30)
    fuzzer.ensure("jobs")
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["reason"] == "BadRequest"


@pytest.mark.parametrize("key", ["a\nb", "a\rb", "a\x00b", "a\x01b", "a\x7fb"])
def test_warning_for_an_unknown_field_with_a_control_character_is_answered(fuzzer: Fuzzer, key: str) -> None:
    c = fuzzer.c
    fuzzer.serial += 1
    name = f"warn-{fuzzer.serial}"
    body = job(name)
    body["spec"][key] = 1
    try:
        r = fuzzer.session.post(c.url(_collection("v1", "jobs")), params={"fieldValidation": "Warn"}, json=body,
                                timeout=30)
    except requests.ConnectionError as e:
        stored = fuzzer.session.get(c.url(f"{_collection('v1', 'jobs')}/{name}"), timeout=30).status_code == 200
        raise AssertionError(f"no answer ({e!r}); the object was {'stored' if stored else 'not stored'}") from None
    assert r.status_code == 201, r.text
    warning = r.headers.get("Warning", "")
    assert warning.startswith("299 ") and "unknown field" in warning
    assert not _CONTROL.search(warning)


JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def _assert_4xx(r: requests.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["reason"] in ("BadRequest", "Invalid"), r.text


@pytest.mark.parametrize("sub", ["", "/status"])
@pytest.mark.parametrize("body", [b'"x"', b'"\\u023e"', b'"[]"'])
def test_json_patch_that_is_a_string_answers_400(fuzzer: Fuzzer, body: bytes, sub: str) -> None:
    r = fuzzer.session.patch(fuzzer.c.url(f"{_collection('v1', 'jobs')}/fuzz-job{sub}"), data=body,
                             headers=JSON_PATCH, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text)


@pytest.mark.parametrize("sub", ["", "/status"])
@pytest.mark.parametrize("body", [b'{"metadata":5}', b'{"metadata":"x"}', b'{"metadata":[1]}'])
def test_merge_patch_with_metadata_not_an_object_answers_4xx(fuzzer: Fuzzer, body: bytes, sub: str) -> None:
    r = fuzzer.session.patch(fuzzer.c.url(f"{_collection('v1', 'jobs')}/fuzz-job{sub}"), data=body,
                             headers=MERGE_PATCH, timeout=30)
    fuzzer.ensure("jobs")
    _assert_4xx(r)


@pytest.mark.parametrize("sub", ["", "/status"])
@pytest.mark.parametrize("verb", ["PUT", "PATCH"])
@pytest.mark.parametrize("rv", [{"a": 1}, [1]])
def test_resource_version_of_the_wrong_type_answers_4xx(fuzzer: Fuzzer, rv: Any, verb: str, sub: str) -> None:
    url = fuzzer.c.url(f"{_collection('v1', 'jobs')}/fuzz-job{sub}")
    if verb == "PUT":
        obj = fuzzer.session.get(url, timeout=30).json()
        obj["metadata"]["resourceVersion"] = rv
        r = fuzzer.session.put(url, json=obj, timeout=30)
    else:
        r = fuzzer.session.patch(url, data=orjson.dumps({"metadata": {"resourceVersion": rv}}),
                                 headers=MERGE_PATCH, timeout=30)
    fuzzer.ensure("jobs")
    _assert_4xx(r)


@pytest.mark.parametrize("limit", ["4611686018427387904", "9223372036854775807", "10000000000000000000"])
def test_list_with_a_huge_limit_is_answered(fuzzer: Fuzzer, limit: str) -> None:
    r = fuzzer.session.get(fuzzer.c.url(_collection("v1", "jobs")), params={"limit": limit}, timeout=30)
    assert r.status_code in (200, 400), (r.status_code, r.text)
    if r.status_code == 200:
        assert any(i["metadata"]["name"] == "fuzz-job" for i in r.json()["items"])
