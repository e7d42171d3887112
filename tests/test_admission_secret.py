"""Secret admission: keys, base64 values, the 1 MiB cap, stringData folding and updates."""
from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from nodus.coordinator.resources import merge_patch as merged  # the API's own RFC 7386
from nodus.coordinator.api import admission
from nodus.coordinator.api.kinds import resolve
from nodus.coordinator.errors import NodusError

SECRET = resolve("secrets")
BASE: dict[str, Any] = {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "hf"},
                        "stringData": {"HF_TOKEN": "hf_abc"}}


class Store:
    async def get(self, plural: str, project: str, name: str) -> dict[str, Any] | None:
        return None




def create(obj: dict[str, Any], **kw: Any) -> admission.Admitted:
    return asyncio.run(admission.admit_create(SECRET, obj, Store(), project="p", **kw))


def update(old: dict[str, Any], new: dict[str, Any]) -> admission.Admitted:
    return asyncio.run(admission.admit_update(SECRET, old, new, Store(), project="p"))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


BIG = "x" * (1024 * 1024 + 1)

CASES: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("no-keys", {"stringData": None}, [("data", "Required value: a Secret needs at least one key")]),
    ("empty-maps", {"stringData": None, "data": {}}, [("data", "at least one key")]),
    ("key-bad", {"stringData": {"HF TOKEN": "x"}}, [("stringData", 'Invalid value: "HF TOKEN": a Secret key')]),
    ("key-slash", {"data": {"a/b": b64("x")}}, [("data", 'Invalid value: "a/b"')]),
    ("data-not-base64", {"data": {"K": "not base64!"}}, [("data[K]", "must be base64-encoded")]),
    ("data-too-big", {"data": {"K": base64.b64encode(BIG.encode()).decode()}},
     [("data[K]", "Too long: may not be more than 1048576 bytes")]),
    ("string-too-big", {"stringData": {"K": BIG}}, [("stringData[K]", "Too long")]),
    ("value-type", {"stringData": {"K": 5}}, [("stringData[K]", "must be of type string")]),
    ("data-type", {"data": ["K"]}, [("data", "must be of type object")]),
    ("type-type", {"type": 1}, [("type", "must be of type string")]),
    ("unknown-field", {"spec": {}}, [("spec", "Unknown field")]),
    ("kind-wrong", {"kind": "ConfigMap"}, [("kind", 'must be "Secret"')]),
    ("api-version-core", {"apiVersion": "v1"}, [("apiVersion", 'must be "nodus.dev/v1"')]),
]


@pytest.mark.parametrize("patch, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_secret_rule(patch: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    with pytest.raises(NodusError) as info:
        create(merged(BASE, patch))
    found = [(c.field, c.message) for c in info.value.causes]
    for field, fragment in expected:
        assert any(f == field and fragment in m for f, m in found), f"{field}: …{fragment}… not in {found}"


def test_value_never_appears_in_an_error() -> None:
    with pytest.raises(NodusError) as info:
        create(merged(BASE, {"data": {"K": "sup3r-s3cret!"}}))
    assert "sup3r-s3cret" not in info.value.message


def test_string_data_is_folded_into_data() -> None:
    out = create(merged(BASE, {"data": {"A": b64("1"), "HF_TOKEN": b64("old")}})).object
    assert out == {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "hf"}, "type": "Opaque",
                   "data": {"A": b64("1"), "HF_TOKEN": b64("hf_abc")}}


def test_data_only_and_type_kept() -> None:
    out = create({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "s"},
                  "type": "nodus.dev/registry", "data": {".dockerconfigjson": b64("{}")}}).object
    assert out["type"] == "nodus.dev/registry" and out["data"] == {".dockerconfigjson": b64("{}")}


STORED = {**{k: v for k, v in create(BASE).object.items() if k != "data"},
          "status": {"version": 1, "versionID": "v-1", "keys": ["HF_TOKEN"],
                     "versions": [{"version": 1, "versionID": "v-1", "keys": ["HF_TOKEN"],
                                   "createTime": "2025-01-01T00:00:00Z"}]}}


def test_update_with_new_values() -> None:
    out = update(STORED, merged(STORED, {"stringData": {"HF_TOKEN": "hf_new", "EXTRA": "1"}})).object
    assert out["data"] == {"HF_TOKEN": b64("hf_new"), "EXTRA": b64("1")}


def test_update_without_values_keeps_them() -> None:
    out = update(STORED, merged(STORED, {"metadata": {"labels": {"team": "ml"}}})).object
    assert "data" not in out and out["metadata"]["labels"] == {"team": "ml"}
    with_values = merged(STORED, {"data": {"HF_TOKEN": b64("hf_abc")}})
    assert update(with_values, merged(with_values, {"metadata": {"labels": {"a": "b"}}})).object["data"] == \
        {"HF_TOKEN": b64("hf_abc")}


def test_update_type_is_immutable() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, {"type": "Other"}))
    assert [(c.field, c.message) for c in info.value.causes] == [("type", 'Invalid value: "Other": field is immutable')]


def test_update_empty_data_refused() -> None:
    with pytest.raises(NodusError) as info:
        update(STORED, merged(STORED, {"data": {}}))
    assert info.value.causes[0].field == "data"


def test_secret_status_shape() -> None:
    assert admission.admit_status(SECRET, STORED).object["status"]["version"] == 1
    with pytest.raises(NodusError) as info:
        admission.admit_status(SECRET, merged(STORED, {"status": {"version": "1", "values": {}}}))
    assert [c.field for c in info.value.causes] == ["status.version", "status.values"]
